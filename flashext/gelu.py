"""Fused GeLU epilogues: gelu(x + y) and gelu(x + bias) in one pass over HBM.

The CUDA kernels are csrc/kernels/gelu/ (schemas in csrc/torch/registration.cpp, glue in
csrc/torch/gelu.cpp); this module holds the public functions and the autograd formulas, whose
backward is a fused kernel too (the checks and output shapes that let torch.compile trace them
are registered in C++, beside the CUDA implementation).
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

from ._build import extension_loaded, ops

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


# ---- autograd: the backward of each op is its fused backward kernel -------------------------


def _save_inputs(ctx, inputs, output) -> None:
    x, other, approximate = inputs
    ctx.save_for_backward(x, other)
    ctx.approximate = approximate


def _add_gelu_grad(ctx, grad: Tensor):
    x, y = ctx.saved_tensors
    # d/dx gelu(x + y) = d/dy gelu(x + y) = gelu'(x + y): one kernel, one tensor for both
    grad_z = _ops.add_gelu_backward(grad, x, y, ctx.approximate)
    return (grad_z if ctx.needs_input_grad[0] else None, grad_z if ctx.needs_input_grad[1] else None, None)


def _bias_gelu_grad(ctx, grad: Tensor):
    x, bias = ctx.saved_tensors
    grad_x, grad_bias = _ops.bias_gelu_backward(grad, x, bias, ctx.approximate)
    return (grad_x if ctx.needs_input_grad[0] else None, grad_bias if ctx.needs_input_grad[1] else None, None)


def _no_double_backward(ctx, *grads):
    raise RuntimeError(
        "flashext: the GeLU backward kernels are not differentiable (double backward is not supported)"
    )


# Shapes for tracing come from the C++ Meta registration, which runs the CUDA path's own checks
# (csrc/torch/gelu.cpp); what Python adds is the autograd rule.
if extension_loaded():
    torch.library.register_autograd("flashext::add_gelu", _add_gelu_grad, setup_context=_save_inputs)
    torch.library.register_autograd("flashext::bias_gelu", _bias_gelu_grad, setup_context=_save_inputs)
    torch.library.register_autograd(
        "flashext::add_gelu_backward", _no_double_backward, setup_context=lambda ctx, inputs, output: None
    )
    torch.library.register_autograd(
        "flashext::bias_gelu_backward", _no_double_backward, setup_context=lambda ctx, inputs, output: None
    )
