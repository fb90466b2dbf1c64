"""online_softmax: softmax over the last dim in one pass over each row, keeping the running max
and sum (Milakov & Gimelshein, 2018), the building block of FlashAttention as an op of its own.

The CUDA kernel is csrc/kernels/softmax/online_softmax.cu (schema in csrc/torch/registration.cpp,
glue and the checks for tracing in csrc/torch/online_softmax.cpp); its definition is
flashext.reference.online_softmax.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._build import extension_loaded, ops

_ops = ops()  # torch.ops.flashext, or a stand-in that says the extension is not built


def online_softmax(x: Tensor) -> Tensor:
    """torch.softmax(x, -1), computed with a running max and sum in one pass over each row.

    fp32/fp16/bf16 on a CUDA device, fp32 math, result in x's dtype. Rows with 16-byte aligned
    starts of up to 32768 (fp32) or 65536 (fp16/bf16) columns are read from HBM once; the part of a
    longer row past that is read twice, and other layouts take a slower scalar path. The same values
    as torch.softmax, huge logits included (x − max is formed before scaling, so no digits are lost),
    and the same NaN rows: a row holding NaN or +inf, or only −inf, is all NaN. No backward yet.
    """
    return _ops.online_softmax(x)


def _no_backward(ctx, *grads):
    raise NotImplementedError("flashext.online_softmax: the backward pass is not implemented; use torch.softmax "
                              "where gradients are needed")


if extension_loaded():
    torch.library.register_autograd("flashext::online_softmax", _no_backward,
                                    setup_context=lambda ctx, inputs, output: None)
