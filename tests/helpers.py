"""What the test files share: the CUDA marker, input makers and the attention check.

Tests judge results by flashext.testing's rule (DESIGN.md): at most 2× (3× for gradients) plain
PyTorch's own error in the input's dtype, + 1e-5, against the float64 reference.
"""

from __future__ import annotations

import pytest
import torch

import flashext
from flashext import reference as ref
from flashext.testing import assert_close, poison_cache

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU; none is visible")
# Devices the bad-input tests run on: meta always (the checks torch.compile's fake tensors reach),
# CUDA where there is one; both must refuse with the same words.
CHECK_DEVICES = ["meta"] + (["cuda"] if HAS_CUDA else [])

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FLOAT_IDS = ["float32", "float16", "bfloat16"]
HALF_DTYPES = [torch.float16, torch.bfloat16]
HALF_IDS = ["float16", "bfloat16"]


def randn(*shape, dtype=torch.float32, device="cuda", scale=1.0) -> torch.Tensor:
    """Normal random data (never zeros), drawn in fp32 and rounded once to dtype."""
    if device == "meta":
        return torch.empty(*shape, dtype=dtype, device="meta")
    return (torch.randn(*shape, device=device) * scale).to(dtype)


def at_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of t whose first element sits `offset` elements into a larger buffer, so
    that its start is not 16-byte aligned for offsets that are not multiples of 16 bytes."""
    buffer = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = buffer[offset:].view(t.shape)
    view.copy_(t)
    assert view.is_contiguous() and view.storage_offset() == offset
    return view


def make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, packed=False, scale=1.0, k_scale=1.0,
             device="cuda"):
    """q (B, Sq, H, D), k and v (B, Sk, Hkv, D); packed: strided views of one (B, S, 3, H, D) tensor."""
    if packed:
        qkv = randn(batch, seqlen_q, 3, heads, head_dim, dtype=dtype, device=device)
        return qkv[:, :, 0], qkv[:, :, 1, :heads_kv], qkv[:, :, 2, :heads_kv]
    return (randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=device, scale=scale),
            randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device, scale=k_scale),
            randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device))


def check_attention(q, k, v, attend=None, **kwargs):
    """flashext.flash_attention's output and lse (or those of `attend(q, k, v, **kwargs)`, a forward
    with its signature returning both) against the reference; returns (out, lse)."""
    poison_cache(q)
    if attend is None:
        out, lse = flashext.flash_attention(q, k, v, return_lse=True, **kwargs)
    else:
        out, lse = attend(q, k, v, **kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    want, want_lse = ref.attention(q, k, v, return_lse=True, **kwargs)
    base, base_lse = ref.attention(q, k, v, return_lse=True, compute_dtype=q.dtype, **kwargs)
    assert_close(f"out {kwargs}", out, want, base)
    assert_close(f"lse {kwargs}", lse, want_lse, base_lse.float())
    return out, lse


def cu_seqlens(lengths, device="cuda") -> torch.Tensor:
    """int32 offsets [0, l0, l0 + l1, ...] of a packed ragged batch."""
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def kernel_names(fn) -> str:
    """The names of the CUDA kernels fn launches, space-separated; flashext's are in namespace
    flashext::attention_detail, PyTorch's FlashAttention-2 in pytorch_flash."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
