"""flashext as SDPA's flash implementation (torch >= 2.10's flash-attention registry).

`import flashext` registers an implementation named "flashext" (it never activates it: several
providers may be registered, and the user picks one):

    import torch
    from torch.nn.attention import activate_flash_attention_impl, restore_flash_attention_impl
    import flashext

    activate_flash_attention_impl("flashext")   # SDPA's flash backend now runs flashext's kernels
    ...
    restore_flash_attention_impl()              # back to PyTorch's FlashAttention-2

While active, flashext overrides the CUDA kernels of aten::_flash_attention_forward and
aten::_flash_attention_backward (and _flash_attention_forward_no_dropout_inplace where torch has
it), which SDPA's flash backend (and anything else that calls those
ops: nested-tensor SDPA, torch.nn.attention.varlen) runs, forward and backward. A call flashext
does not take (dropout, ALiBi, seqused_k, a paged cache, float32, a head dim over 256 or not a
multiple of 8, a scale that is not positive and finite, a GPU this build has no kernels for, or
head dims over 128 where the GPU's shared memory cannot hold the backward's tiles) runs PyTorch's
own kernel instead, forward and backward alike, so an answer is never wrong, only sometimes not
flashext's. Outputs and gradients come in the layout PyTorch's kernel gives them (empty_like of
the inputs, which compiled graphs assert), written there by the kernels (no copies).

Which backend SDPA picks is unchanged: on Hopper its default order puts cuDNN first, so plain
`F.scaled_dot_product_attention` calls reach the flash backend (and flashext) only with it chosen,
e.g. `with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION):` or
`torch.backends.cuda.enable_cudnn_sdp(False)`. Deterministic gradients follow
`torch.use_deterministic_algorithms(True)`.
"""

from __future__ import annotations

import functools
import math

import torch

from .._build import _C, extension_loaded

NAME = "flashext"
_FORWARD, _BACKWARD = "_flash_attention_forward", "_flash_attention_backward"
_FORWARD_INPLACE = "_flash_attention_forward_no_dropout_inplace"  # torch >= 2.12: writes into `out`


class _Handle:
    """What activate_flash_attention_impl keeps; remove() (restore_flash_attention_impl) drops the
    overrides and PyTorch's own kernels serve the ops again."""

    def __init__(self, library: torch.library.Library):
        self.library = library

    def remove(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None


@functools.cache
def _device_supported(index: int, head_dim: int) -> bool:
    """This build has kernels for the device, and its backward's tiles fit the device's shared
    memory at this head dim (at D > 128 not on sm_86/89's 99 KiB: there PyTorch's kernel serves
    both passes, so that training works as it would without flashext)."""
    major, minor = torch.cuda.get_device_capability(index)
    budget = torch.cuda.get_device_properties(index).shared_memory_per_block_optin
    return bool(_C.arch_supported(major, minor)) and _C.bwd_smem_bytes(head_dim, budget) > 0


def _window(value: int | None, max_k: int) -> int:
    """The aten op's window (None or negative: unbounded) as flashext's, bounded like FlashAttention-2
    bounds it: a window of max_k keys or more is no window."""
    return -1 if value is None or value < 0 or value >= max_k else int(value)


def _unsupported(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cum_seq_q, dropout_p: float,
                 scale: float | None) -> str | None:
    """Why flashext cannot run this call (None: it can). Only what both passes know, so that the
    forward and the backward of one call always agree."""
    if dropout_p != 0.0:
        return "dropout"
    if scale is not None and not (math.isfinite(scale) and scale > 0.0):
        return "scale"
    if query.dtype not in (torch.float16, torch.bfloat16) or key.dtype != query.dtype or value.dtype != query.dtype:
        return "dtype"
    head_dim = query.shape[-1]
    if head_dim % 8 != 0 or head_dim > 256 or key.shape[-1] != head_dim or value.shape[-1] != head_dim:
        return "head dim"
    if query.dim() != (4 if cum_seq_q is None else 3):
        return "layout"
    if query.shape[-2] % key.shape[-2] != 0 or value.shape[-2] != key.shape[-2]:
        return "heads"
    if any(t.stride(-1) != 1 for t in (query, key, value)):
        return "strides"
    index = query.device.index if query.device.index is not None else torch.cuda.current_device()
    if not _device_supported(index, head_dim):
        return "device"
    return None


def _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *,
             scale=None, window_size_left=None, window_size_right=None, seqused_k=None, alibi_slopes=None,
             block_table=None, num_splits=None):
    reason = _unsupported(query, key, value, cum_seq_q, dropout_p, scale)
    if reason is None and (return_debug_mask or seqused_k is not None or alibi_slopes is not None
                           or block_table is not None or num_splits not in (None, 0, 1)):
        reason = "options"
    if reason is not None:
        return torch.ops.flashext._native_flash_attention_forward(
            query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, scale,
            window_size_left, window_size_right, seqused_k, alibi_slopes, block_table, num_splits)
    deterministic = torch.are_deterministic_algorithms_enabled()
    left, right = _window(window_size_left, max_k), _window(window_size_right, max_k)
    if cum_seq_q is None:
        out, lse = torch.ops.flashext.flash_attn_fwd(query, key, value, is_causal, scale, left, right, 0.0, False,
                                                     deterministic, True)
    else:
        out, lse = torch.ops.flashext.flash_attn_varlen_fwd(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k,
                                                            is_causal, scale, left, right, 0.0, False, deterministic,
                                                            True)
    # No dropout: the RNG state the backward would replay is never read (left uninitialised: no
    # fill kernels per call); an empty debug mask.
    rng_state = torch.empty((2,), dtype=torch.uint64, device=query.device)
    unused = torch.empty((), dtype=torch.uint64, device=query.device)
    return out, lse, rng_state, unused, torch.empty(0, dtype=query.dtype, device=query.device)


