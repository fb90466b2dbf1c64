"""Triton twins of csrc/kernels/gelu/gelu_kernels.cuh.

add_gelu_kernel           flat: program p owns BLOCK-element slots p·BLOCK + u·num_programs·BLOCK,
                          u < UNROLL (the CUDA kernel's kFlatThreads·kVec and kFlatUnroll);
                          forward dst = gelu(x + y), backward dst = grad_out · gelu'(x + y)
bias_gelu_kernel          rows × cols: program (col segment, row group) walks its rows BLOCK_ROWS
                          at a time with the bias segment held in registers; backward also
                          writes partial[row group, col] = Σ_rows dst (fp32)
bias_grad_reduce_kernel   grad_bias[col] = Σ_groups partial[group, col]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .common import tanh_parts, to_dtype

kSqrt1_2 = tl.constexpr(0.70710678118654752)  # 1/√2
kInvSqrt2Pi = tl.constexpr(0.39894228040143268)  # 1/√(2π)
kSqrt2OverPi = tl.constexpr(0.79788456080286536)  # √(2/π)
kGeluTanhCubic = tl.constexpr(0.044715)

# Φ from one exponential and one reciprocal for 16-bit results (gelu_erf_16 and gelu_erf_16_grad
# in csrc/kernels/common/gelu_math.h): on, as on the CUDA side for 16-bit results (False: erf, as
# fp32 results use). Mills-ratio fits M(x) ≈ t·P(t), t = 1/(1 + p·x), coefficients include
# 1/√(2π): the forward's of degree 5 for fp16 results and 4 for bf16, the backward's of degree 7.
# The kernels' FAST_PHI: 0 erf, 1 fp16 results, 2 bf16 results.
FAST_PHI_16BIT = True
kNegHalfLog2e = tl.constexpr(-0.72134752044448170)
kMills5P = tl.constexpr(0.31)
kMills5_0 = tl.constexpr(0.123860545)
kMills5_1 = tl.constexpr(0.120441549)
kMills5_2 = tl.constexpr(0.133433104)
kMills5_3 = tl.constexpr(0.0157319549)
kMills5_4 = tl.constexpr(0.180466294)
kMills5_5 = tl.constexpr(-0.0739357993)
kMills4P = tl.constexpr(0.375)
kMills4_0 = tl.constexpr(0.149041101)
kMills4_1 = tl.constexpr(0.157920405)
kMills4_2 = tl.constexpr(0.0829729810)
kMills4_3 = tl.constexpr(0.201044664)
kMills4_4 = tl.constexpr(-0.0909858420)
kMills7P = tl.constexpr(0.3)
kMills7_0 = tl.constexpr(0.119626351)
kMills7_1 = tl.constexpr(0.120798968)
kMills7_2 = tl.constexpr(0.0996338055)
kMills7_3 = tl.constexpr(0.129480943)
kMills7_4 = tl.constexpr(-0.0554152019)
kMills7_5 = tl.constexpr(0.208228856)
kMills7_6 = tl.constexpr(-0.158288345)
kMills7_7 = tl.constexpr(0.0359345526)

FLAT_BLOCK = 1024
FLAT_UNROLL = 4
BIAS_BLOCK_COLS = 256
BIAS_BLOCK_ROWS = 8
BIAS_MIN_ROWS_PER_BLOCK = 32


@triton.jit
def mills(x, P, C0, C1, C2, C3, C4, C5, C6, C7):
    """The Mills-ratio fit t·(C0 + C1·t + … + C7·t⁷), t = 1/(1 + P·x) (lower degrees: the top
    coefficients 0, which leaves the value unchanged: those first steps are exact)."""
    t = 1.0 / (P * x + 1.0)
    poly = C7 * t + C6
    poly = poly * t + C5
    poly = poly * t + C4
    poly = poly * t + C3
    poly = poly * t + C2
    poly = poly * t + C1
    poly = poly * t + C0
    return t * poly


@triton.jit
def gelu(z, TANH: tl.constexpr, FAST_PHI: tl.constexpr):
    if TANH:
        u = kSqrt2OverPi * (z + kGeluTanhCubic * z * z * z)
        one_plus_t, sech2 = tanh_parts(u)
        return 0.5 * z * one_plus_t
    elif FAST_PHI:
        # Φ(z) = |s − Q(|z|)|, s = 1 for z ≥ 0 and 0 below, Q(x) = e^{−x²/2}·M(x)/√(2π)
        x = tl.abs(z)
        if FAST_PHI == 2:
            m = mills(x, kMills4P, kMills4_0, kMills4_1, kMills4_2, kMills4_3, kMills4_4, 0.0, 0.0, 0.0)
        else:
            m = mills(x, kMills5P, kMills5_0, kMills5_1, kMills5_2, kMills5_3, kMills5_4, kMills5_5, 0.0, 0.0)
        e = tl.math.exp2(z * (z * kNegHalfLog2e))  # e^{−z²/2}
        return z * tl.abs(tl.where(z >= 0.0, 1.0, 0.0) - e * m)
    else:
        return 0.5 * z * (1.0 + tl.math.erf(z * kSqrt1_2))


@triton.jit
def gelu_grad(z, TANH: tl.constexpr, FAST_PHI: tl.constexpr):
    if TANH:
        u = kSqrt2OverPi * (z + kGeluTanhCubic * z * z * z)
        one_plus_t, sech2 = tanh_parts(u)
        du_dz = kSqrt2OverPi * (1.0 + 3.0 * kGeluTanhCubic * z * z)
        return 0.5 * one_plus_t + 0.5 * z * sech2 * du_dz
    elif FAST_PHI:
        # Φ(z) + z·φ(z) = 1 − w (z ≥ 0) or w (z < 0), w = e^{−z²/2}·(M(|z|) − |z|)/√(2π)
        # (gelu_erf_16_grad in gelu_math.h)
        x = tl.abs(z)
        m = mills(x, kMills7P, kMills7_0, kMills7_1, kMills7_2, kMills7_3, kMills7_4, kMills7_5, kMills7_6, kMills7_7)
        w = tl.math.exp2(z * (z * kNegHalfLog2e)) * (m - x * kInvSqrt2Pi)
        return tl.where(z >= 0.0, 1.0 - w, w)
    else:
        cdf = 0.5 * (1.0 + tl.math.erf(z * kSqrt1_2))
        pdf = kInvSqrt2Pi * tl.exp(-0.5 * z * z)
        return cdf + z * pdf


@triton.jit
def gelu_epilogue(z, g, TANH: tl.constexpr, BACKWARD: tl.constexpr, FAST_PHI: tl.constexpr):
    if BACKWARD:
        return g * gelu_grad(z, TANH, FAST_PHI)
    else:
        return gelu(z, TANH, FAST_PHI)


@triton.jit
def store_rounded(ptr, value, mask):
    """Store fp32 `value` rounded to nearest-even in ptr's dtype."""
    tl.store(ptr, to_dtype(value, ptr.dtype.element_ty), mask=mask)


