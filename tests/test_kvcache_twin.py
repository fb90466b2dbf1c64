"""The KV-cache attention's definition (flashext.reference.attention_with_kvcache) and its Triton
twin (split-KV over dense and paged caches, the group's query heads packed, new tokens appended in
place, splits merged by their lse): on CPU under the interpreter, on the GPU on larger shapes."""

import pytest
import torch

from flashext import reference as ref
from flashext.testing import assert_close
from flashext.triton_ref import attention as twin
from tests.helpers import HAS_CUDA

DEVICE = "cuda" if HAS_CUDA else "cpu"


def paged_copy(cache, page_size, pages_per_seq, generator):
    """The same cache as (num_pages, page_size, Hkv, D) pages in shuffled order, and the block table."""
    batch, capacity = cache.shape[:2]
    num_pages = batch * pages_per_seq + 3  # spare pages nobody uses
    table = torch.randperm(num_pages, generator=generator)[: batch * pages_per_seq].view(batch, pages_per_seq)
    pages = torch.randn(num_pages, page_size, *cache.shape[2:], generator=generator).to(cache.dtype)
    for b in range(batch):
        for t in range(min(capacity, pages_per_seq * page_size)):
            pages[table[b, t // page_size], t % page_size] = cache[b, t]
    return pages.to(cache.device), table.int().to(cache.device)


def make_case(batch, seqlen_q, heads, heads_kv, head_dim, lengths, new, capacity, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dtype).to(DEVICE)  # noqa: E731
    q = rnd(batch, seqlen_q, heads, head_dim)
    k_cache, v_cache = rnd(batch, capacity, heads_kv, head_dim), rnd(batch, capacity, heads_kv, head_dim)
    k, v = (rnd(batch, new, heads_kv, head_dim), rnd(batch, new, heads_kv, head_dim)) if new else (None, None)
    return q, k_cache, v_cache, torch.tensor(lengths, dtype=torch.int32, device=DEVICE), k, v, g


def check(q, k_cache, v_cache, lens, k, v, block_table=None, num_splits=1, **kwargs):
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want, want_lse = ref.attention_with_kvcache(q, want_k, want_v, lens, k, v, block_table, return_lse=True,
                                                **kwargs)
    base = ref.attention_with_kvcache(q, k_cache.clone(), v_cache.clone(), lens, k, v, block_table,
                                      compute_dtype=q.dtype, **kwargs)
    out, lse = twin.attention_with_kvcache(q, k_cache, v_cache, lens, k, v, block_table, num_splits=num_splits,
                                           **kwargs)
    assert_close(f"kvcache out splits={num_splits} {kwargs}", out, want, base)
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse[finite], want_lse[finite], rtol=1e-3, atol=1e-3)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)  # the append, in place


@pytest.mark.parametrize("num_splits", [1, 3, 7])
@pytest.mark.parametrize("seqlen_q, new, causal", [(1, 0, False), (1, 1, True), (5, 3, True), (4, 0, False)])
def test_twin_dense_cache(num_splits, seqlen_q, new, causal):
    q, kc, vc, lens, k, v, _ = make_case(3, seqlen_q, 8, 2, 16, [0, 13, 37], new, 48, torch.float16, 1)
    check(q, kc, vc, lens, k, v, num_splits=num_splits, causal=causal)


