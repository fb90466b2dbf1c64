"""flashext.compat.flash_attn: flash-attn 2's functions, names, defaults and return values on
flashext's kernels. Argument mapping and refusals on meta tensors (CI); values against the
reference on the GPU."""

import inspect

import pytest
import torch

from flashext import reference as ref
from flashext.compat import flash_attn as fa
from flashext.testing import assert_close
from tests.helpers import CHECK_DEVICES, cu_seqlens, randn, requires_cuda

# flash-attn 2.6+'s signatures: the names, order and defaults a caller may rely on
SIGNATURES = {
    "flash_attn_func": "q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
                       "softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False",
    "flash_attn_qkvpacked_func": "qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
                                 "softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False",
    "flash_attn_varlen_func": "q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, "
                              "softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, "
                              "alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None",
    "flash_attn_with_kvcache": "q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, "
                               "cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None, "
                               "softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, "
                               "rotary_interleaved=True, alibi_slopes=None, num_splits=0, "
                               "return_softmax_lse=False",
}


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signatures_match_flash_attn(name):
    assert str(inspect.signature(getattr(fa, name)))[1:-1] == SIGNATURES[name]


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_shapes_and_return_values(device):
    q, k, v = (randn(2, 16, 4, 64, dtype=torch.bfloat16, device=device) for _ in range(3))
    assert fa.flash_attn_func(q, k, v).shape == q.shape
    out, lse, probs = fa.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 16) and probs is None
    qkv = randn(2, 16, 3, 4, 64, dtype=torch.bfloat16, device=device)
    assert fa.flash_attn_qkvpacked_func(qkv).shape == (2, 16, 4, 64)
    kv = randn(2, 16, 2, 2, 64, dtype=torch.bfloat16, device=device)
    assert fa.flash_attn_kvpacked_func(q, kv).shape == q.shape
    cu = torch.empty(3, dtype=torch.int32, device=device) if device == "meta" else cu_seqlens([10, 6], device)
    packed = randn(16, 3, 4, 64, dtype=torch.bfloat16, device=device)
    assert fa.flash_attn_varlen_qkvpacked_func(packed, cu, 10).shape == (16, 4, 64)
    assert fa.flash_attn_varlen_kvpacked_func(q[0], kv[0], cu, cu, 10, 10, causal=True).shape == (16, 4, 64)
    cache = randn(2, 32, 4, 64, dtype=torch.bfloat16, device=device)
    lens = torch.empty(2, dtype=torch.int32, device=device) if device == "meta" else \
        torch.tensor([3, 30], dtype=torch.int32, device=device)
    out, lse = fa.flash_attn_with_kvcache(q[:, :1], cache, cache.clone(), cache_seqlens=lens, return_softmax_lse=True)
    assert out.shape == (2, 1, 4, 64) and lse.shape == (2, 4, 1)


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_what_flashext_does_not_do_is_refused_by_name(device):
    q = randn(1, 8, 2, 64, dtype=torch.float16, device=device)
    with pytest.raises(NotImplementedError, match=r"flash_attn_func: dropout_p must be 0.0"):
        fa.flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match=r"flash_attn_func: alibi_slopes is not supported"):
        fa.flash_attn_func(q, q, q, alibi_slopes=torch.ones(2))
    for name in ("rotary_cos", "cache_batch_idx", "cache_leftpad"):
        with pytest.raises(NotImplementedError, match=rf"flash_attn_with_kvcache: {name} is not supported"):
            fa.flash_attn_with_kvcache(q, q, q, cache_seqlens=3, **{name: torch.ones(1)})


@requires_cuda
def test_values_against_the_reference():
    q, k, v = (randn(2, 100, 8, 64, dtype=torch.float16) for _ in range(3))
    for kwargs in ({}, {"causal": True}, {"window_size": (20, 5)}, {"softcap": 10.0}):
        want = ref.attention(q, k, v, **kwargs)
        base = ref.attention(q, k, v, compute_dtype=q.dtype, **kwargs)
        assert_close(f"flash_attn_func {kwargs}", fa.flash_attn_func(q, k, v, **kwargs), want, base)
    qkv = torch.stack([q, k, v], dim=2)
    assert_close("qkvpacked", fa.flash_attn_qkvpacked_func(qkv, causal=True), ref.attention(q, k, v, causal=True),
                 ref.attention(q, k, v, causal=True, compute_dtype=q.dtype))
    cache = randn(2, 128, 8, 64, dtype=torch.float16)
    lens = torch.tensor([7, 120], dtype=torch.int32, device="cuda")
    want = ref.attention_with_kvcache(q[:, :1], cache.clone(), cache.clone(), lens)
    base = ref.attention_with_kvcache(q[:, :1], cache.clone(), cache.clone(), lens, compute_dtype=q.dtype)
    assert_close("with_kvcache", fa.flash_attn_with_kvcache(q[:, :1], cache, cache.clone(), cache_seqlens=lens),
                 want, base)