@triton.jit
def add_gelu_kernel(grad_out_ptr, x_ptr, y_ptr, dst_ptr, n,
                    TANH: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
                    FAST_PHI: tl.constexpr):
    first = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    stride = tl.num_programs(0).to(tl.int64) * BLOCK
    for u in tl.static_range(UNROLL):
        offs = first + u * stride
        mask = offs < n
        z = tl.load(x_ptr + offs, mask=mask).to(tl.float32) + tl.load(y_ptr + offs, mask=mask).to(tl.float32)  # z = x + y
        g = 0.0
        if BACKWARD:
            g = tl.load(grad_out_ptr + offs, mask=mask).to(tl.float32)
        out = gelu_epilogue(z, g, TANH, BACKWARD, FAST_PHI)
        store_rounded(dst_ptr + offs, out, mask)


@triton.jit
def bias_gelu_kernel(grad_out_ptr, x_ptr, bias_ptr, dst_ptr, partial_ptr, rows, cols, x_row_stride, rows_per_block,
                     TANH: tl.constexpr, BACKWARD: tl.constexpr, BLOCK_COLS: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                     FAST_PHI: tl.constexpr):
    col = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_valid = col < cols
    row_begin = tl.program_id(1).to(tl.int64) * rows_per_block
    row_end = tl.minimum(row_begin + rows_per_block, rows)
    bias = tl.load(bias_ptr + col, mask=col_valid).to(tl.float32)
    bias_grad = tl.zeros([BLOCK_COLS], dtype=tl.float32)  # Σ over this program's rows of dst
    for row0 in range(row_begin, row_end, BLOCK_ROWS):
        row = row0 + tl.arange(0, BLOCK_ROWS)
        mask = (row < row_end)[:, None] & col_valid[None, :]
        z = tl.load(x_ptr + row[:, None] * x_row_stride + col[None, :], mask=mask).to(tl.float32) + bias[None, :]  # z = x + bias
        g = 0.0
        if BACKWARD:
            g = tl.load(grad_out_ptr + row[:, None] * cols + col[None, :], mask=mask).to(tl.float32)
        value = gelu_epilogue(z, g, TANH, BACKWARD, FAST_PHI)
        store_rounded(dst_ptr + row[:, None] * cols + col[None, :], value, mask)
        if BACKWARD:
            bias_grad += tl.sum(tl.where(mask, value, 0.0), axis=0)  # fp32, before rounding
    if BACKWARD:
        tl.store(partial_ptr + tl.program_id(1).to(tl.int64) * cols + col, bias_grad, mask=col_valid)