def _forward_inplace(out, query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                     return_debug_mask, **options):
    result, lse, *_ = _forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                               return_debug_mask, **options)
    out.copy_(result)
    return lse


def _backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
              rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None):
    reason = _unsupported(query, key, value, cum_seq_q, dropout_p, scale)
    # The lse the forward returned: flashext's and FlashAttention-2's share a layout (B, H, Sq)
    # dense, (H, total_q) packed; any other (an older kernel's padded one) goes back to PyTorch.
    want = (query.shape[0], query.shape[2], query.shape[1]) if cum_seq_q is None else (query.shape[1], query.shape[0])
    if reason is None and (logsumexp.dtype != torch.float32 or tuple(logsumexp.shape) != want):
        reason = "lse"
    if reason is not None:
        return torch.ops.flashext._native_flash_attention_backward(
            grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
            rng_state, unused, scale, window_size_left, window_size_right)
    deterministic = torch.are_deterministic_algorithms_enabled()
    left, right = _window(window_size_left, max_k), _window(window_size_right, max_k)
    if cum_seq_q is None:
        return torch.ops.flashext.flash_attn_bwd(grad_out, query, key, value, out, logsumexp, None, is_causal, scale,
                                                 left, right, 0.0, False, deterministic, True)
    return torch.ops.flashext.flash_attn_varlen_bwd(grad_out, query, key, value, out, logsumexp, None, cum_seq_q,
                                                    cum_seq_k, max_q, max_k, is_causal, scale, left, right, 0.0,
                                                    deterministic, True)


def _activate() -> _Handle:
    """The register_fn PyTorch calls on activate_flash_attention_impl("flashext")."""
    if not extension_loaded():
        raise RuntimeError("flashext SDPA provider: the CUDA extension flashext._C is not built "
                           "(run `python -m flashext` for what is missing)")
    library = torch.library.Library("aten", "IMPL")
    library.impl(_FORWARD, _forward, "CUDA")
    library.impl(_BACKWARD, _backward, "CUDA")
    if hasattr(torch.ops.aten, _FORWARD_INPLACE):
        library.impl(_FORWARD_INPLACE, _forward_inplace, "CUDA")
    return _Handle(library)


def register() -> bool:
    """Register "flashext" with torch.nn.attention's flash registry (torch >= 2.10); False when
    this torch has no registry. Called by `import flashext`; never activates anything."""
    attention = torch.nn.attention
    if not hasattr(attention, "register_flash_attention_impl"):
        return False
    attention.register_flash_attention_impl(NAME, register_fn=_activate)
    return True
