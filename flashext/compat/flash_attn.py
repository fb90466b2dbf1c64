"""flash-attn 2's functions on flashext's kernels: code written for flash-attn runs with one changed
import,

    from flashext.compat.flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

with flash-attn's argument names, defaults and return values (return_attn_probs gives
(out, softmax_lse, None): flash-attn's third value, the dropout mask, exists only with dropout).
What flashext does not do raises NotImplementedError naming the argument: dropout_p > 0,
alibi_slopes, and in flash_attn_with_kvcache rotary embeddings, cache_batch_idx and cache_leftpad.
Layouts as flash-attn: q (B, Sq, H, D), k/v (B, Sk, Hkv, D); packed qkv (B, S, 3, H, D), kv
(B, S, 2, Hkv, D); varlen (total, H, D) with int32 cu_seqlens. Head dims that are not a multiple
of 8 are zero-padded to the next one, as flash-attn pads them (the output is a view of the first
head_dim columns; the default scale stays 1/sqrt(head_dim)), except in flash_attn_with_kvcache,
whose caches are updated in place and cannot be padded copies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import attention as _attention

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
]


def _refuse(fn: str, dropout_p: float = 0.0, alibi_slopes=None) -> None:
    if dropout_p != 0.0:
        raise NotImplementedError(f"flashext.compat.flash_attn.{fn}: dropout_p must be 0.0 (flashext has no "
                                  f"attention dropout), got {dropout_p}")
    if alibi_slopes is not None:
        raise NotImplementedError(f"flashext.compat.flash_attn.{fn}: alibi_slopes is not supported (flashext has "
                                  "no ALiBi)")


def _result(out: Tensor, lse: Tensor, return_attn_probs: bool):
    return (out, lse, None) if return_attn_probs else out


def _attend(attend, q: Tensor, k: Tensor, v: Tensor, softmax_scale):
    """attend(q, k, v, softmax_scale) -> (out, lse), with a head dim that is not a multiple of 8
    zero-padded to the next one first (zero columns change no score, and add output columns that
    are sliced off): flash-attn's Python layer does the same."""
    head_dim = q.shape[-1]
    if head_dim % 8 == 0 or head_dim > 256 or k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        return attend(q, k, v, softmax_scale)  # the op names what is wrong, if anything is
    pad = -head_dim % 8
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    out, lse = attend(*(F.pad(t, (0, pad)) for t in (q, k, v)), scale)
    return out[..., :head_dim], lse


def _dense(q, k, v, softmax_scale, causal, window_size, softcap, deterministic):
    return _attend(lambda q, k, v, scale: _attention.flash_attention(
        q, k, v, causal=causal, softmax_scale=scale, window_size=tuple(window_size), softcap=softcap,
        return_lse=True, deterministic=deterministic), q, k, v, softmax_scale)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _refuse("flash_attn_func", dropout_p, alibi_slopes)
    out, lse = _dense(q, k, v, softmax_scale, causal, window_size, softcap, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                              alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _refuse("flash_attn_qkvpacked_func", dropout_p, alibi_slopes)
    q, k, v = qkv.unbind(dim=2)  # views of (B, S, 3, H, D): no copies
    out, lse = _dense(q, k, v, softmax_scale, causal, window_size, softcap, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _refuse("flash_attn_kvpacked_func", dropout_p, alibi_slopes)
    k, v = kv.unbind(dim=2)
    out, lse = _dense(q, k, v, softmax_scale, causal, window_size, softcap, deterministic)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    _refuse("flash_attn_varlen_func", dropout_p, alibi_slopes)
    if block_table is not None:
        raise NotImplementedError("flashext.compat.flash_attn.flash_attn_varlen_func: block_table (paged varlen) is "
                                  "not supported; use flash_attn_with_kvcache for paged caches")
    out, lse = _attend(lambda q, k, v, scale: _attention.flash_attention_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal, softmax_scale=scale,
        window_size=tuple(window_size), softcap=softcap, return_lse=True, deterministic=deterministic),
        q, k, v, softmax_scale)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    _refuse("flash_attn_varlen_qkvpacked_func", dropout_p, alibi_slopes)
    q, k, v = qkv.unbind(dim=1)  # (total, 3, H, D)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0, softmax_scale,
                                  causal, window_size, softcap, None, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _refuse("flash_attn_varlen_kvpacked_func", dropout_p, alibi_slopes)
    k, v = kv.unbind(dim=1)  # (total, 2, Hkv, D)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0,
                                  softmax_scale, causal, window_size, softcap, None, deterministic, return_attn_probs)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    fn = "flashext.compat.flash_attn.flash_attn_with_kvcache"
    _refuse("flash_attn_with_kvcache", 0.0, alibi_slopes)
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                        ("cache_leftpad", cache_leftpad)):
        if value is not None:
            raise NotImplementedError(f"{fn}: {name} is not supported")
    batch = q.shape[0]
    if cache_seqlens is None:  # flash-attn: the whole cache is valid
        capacity = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
        cache_seqlens = capacity - (0 if k is None else k.shape[1])
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    out, lse = _attention.flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k, v, block_table,
                                                       causal=causal, softmax_scale=softmax_scale,
                                                       window_size=tuple(window_size), softcap=softcap,
                                                       num_splits=num_splits, return_lse=True)
    return (out, lse) if return_softmax_lse else out
