"""flashext.compat.flash_attn: flash-attn 2's functions, names, defaults and return values on
flashext's kernels. Argument mapping and refusals on meta tensors (CI); on the GPU, outputs, lse
and gradients of every function against the reference over the part of flash-attn 2's own test
grid (tests/test_flash_attn.py: its sequence-length pairs and head dims, MHA / MQA / GQA, causal,
local windows, softcap, deterministic, paged and appended KV caches) that flashext supports."""

import inspect

import pytest
import torch

from flashext import reference as ref
from flashext.compat import flash_attn as fa
from flashext.testing import GRADIENT_FACTOR, assert_close
from tests.helpers import CHECK_DEVICES, HALF_DTYPES, HALF_IDS, cu_seqlens, randn, requires_cuda

# flash-attn 2.6+'s signatures: the names, order and defaults a caller may rely on
SIGNATURES = {
    "flash_attn_func": "q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
                       "softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False",
    "flash_attn_qkvpacked_func": "qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
                                 "softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False",
    "flash_attn_varlen_func": "q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, "
                              "softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, "
                              "alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None",
    "flash_attn_kvpacked_func": "q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
                                "softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False",
    "flash_attn_varlen_qkvpacked_func": "qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, "
                                        "causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, "
                                        "deterministic=False, return_attn_probs=False",
    "flash_attn_varlen_kvpacked_func": "q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, "
                                       "dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), "
                                       "softcap=0.0, alibi_slopes=None, deterministic=False, "
                                       "return_attn_probs=False",
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


# flash-attn 2's test grid: its (seqlen_q, seqlen_k) pairs and head dims (less 59 and 111, which
# test_odd_head_dims_are_padded_as_flash_attn_pads_them covers), and its head counts (9 query heads;
# MQA 1 KV head, GQA 3)
FA_SEQLENS = [(113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1024, 1024), (1023, 1024),
              (1024, 1023), (2048, 2048)]
FA_HEAD_DIMS = [32, 40, 64, 80, 96, 128, 160, 192, 224, 256]
HEADS, HEADS_KV = 9, {"mha": 9, "mqa": 1, "gqa": 3}


def _kinds(*kinds: str) -> list[tuple[str, str]]:
    """(kind, mha_type) pairs: every head layout, except that a qkvpacked tensor has as many KV
    heads as query heads."""
    return [(kind, mha) for kind in kinds for mha in HEADS_KV if not kind.endswith("qkvpacked") or mha == "mha"]
# (seqlens, head dim, options) cases: every pair and every head dim, each option on several
FA_CASES = [(FA_SEQLENS[i], FA_HEAD_DIMS[i], opts) for i, opts in enumerate([
    {}, {"causal": True}, {"window_size": (64, 32)}, {"softcap": 30.0}, {"causal": True, "deterministic": True},
    {"window_size": (200, 0), "softcap": 5.0}, {"causal": True, "softmax_scale": 0.3}, {"window_size": (-1, 7)},
    {"deterministic": True}, {"causal": True, "window_size": (300, -1)}])]


def _reference_kwargs(kwargs):
    return {name: value for name, value in kwargs.items() if name != "deterministic"}


def _compare(label, got, q, k, v, dout, forward, backward, kwargs):
    """got = (out, lse, (dq, dk, dv)) against forward(q, k, v, return_lse=True, **kw) and
    backward(dout, q, k, v, **kw), each in float64 and in the inputs' dtype (the rule's baseline)."""
    kw = _reference_kwargs(kwargs)
    out, lse, grads = got
    want, want_lse = forward(q, k, v, return_lse=True, **kw)
    base, base_lse = forward(q, k, v, return_lse=True, compute_dtype=q.dtype, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == want_lse.shape and lse.dtype == torch.float32
    assert_close(f"{label} out {kwargs}", out, want, base)
    finite = torch.isfinite(want_lse)
    assert_close(f"{label} lse {kwargs}", lse[finite], want_lse[finite], base_lse[finite].float())
    want_grads = backward(dout, q, k, v, **kw)
    base_grads = backward(dout, q, k, v, compute_dtype=q.dtype, **kw)
    for name, g, w, b, t in zip(("dq", "dk", "dv"), grads, want_grads, base_grads, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype, f"{label} {name}"
        assert_close(f"{label} {name} {kwargs}", g, w, b, factor=GRADIENT_FACTOR)


def _run(fn, leaves, dout, unpack):
    """fn(*leaves) -> (out, lse, None) and the gradients of <out, dout> with respect to the leaves,
    unpacked into (dq, dk, dv)."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out, lse, probs = fn(*leaves)
    assert probs is None
    grads = torch.autograd.grad((out.float() * dout.float()).sum(), leaves)
    return out.detach(), lse, unpack(grads)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("kind, mha_type", _kinds("func", "kvpacked", "qkvpacked"))
def test_flash_attn_output(kind, mha_type, dtype):
    """flash-attn's test_flash_attn_output / _qkvpacked: out, lse (return_attn_probs) and gradients."""
    for (seqlen_q, seqlen_k), head_dim, kwargs in FA_CASES:
        if kind == "qkvpacked":
            seqlen_k = seqlen_q
        q = randn(2, seqlen_q, HEADS, head_dim, dtype=dtype)
        k, v = (randn(2, seqlen_k, HEADS_KV[mha_type], head_dim, dtype=dtype) for _ in range(2))
        dout = randn(*q.shape, dtype=dtype)
        if kind == "func":
            got = _run(lambda q, k, v: fa.flash_attn_func(q, k, v, return_attn_probs=True, **kwargs), (q, k, v),
                       dout, tuple)
        elif kind == "kvpacked":
            got = _run(lambda q, kv: fa.flash_attn_kvpacked_func(q, kv, return_attn_probs=True, **kwargs),
                       (q, torch.stack([k, v], dim=2)), dout, lambda g: (g[0], *g[1].unbind(2)))
        else:
            got = _run(lambda qkv: fa.flash_attn_qkvpacked_func(qkv, return_attn_probs=True, **kwargs),
                       (torch.stack([q, k, v], dim=2),), dout, lambda g: g[0].unbind(2))
        _compare(f"{kind} {mha_type} {seqlen_q}x{seqlen_k} d{head_dim}", got, q, k, v, dout, ref.attention,
                 ref.attention_backward, kwargs)


def _random_lengths(total_max: int, batch: int, generator) -> list[int]:
    """Ragged lengths as flash-attn's tests draw them (generate_random_padding_mask: each at least
    a third of the maximum, one of them the maximum)."""
    lengths = torch.randint(max(1, total_max // 3), total_max + 1, (batch,), generator=generator).tolist()
    lengths[int(torch.randint(0, batch, (1,), generator=generator))] = total_max
    return lengths


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("kind, mha_type", _kinds("varlen_func", "varlen_kvpacked", "varlen_qkvpacked"))
def test_flash_attn_varlen_output(kind, mha_type, dtype):
    """flash-attn's test_flash_attn_varlen_output / _varlen_qkvpacked: ragged batches of 4."""
    generator = torch.Generator().manual_seed(0)
    for (seqlen_q, seqlen_k), head_dim, kwargs in [((1, 147), 64, {"causal": True})] + FA_CASES[:8]:
        lengths_q = _random_lengths(seqlen_q, 4, generator)
        lengths_k = lengths_q if kind == "varlen_qkvpacked" else _random_lengths(seqlen_k, 4, generator)
        cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
        max_q, max_k = max(lengths_q), max(lengths_k)
        q = randn(sum(lengths_q), HEADS, head_dim, dtype=dtype)
        k, v = (randn(sum(lengths_k), HEADS_KV[mha_type], head_dim, dtype=dtype) for _ in range(2))
        dout = randn(*q.shape, dtype=dtype)
        if kind == "varlen_func":
            got = _run(lambda q, k, v: fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k,
                                                                 return_attn_probs=True, **kwargs),
                       (q, k, v), dout, tuple)
        elif kind == "varlen_kvpacked":
            got = _run(lambda q, kv: fa.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max_q, max_k,
                                                                        return_attn_probs=True, **kwargs),
                       (q, torch.stack([k, v], dim=1)), dout, lambda g: (g[0], *g[1].unbind(1)))
        else:
            got = _run(lambda qkv: fa.flash_attn_varlen_qkvpacked_func(qkv, cu_q, max_q, return_attn_probs=True,
                                                                       **kwargs),
                       (torch.stack([q, k, v], dim=1),), dout, lambda g: g[0].unbind(1))

        def forward(q, k, v, **kw):
            return ref.attention_varlen(q, k, v, cu_q, cu_k, **kw)

        def backward(dout, q, k, v, **kw):
            return ref.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, **kw)

        _compare(f"{kind} {mha_type} {lengths_q} {lengths_k} d{head_dim}", got, q, k, v, dout, forward, backward,
                 kwargs)


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("head_dim", [59, 111, 3])
def test_odd_head_dims_are_padded_as_flash_attn_pads_them(dtype, head_dim):
    """flash-attn pads a head dim that is not a multiple of 8; so do we (forward, lse, gradients;
    the default scale is 1/sqrt of the unpadded head dim)."""
    q = randn(2, 113, HEADS, head_dim, dtype=dtype)
    k, v = (randn(2, 203, 3, head_dim, dtype=dtype) for _ in range(2))
    dout = randn(*q.shape, dtype=dtype)
    for kwargs in ({}, {"causal": True, "softcap": 20.0}):
        got = _run(lambda q, k, v: fa.flash_attn_func(q, k, v, return_attn_probs=True, **kwargs), (q, k, v), dout,
                   tuple)
        _compare(f"padded d{head_dim}", got, q, k, v, dout, ref.attention, ref.attention_backward, kwargs)
    cu = cu_seqlens([50, 63])
    qkv = randn(113, 3, HEADS, head_dim, dtype=dtype)
    out = fa.flash_attn_varlen_qkvpacked_func(qkv, cu, 63, causal=True)
    q, k, v = qkv.unbind(1)
    assert_close(f"varlen padded d{head_dim}", out, ref.attention_varlen(q, k, v, cu, cu, causal=True),
                 ref.attention_varlen(q, k, v, cu, cu, causal=True, compute_dtype=dtype))


def _paged(k_cache, v_cache, page_size, generator):
    """The same (B, capacity, Hkv, D) caches as shuffled pages of page_size tokens, and the table."""
    batch, capacity = k_cache.shape[:2]
    pages_per_seq = -(-capacity // page_size)
    num_pages = batch * pages_per_seq + 3
    table = torch.randperm(num_pages, generator=generator)[: batch * pages_per_seq].view(batch, pages_per_seq)
    table = table.int().to(k_cache.device)
    paged = []
    for cache in (k_cache, v_cache):
        pages = randn(num_pages, page_size, *cache.shape[2:], dtype=cache.dtype)  # unused rows hold noise
        for b in range(batch):
            for p in range(pages_per_seq):
                rows = cache[b, p * page_size:(p + 1) * page_size]
                pages[table[b, p], : rows.shape[0]] = rows
        paged.append(pages)
    return paged[0], paged[1], table


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("mha_type", ["mha", "mqa", "gqa"])
@pytest.mark.parametrize("paged_kv_block_size", [None, 16, 256])
@pytest.mark.parametrize("new_kv", [False, True])
def test_flash_attn_kvcache(new_kv, paged_kv_block_size, mha_type, dtype):
    """flash-attn's test_flash_attn_kvcache (without rotary and cache_batch_idx, which flashext
    refuses): dense and paged caches, new tokens appended in place, seqlen_q 1 (decode) and more,
    num_splits; out and lse (return_softmax_lse). (cache_seqlens as an int and None: the next test.)"""
    generator = torch.Generator().manual_seed(1)
    cases = [(1, 128, 64, {}), (1, 339, 128, {"causal": True}), (3, 1024, 128, {"causal": True}),
             (64, 800, 96, {"window_size": (100, 0)}), (113, 203, 256, {"causal": True, "softcap": 30.0}),
             (1, 3131, 64, {"num_splits": 3})]
    for seqlen_q, seqlen_k, head_dim, kwargs in cases:
        batch, seqlen_new = 3, 5 if new_kv else 0
        q = randn(batch, seqlen_q, HEADS, head_dim, dtype=dtype)
        k_cache, v_cache = (randn(batch, seqlen_k, HEADS_KV[mha_type], head_dim, dtype=dtype) for _ in range(2))
        lens = torch.randint(0, seqlen_k - seqlen_new + 1, (batch,), generator=generator).int().cuda()
        k, v = ((randn(batch, seqlen_new, HEADS_KV[mha_type], head_dim, dtype=dtype) for _ in range(2)) if new_kv
                else (None, None))
        table = None
        if paged_kv_block_size is not None:
            k_cache, v_cache, table = _paged(k_cache, v_cache, paged_kv_block_size, generator)
        ref_kwargs = {name: value for name, value in kwargs.items() if name != "num_splits"}
        want_k, want_v = k_cache.clone(), v_cache.clone()
        want, want_lse = ref.attention_with_kvcache(q, want_k, want_v, lens, k, v, table, return_lse=True,
                                                    **ref_kwargs)
        base, base_lse = ref.attention_with_kvcache(q, k_cache.clone(), v_cache.clone(), lens, k, v, table,
                                                    return_lse=True, compute_dtype=dtype, **ref_kwargs)
        out, lse = fa.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, block_table=table,
                                              return_softmax_lse=True, **kwargs)
        label = f"kvcache {mha_type} page={paged_kv_block_size} {seqlen_q}x{seqlen_k} d{head_dim} {kwargs}"
        assert_close(f"{label} out", out, want, base)
        finite = torch.isfinite(want_lse)
        assert_close(f"{label} lse", lse[finite], want_lse[finite], base_lse[finite].float())
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), f"{label}: the in-place append"


@requires_cuda
def test_kvcache_seqlens_as_int_and_none():
    """cache_seqlens as an int, and None (flash-attn: the whole cache, less the new tokens)."""
    q = randn(2, 1, 8, 64, dtype=torch.bfloat16)
    k_cache, v_cache = (randn(2, 96, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    k, v = (randn(2, 1, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    full = torch.full((2,), 95, dtype=torch.int32, device="cuda")
    want = ref.attention_with_kvcache(q, k_cache.clone(), v_cache.clone(), full, k, v)
    base = ref.attention_with_kvcache(q, k_cache.clone(), v_cache.clone(), full, k, v, compute_dtype=q.dtype)
    for lens in (95, None):
        got = fa.flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k, v, cache_seqlens=lens)
        assert_close(f"kvcache cache_seqlens={lens}", got, want, base)


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