@pytest.mark.parametrize("page_size", [1, 4, 16, 17])
def test_twin_paged_cache(page_size):
    pages_per_seq = -(-48 // page_size)
    q, kc, vc, lens, k, v, g = make_case(3, 2, 8, 2, 16, [page_size - 1, page_size, 40], 2, pages_per_seq * page_size,
                                         torch.bfloat16, page_size)
    pages_k, table = paged_copy(kc, page_size, pages_per_seq, g)
    pages_v, _ = paged_copy(vc, page_size, pages_per_seq, torch.Generator().manual_seed(page_size))
    # the value pages must sit where the key pages do
    for b in range(kc.shape[0]):
        for t in range(pages_per_seq * page_size):
            pages_v[table[b, t // page_size], t % page_size] = vc[b, t]
    for num_splits in (1, 4):
        check(q, pages_k.clone(), pages_v.clone(), lens, k, v, block_table=table, num_splits=num_splits, causal=True)


@pytest.mark.parametrize("kwargs", [{"window_size": (5, 0)}, {"softcap": 4.0}, {"softmax_scale": 0.3},
                                    {"causal": True, "window_size": (9, -1)}])
def test_twin_options(kwargs):
    q, kc, vc, lens, k, v, _ = make_case(2, 3, 4, 1, 16, [20, 31], 1, 40, torch.float16, 2)
    check(q, kc, vc, lens, k, v, num_splits=2, **kwargs)


def test_twin_empty_cache_rows_see_nothing():
    q, kc, vc, lens, _, _, _ = make_case(2, 1, 4, 2, 16, [0, 5], 0, 16, torch.float16, 3)
    out, lse = twin.attention_with_kvcache(q, kc, vc, lens, num_splits=3)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()
    check(q, kc, vc, lens, None, None, num_splits=3)


def test_twin_clamps_lengths_and_page_ids():
    # As the CUDA kernel: new tokens past the capacity are dropped, a negative length counts as 0,
    # and page ids outside the cache are clamped into it.
    g = torch.Generator().manual_seed(5)
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(torch.float16).to(DEVICE)  # noqa: E731
    q, kc, vc, kn, vn = rnd(3, 2, 4, 16), rnd(3, 16, 2, 16), rnd(3, 16, 2, 16), rnd(3, 4, 2, 16), rnd(3, 4, 2, 16)
    lens = torch.tensor([14, 16, -2], dtype=torch.int32, device=DEVICE)
    want_k, want_v = kc.clone(), vc.clone()
    want_k[0, 14:], want_v[0, 14:] = kn[0, :2], vn[0, :2]
    want_k[2, :4], want_v[2, :4] = kn[2], vn[2]
    out, _ = twin.attention_with_kvcache(q, kc, vc, lens, kn, vn, causal=True, num_splits=3)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    held = torch.tensor([16, 16, 4], dtype=torch.int32, device=DEVICE)
    assert_close("twin past capacity", out, ref.attention_with_kvcache(q, kc, vc, held, causal=True),
                 ref.attention_with_kvcache(q, kc, vc, held, causal=True, compute_dtype=q.dtype))
    # paged: ids 99 and -3 of a 5-page cache land in pages 4 and 0
    pages_k, pages_v = rnd(5, 8, 2, 16), rnd(5, 8, 2, 16)
    table = torch.tensor([[0, 99], [-3, 1]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([6, 12], dtype=torch.int32, device=DEVICE)
    want_k, want_v = pages_k.clone(), pages_v.clone()
    want_k[0, 6:8], want_k[4, 0] = kn[0, :2], kn[0, 2]
    want_v[1, 4:7] = vn[1, :3]
    out, _ = twin.attention_with_kvcache(q[:2], pages_k, pages_v, lens, kn[:2, :3], vn[:2, :3], block_table=table)
    assert torch.equal(pages_k[0, 6:8], want_k[0, 6:8]) and torch.equal(pages_k[4, 0], want_k[4, 0])
    assert torch.equal(pages_v[1, 4:7], want_v[1, 4:7])
    clamped = table.clamp(0, 4)
    want = ref.attention_with_kvcache(q[:2], pages_k, pages_v, lens + 3, block_table=clamped)
    base = ref.attention_with_kvcache(q[:2], pages_k, pages_v, lens + 3, block_table=clamped, compute_dtype=q.dtype)
    assert_close("twin clamped pages", out, want, base)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_twin_nan_in_a_cache_stays_in_its_sequence(num_splits):
    # A NaN key of sequence 0 makes its rows NaN (out and lse, as the reference's), with one split
    # or several; sequence 1's rows stay finite and right.
    q, kc, vc, lens, _, _, _ = make_case(2, 1, 4, 2, 16, [20, 30], 0, 32, torch.float16, 11)
    kc[0, 7, 1, 3] = float("nan")
    out, lse = twin.attention_with_kvcache(q, kc, vc, lens, num_splits=num_splits)
    want, want_lse = ref.attention_with_kvcache(q, kc, vc, lens, return_lse=True)
    assert torch.equal(torch.isnan(out), torch.isnan(want)) and torch.isnan(out[0]).any()
    assert torch.equal(torch.isnan(lse), torch.isnan(want_lse))
    assert_close("twin nan: the other sequence", out[1], want[1],
                 ref.attention_with_kvcache(q, kc, vc, lens, compute_dtype=q.dtype)[1])
