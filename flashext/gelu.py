"""Fused GeLU epilogues: gelu(x + y) and gelu(x + bias) in one pass over HBM.

The CUDA kernels are csrc/kernels/gelu/ (schemas in csrc/torch/registration.cpp, glue in
csrc/torch/gelu.cpp, autograd rules in csrc/torch/autograd.cpp); this module holds the public
functions. The backward of each is a fused kernel too.
Their Triton twins are flashext/triton_ref/gelu.py, their definition flashext/reference.py.

Layout and cost: outputs are contiguous. Contiguous inputs, including unaligned views such as
x[1:], are read in place (unaligned ones through a slower one-element-per-thread path).
For add + GeLU, a non-contiguous x or y is first copied into a contiguous tensor; for bias + GeLU,
x is read in place whenever its last dim is contiguous and its leading dims collapse into one
row stride (a column slice of a wider matrix, say), and copied otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._build import ops

_ops = ops()  # torch.ops.flashext, or a stand-in that says the extension is not built


def fused_add_gelu(x: Tensor, y: Tensor, approximate: str = "none", *, out: Tensor | None = None) -> Tensor:
    """gelu(x + y) with the sum and the GeLU in fp32, rounded once to x's dtype.

    Same as ``F.gelu(x + y, approximate=approximate)`` but in one pass over HBM (reads x and y,
    writes the result). x and y: same shape, dtype (float32/float16/bfloat16) and CUDA device.
    approximate: "none" (exact erf form) or "tanh". out: a contiguous tensor of x's shape to
    write into (it may be x or y itself, for in-place use); out= is not differentiable.
    """
    if out is None:
        return _ops.add_gelu(x, y, approximate)
    _refuse_grad_with_out("flashext.fused_add_gelu", x, y)
    _ops.add_gelu_out(x, y, approximate, out)
    return out


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none", *, out: Tensor | None = None) -> Tensor:
    """gelu(x + bias) with bias (1-D, length x.shape[-1]) broadcast over the leading dims.

    The epilogue after a Linear layer: ``bias_gelu(x @ W.T, b) == F.gelu(F.linear(x, W, b))``.
    Backward returns grad_x = grad · gelu'(x + bias) and grad_bias = Σ over leading dims, both
    from one fused kernel (plus a small deterministic reduction of per-block partial sums).
    """
    if out is None:
        return _ops.bias_gelu(x, bias, approximate)
    _refuse_grad_with_out("flashext.bias_gelu", x, bias)
    _ops.bias_gelu_out(x, bias, approximate, out)
    return out


def _refuse_grad_with_out(fn: str, *inputs: Tensor) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        raise RuntimeError(f"{fn}: out= is not differentiable; call it without out= to get gradients")

