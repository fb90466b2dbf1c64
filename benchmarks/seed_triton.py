"""The seed's Triton kernel for add + GeLU, kept as an anchor (ANCHORS.md: "the seed's Triton
kernel (BLOCK_SIZE=1024)"): one program per 1024 elements, masked loads, exact erf GeLU."""

import torch
import triton
import triton.language as tl


@triton.jit
def fused_add_gelu_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    z = (x + y).to(tl.float32)
    out = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def fused_add_gelu(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    grid = (triton.cdiv(n, 1024),)
    fused_add_gelu_kernel[grid](x, y, out, n, BLOCK_SIZE=1024)
    return out