@triton.jit
def bias_grad_reduce_kernel(partial_ptr, grad_bias_ptr, num_groups, cols,
                            BLOCK_COLS: tl.constexpr, BLOCK_GROUPS: tl.constexpr):
    col = tl.program_id(0) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_valid = col < cols
    total = tl.zeros([BLOCK_COLS], dtype=tl.float32)
    for group0 in range(0, num_groups, BLOCK_GROUPS):
        group = group0 + tl.arange(0, BLOCK_GROUPS)
        mask = (group < num_groups)[:, None] & col_valid[None, :]
        total += tl.sum(tl.load(partial_ptr + group[:, None].to(tl.int64) * cols + col[None, :], mask=mask, other=0.0), axis=0)
    store_rounded(grad_bias_ptr + col, total, col_valid)


# ---- launchers (the CUDA launch code's planning, simplified) --------------------------------


def _fast_phi(x: Tensor) -> int:
    """The kernels' FAST_PHI: 0 erf (fp32 results, or FAST_PHI_16BIT off), 1 fp16, 2 bf16."""
    if not FAST_PHI_16BIT:
        return 0
    return {torch.float16: 1, torch.bfloat16: 2}.get(x.dtype, 0)


def _tanh(approximate: str) -> bool:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate == "tanh"


def _launch_flat(grad_out: Tensor | None, x: Tensor, y: Tensor, approximate: str) -> Tensor:
    tanh = _tanh(approximate)
    x, y = x.contiguous(), y.contiguous()
    dst = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return dst
    grid = (triton.cdiv(n, FLAT_BLOCK * FLAT_UNROLL),)
    backward = grad_out is not None
    add_gelu_kernel[grid](grad_out.contiguous() if backward else x, x, y, dst, n,
                          TANH=tanh, BACKWARD=backward, BLOCK=FLAT_BLOCK, UNROLL=FLAT_UNROLL, FAST_PHI=_fast_phi(x))
    return dst


def add_gelu(x: Tensor, y: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x + y)."""
    return _launch_flat(None, x, y, approximate)


def add_gelu_backward(grad_out: Tensor, x: Tensor, y: Tensor, approximate: str = "none") -> Tensor:
    """grad_out · gelu'(x + y)."""
    return _launch_flat(grad_out, x, y, approximate)


def _launch_bias(grad_out: Tensor | None, x: Tensor, bias: Tensor, approximate: str):
    tanh = _tanh(approximate)
    cols = x.shape[-1]
    x2 = x.contiguous().reshape(-1, cols)
    rows = x2.shape[0]
    dst = torch.empty_like(x2)
    backward = grad_out is not None
    grad_bias = torch.zeros_like(bias) if backward else None
    if rows == 0 or cols == 0:
        return dst.reshape(x.shape), grad_bias
    grid_x = triton.cdiv(cols, BIAS_BLOCK_COLS)
    groups = triton.cdiv(rows, BIAS_MIN_ROWS_PER_BLOCK)
    if backward:  # few row groups keep the partial sums small: about four programs per SM
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        groups = min(groups, max(1, triton.cdiv(4 * sms, grid_x)))
    groups = max(1, min(groups, 65535))
    rows_per_block = triton.cdiv(rows, groups)
    groups = triton.cdiv(rows, rows_per_block)
    partial = torch.empty((groups, cols), dtype=torch.float32, device=x.device) if backward else dst
    bias_gelu_kernel[(grid_x, groups)](
        grad_out.contiguous().reshape(-1, cols) if backward else x2, x2, bias.contiguous(), dst, partial,
        rows, cols, cols, rows_per_block,
        TANH=tanh, BACKWARD=backward, BLOCK_COLS=BIAS_BLOCK_COLS, BLOCK_ROWS=BIAS_BLOCK_ROWS, FAST_PHI=_fast_phi(x))
    if backward:
        bias_grad_reduce_kernel[(triton.cdiv(cols, 128),)](partial, grad_bias, groups, cols, BLOCK_COLS=128, BLOCK_GROUPS=8)
    return dst.reshape(x.shape), grad_bias


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x + bias), bias broadcast over the last dim."""
    return _launch_bias(None, x, bias, approximate)[0]


def bias_gelu_backward(grad_out: Tensor, x: Tensor, bias: Tensor, approximate: str = "none") -> tuple[Tensor, Tensor]:
    """(grad_x, grad_bias) = (grad_out · gelu'(x + bias), Σ_rows grad_x)."""
    return _launch_bias(grad_out, x, bias, approximate)
