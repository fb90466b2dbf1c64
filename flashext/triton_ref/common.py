"""Device helpers the Triton twins share (the CUDA side's csrc/kernels/common)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tanh_parts(u):
    """(1 + tanh u, 1 − tanh² u) from e = e^{2u} and r = 1/(e + 1): 1 + t = 2e·r, 1 − t² = 4e·r².
    No cancellation as |t| → 1; |u| ≤ 40 keeps e·r finite (tanh(40) is ±1 in fp32 anyway).
    The CUDA twin: tanh_parts in csrc/kernels/common/gelu_math.h."""
    e = tl.exp(2.0 * tl.minimum(tl.maximum(u, -40.0), 40.0))
    r = 1.0 / (e + 1.0)
    return 2.0 * e * r, 4.0 * (e * r) * r


@triton.jit
def round_to_bf16(value):
    """fp32 → the nearest-even bf16 value, still in fp32. The Triton interpreter casts fp32 → bf16
    by truncation; on a GPU the cast already rounds, so this changes nothing there."""
    bits = value.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def to_dtype(value, dtype: tl.constexpr):
    """fp32 `value` in `dtype`, rounded to nearest-even (also under the interpreter)."""
    if dtype == tl.bfloat16:
        value = round_to_bf16(value)
    return value.to(dtype)
