"""flashext.flash_attention_with_kvcache against flashext.reference.attention_with_kvcache (GPU):
dense and paged caches (page sizes 1 … 257, shuffled tables), appended tokens across page
boundaries, cache lengths 0, 1 and page boundaries ± 1, GQA 1 … 32, Sq from 1 (decode) to 128,
every split count equal to unsplit within the rule, NaN in the rows past each length, masks and
options, CUDA graphs, opcheck, torch.compile; lengths past the capacity and page ids outside the
cache (the caches inside guard regions that must come back bitwise), validate=True's refusals; bad
input on meta and CUDA."""

import pytest
import torch

import flashext
from flashext import reference as ref
from flashext.testing import assert_close, poison_cache
from tests.helpers import CHECK_DEVICES, HALF_DTYPES, HALF_IDS, randn, requires_cuda


def paged(cache, page_size, generator):
    """The same (B, capacity, Hkv, D) cache as shuffled pages of page_size tokens, and the table."""
    batch, capacity = cache.shape[:2]
    pages_per_seq = -(-capacity // page_size)
    num_pages = batch * pages_per_seq + 5
    table = torch.randperm(num_pages, generator=generator)[: batch * pages_per_seq].view(batch, pages_per_seq)
    pages = torch.randn(num_pages, page_size, *cache.shape[2:], generator=generator).to(cache.dtype).to(cache.device)
    table = table.int().to(cache.device)
    return to_pages(cache, table, pages), table


def to_pages(cache, table, pages):
    """Writes the (B, capacity, Hkv, D) cache into `pages` (num_pages, page_size, Hkv, D) through the
    page table; the pages no table row names keep what they held."""
    page_size = pages.shape[1]
    t = torch.arange(cache.shape[1], device=pages.device)
    for b in range(cache.shape[0]):
        pages[table[b, t // page_size].long(), t % page_size] = cache[b]
    return pages


def check(q, k_cache, v_cache, lens, k=None, v=None, block_table=None, num_splits=0, **kwargs):
    want_k, want_v = k_cache.clone(), v_cache.clone()
    # out and lse read NaN where the kernels leave them unwritten: the allocator's next blocks of
    # their sizes filled with NaN
    poison_cache(q, torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device))
    want, want_lse = ref.attention_with_kvcache(q, want_k, want_v, lens, k, v, block_table, return_lse=True, **kwargs)
    base, base_lse = ref.attention_with_kvcache(q, k_cache.clone(), v_cache.clone(), lens, k, v, block_table,
                                                compute_dtype=q.dtype, return_lse=True, **kwargs)
    out, lse = flashext.flash_attention_with_kvcache(q, k_cache, v_cache, lens, k, v, block_table,
                                                     num_splits=num_splits, return_lse=True, **kwargs)
    assert_close(f"kvcache out splits={num_splits} {kwargs}", out, want, base)
    finite = torch.isfinite(want_lse)
    # the lse by the same rule (P is summed as the 16-bit values P V multiplies)
    assert_close(f"kvcache lse splits={num_splits}", lse[finite], want_lse[finite], base_lse[finite].float())
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    # bit for bit (NaN in a cache compares equal to itself): the in-place append, nothing else
    for cache, want_cache in ((k_cache, want_k), (v_cache, want_v)):
        assert torch.equal(cache.view(torch.int16), want_cache.view(torch.int16)), "the in-place append"
    return out, lse




@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8, 32])
def test_decode_dense(dtype, head_dim, group):
    heads_kv = 2 if group < 32 else 1
    lens = torch.tensor([0, 1, 63, 64, 65, 1000], dtype=torch.int32, device="cuda")
    q = randn(6, 1, heads_kv * group, head_dim, dtype=dtype)
    kc, vc = (randn(6, 1100, heads_kv, head_dim, dtype=dtype) for _ in range(2))
    check(q, kc, vc, lens)
    kn, vn = (randn(6, 1, heads_kv, head_dim, dtype=dtype) for _ in range(2))
    check(q, kc, vc, lens, kn, vn, causal=True)


@requires_cuda
@pytest.mark.parametrize("page_size", [1, 16, 64, 256, 257])
def test_paged_cache_and_appends_across_pages(page_size):
    g = torch.Generator().manual_seed(page_size)
    kc, vc = (randn(4, 700, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    pages_k, table = paged(kc, page_size, g)
    pages_v = to_pages(vc, table, torch.randn_like(pages_k))  # pages outside the table too: check compares them
    lens = torch.tensor([0, page_size - 1, page_size, 600], dtype=torch.int32, device="cuda").clamp(max=690)
    q = randn(4, 3, 8, 128, dtype=torch.bfloat16)
    kn, vn = (randn(4, 3, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    check(q, pages_k, pages_v, lens, kn, vn, block_table=table, causal=True)
    check(q, pages_k, pages_v, lens + 3, block_table=table)
    check(q, pages_k, pages_v, lens + 3, block_table=table, num_splits=3)  # splits start mid-page


@requires_cuda
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 16, 64])
def test_every_split_count_matches(num_splits):
    lens = torch.tensor([5, 2000, 4096], dtype=torch.int32, device="cuda")
    q = randn(3, 2, 16, 128, dtype=torch.float16)
    kc, vc = (randn(3, 4096, 4, 128, dtype=torch.float16) for _ in range(2))
    check(q, kc, vc, lens, num_splits=num_splits, causal=True)
    # a fixed split count is bitwise reproducible
    a = flashext.flash_attention_with_kvcache(q, kc, vc, lens, num_splits=num_splits)
    b = flashext.flash_attention_with_kvcache(q, kc, vc, lens, num_splits=num_splits)
    assert torch.equal(a, b)


@requires_cuda
@pytest.mark.parametrize("num_splits", [1, 3, 16, 64])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_every_split_count_matches_paged_bf16(head_dim, num_splits):
    # the same over a paged cache (splits starting mid-page), bf16, the other head dims
    lens = torch.tensor([5, 1000, 2047], dtype=torch.int32, device="cuda")
    q = randn(3, 1, 8, head_dim, dtype=torch.bfloat16)
    kc, vc = (randn(3, 2048, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    g = torch.Generator().manual_seed(num_splits + head_dim)
    pages_k, table = paged(kc, 16, g)
    pages_v = to_pages(vc, table, torch.randn_like(pages_k))
    kn, vn = (randn(3, 1, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    check(q, pages_k, pages_v, lens, kn, vn, block_table=table, num_splits=num_splits)


@requires_cuda
@pytest.mark.parametrize("paged_cache", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_rows_past_the_length_never_reach_the_output(paged_cache, head_dim):
    # A sequence's first split block copies its first tiles before the length is in, rows up to
    # the split's end, and copies them again with the rows past the length zero-filled where the
    # keys end inside them; later splits copy once the length is in. With NaN in every cache row
    # past each length (and in the pages no table names), out and lse stay finite and match the
    # reference. Lengths end inside the first two tiles of a split (64 keys a tile at D <= 128, 32
    # at 256; 4 splits of 256 keys here): the first split's and the later ones'.
    lens = torch.tensor([1, 31, 33, 63, 65, 127, 200, 257, 290, 320, 383, 520, 769, 1000],
                        dtype=torch.int32, device="cuda")
    batch, capacity = lens.numel(), 1024
    q = randn(batch, 1, 8, head_dim, dtype=torch.bfloat16)
    past = torch.arange(capacity, device="cuda")[None, :] >= lens[:, None]
    kc, vc = (randn(batch, capacity, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    for cache in (kc, vc):
        cache[past] = float("nan")
    table = None
    if paged_cache:
        kc_pages, table = paged(kc, 16, torch.Generator().manual_seed(head_dim))
        named = torch.zeros(kc_pages.shape[0], dtype=torch.bool, device="cuda")
        named[table.long().flatten()] = True
        kc_pages[~named] = float("nan")
        kc, vc = kc_pages, to_pages(vc, table, torch.full_like(kc_pages, float("nan")))
    for num_splits in (1, 4, 0):
        out, lse = check(q, kc, vc, lens, block_table=table, num_splits=num_splits)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all(), f"NaN past the length, splits={num_splits}"


@requires_cuda
@pytest.mark.parametrize("kwargs", [{"window_size": (100, 0)}, {"softcap": 30.0}, {"softmax_scale": 0.05},
                                    {"causal": True, "window_size": (37, -1)}, {"window_size": (-1, 2)}])
def test_masks_and_options(kwargs):
    lens = torch.tensor([300, 17], dtype=torch.int32, device="cuda")
    q = randn(2, 128, 8, 64, dtype=torch.bfloat16)  # chunked prefill: 128 queries
    kc, vc = (randn(2, 512, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    kn, vn = (randn(2, 128, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    check(q, kc, vc, lens, kn, vn, **kwargs)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 200, 256])
@pytest.mark.parametrize("kwargs", [{}, {"window_size": (100, 0)}, {"softcap": 30.0}, {"softmax_scale": 0.05},
                                    {"causal": True, "window_size": (37, -1)}, {"window_size": (-1, 2)}])
def test_decode_shaped_options_and_head_dims(head_dim, kwargs):
    # Decode-shaped blocks (group · Sq ≤ 16: the warps share each key tile) under every option, head
    # dims below their kernel's width, and lengths of 1 … 7 key tiles (64 keys; 32 at D = 256).
    lens = torch.tensor([1, 64, 65, 130, 250, 440], dtype=torch.int32, device="cuda")
    for seqlen_q, group in ((1, 4), (2, 8)):
        q = randn(6, seqlen_q, 2 * group, head_dim, dtype=torch.bfloat16)
        kc, vc = (randn(6, 480, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
        check(q, kc, vc, lens, **kwargs)
        check(q, kc, vc, lens, num_splits=3, **kwargs)
        pages, table = paged(kc, 16, torch.Generator().manual_seed(head_dim))
        pages_v, _ = paged(vc, 16, torch.Generator().manual_seed(head_dim))
        check(q, pages, pages_v, lens, block_table=table, **kwargs)


@requires_cuda
@pytest.mark.parametrize("paged_cache", [False, True])
def test_cuda_graph_one_capture_serves_every_length(paged_cache):
    # One capture, replayed with fresh lengths, queries, new tokens and (paged) a fresh page table
    # each time: every replay's output and in-place appends are the reference's for its values.
    q = randn(8, 1, 32, 128, dtype=torch.bfloat16)
    kc, vc = (randn(8, 2048, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    kn, vn = (randn(8, 1, 8, 128, dtype=torch.bfloat16) for _ in range(2))
    lens = torch.tensor([3, 100, 500, 1000, 1500, 1900, 2000, 2046], dtype=torch.int32, device="cuda")
    table = None
    if paged_cache:
        kc, table = paged(kc, 16, torch.Generator().manual_seed(7))
        vc = torch.randn_like(kc)  # (any values: every replay reads both through its own table)
    static = [t.clone() for t in (q, kn, vn, lens)] + [None if table is None else table.clone()]
    caches = [kc.clone(), vc.clone()]

    def call():
        return flashext.flash_attention_with_kvcache(static[0], *caches, static[3], static[1], static[2],
                                                     block_table=static[4])

    call()  # warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for step in range(3):
        fresh_lens = torch.randint(0, 2047, (8,), dtype=torch.int32, device="cuda")
        static[3].copy_(fresh_lens)
        static[0].copy_(randn(8, 1, 32, 128, dtype=torch.bfloat16))
        static[1].copy_(randn(8, 1, 8, 128, dtype=torch.bfloat16))
        static[2].copy_(randn(8, 1, 8, 128, dtype=torch.bfloat16))
        if paged_cache:
            static[4].copy_(torch.randperm(kc.shape[0], device="cuda")[: table.numel()].view_as(table).int())
        before = [c.clone() for c in caches]
        graph.replay()
        want_k, want_v = before
        want = ref.attention_with_kvcache(static[0], want_k, want_v, fresh_lens, static[1], static[2], static[4])
        base = ref.attention_with_kvcache(static[0], before[0].clone(), before[1].clone(), fresh_lens, static[1],
                                          static[2], static[4], compute_dtype=torch.bfloat16)
        assert_close(f"graph replay {step}", out, want, base)
        assert torch.equal(caches[0], want_k) and torch.equal(caches[1], want_v), f"graph replay {step}'s appends"


@requires_cuda
def test_append_without_queries_still_writes_the_cache():
    kc, vc = (randn(2, 64, 2, 64, dtype=torch.float16) for _ in range(2))
    kn, vn = (randn(2, 3, 2, 64, dtype=torch.float16) for _ in range(2))
    lens = torch.tensor([0, 10], dtype=torch.int32, device="cuda")
    out = flashext.flash_attention_with_kvcache(randn(2, 0, 4, 64, dtype=torch.float16), kc, vc, lens, kn, vn)
    assert out.shape == (2, 0, 4, 64)
    assert torch.equal(kc[0, :3], kn[0]) and torch.equal(vc[1, 10:13], vn[1])


@requires_cuda
def test_opcheck_and_compile():
    q = randn(2, 1, 8, 64, dtype=torch.float16)
    kc, vc = (randn(2, 256, 2, 64, dtype=torch.float16) for _ in range(2))
    lens = torch.tensor([10, 200], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.flashext.flash_attn_with_kvcache.default, (q, kc, vc, lens),
                          test_utils=("test_schema", "test_faketensor"))
    compiled = torch.compile(lambda q, kc, vc, lens: flashext.flash_attention_with_kvcache(q, kc, vc, lens) * 2,
                             fullgraph=True)
    torch.testing.assert_close(compiled(q, kc, vc, lens), flashext.flash_attention_with_kvcache(q, kc, vc, lens) * 2)
    # the mutating form: new tokens appended into a paged cache
    pages, table = paged(kc, 16, torch.Generator().manual_seed(3))
    pages_v = torch.randn_like(pages)
    kn, vn = (randn(2, 3, 2, 64, dtype=torch.float16) for _ in range(2))
    torch.library.opcheck(torch.ops.flashext.flash_attn_with_kvcache.default,
                          (q, pages.clone(), pages_v.clone(), lens, kn, vn, table),
                          test_utils=("test_schema", "test_faketensor"))
    step = torch.compile(lambda q, kc, vc, lens, kn, vn, table: flashext.flash_attention_with_kvcache(
        q, kc, vc, lens, kn, vn, block_table=table, causal=True), fullgraph=True)
    eager_k, eager_v, compiled_k, compiled_v = pages.clone(), pages_v.clone(), pages.clone(), pages_v.clone()
    want = flashext.flash_attention_with_kvcache(q, eager_k, eager_v, lens, kn, vn, block_table=table, causal=True)
    torch.testing.assert_close(step(q, compiled_k, compiled_v, lens, kn, vn, table), want, rtol=0, atol=0)
    assert torch.equal(compiled_k, eager_k) and torch.equal(compiled_v, eager_v), "the compiled call's appends"


def guarded(shape, dtype, guard=4096):
    """A tensor of `shape` in the middle of a larger buffer of random values: (buffer, view)."""
    numel = torch.Size(shape).numel()
    buffer = randn(numel + 2 * guard, dtype=dtype)
    return buffer, buffer[guard:guard + numel].view(shape)


@requires_cuda
@pytest.mark.parametrize("paged", [False, True])
def test_lengths_past_capacity_stay_inside_the_cache(paged):
    # Lengths past the capacity (64 tokens per sequence), at it, just under it with more new tokens
    # than fit, and negative: the appends are clamped (new tokens past the end dropped, a negative
    # length counted as 0), the caches' buffers change bitwise only where those appends land (the
    # guard regions around both caches and every other row stay), and the output is the reference's
    # over what the caches then hold.
    lens = torch.tensor([60, 64, 5000, -3, 2], dtype=torch.int32, device="cuda")
    batch, new, page_size = 5, 8, 16
    if paged:
        table = torch.randperm(batch * 4 + 3, device="cuda")[: batch * 4].view(batch, 4).int()
        shape = (batch * 4 + 3, page_size, 2, 64)
    else:
        table, shape = None, (batch, 64, 2, 64)
    (big_k, kc), (big_v, vc) = guarded(shape, torch.float16), guarded(shape, torch.float16)
    want_k, want_v = big_k.clone(), big_v.clone()
    wk, wv = want_k[4096:-4096].view(shape), want_v[4096:-4096].view(shape)
    kn, vn = (randn(batch, new, 2, 64, dtype=torch.float16) for _ in range(2))
    for b in range(batch):
        start = max(int(lens[b]), 0)
        for t in range(max(0, min(new, 64 - start))):
            pos = start + t
            where = (int(table[b, pos // page_size]), pos % page_size) if paged else (b, pos)
            wk[where], wv[where] = kn[b, t], vn[b, t]
    q = randn(batch, 2, 4, 64, dtype=torch.float16)
    out = flashext.flash_attention_with_kvcache(q, kc, vc, lens, kn, vn, block_table=table, causal=True)
    assert torch.equal(big_k, want_k) and torch.equal(big_v, want_v), "writes outside the clamped appends"
    held = (lens.clamp(min=0) + new).clamp(max=64).int()  # what each sequence attends after the call
    want = ref.attention_with_kvcache(q, kc, vc, held, block_table=table, causal=True)
    base = ref.attention_with_kvcache(q, kc, vc, held, block_table=table, causal=True, compute_dtype=q.dtype)
    assert_close("kvcache past capacity", out, want, base)


@requires_cuda
def test_page_ids_outside_the_cache_stay_inside_it():
    # Page ids below 0 and past the last page are clamped into the cache (to pages 0 and 11): the
    # appends land there, the guard regions around both caches stay bitwise, and nothing is NaN.
    table = torch.tensor([[0, 999, 3], [-5, 1, 2]], dtype=torch.int32, device="cuda")
    (big_k, kc), (big_v, vc) = guarded((12, 16, 2, 64), torch.float16), guarded((12, 16, 2, 64), torch.float16)
    guards = [t[:4096].clone() for t in (big_k, big_v)] + [t[-4096:].clone() for t in (big_k, big_v)]
    lens = torch.tensor([14, 30], dtype=torch.int32, device="cuda")
    kn, vn = (randn(2, 4, 2, 64, dtype=torch.float16) for _ in range(2))
    q = randn(2, 1, 4, 64, dtype=torch.float16)
    out = flashext.flash_attention_with_kvcache(q, kc, vc, lens, kn, vn, block_table=table)
    assert torch.isfinite(out).all()
    after = [t[:4096] for t in (big_k, big_v)] + [t[-4096:] for t in (big_k, big_v)]
    assert all(torch.equal(a, g) for a, g in zip(after, guards)), "a write outside the cache"
    # sequence 0's tokens 16 and 17 are in page 999 -> 11 (slots 0, 1), sequence 1's 30-33 in pages 1 and 2
    assert torch.equal(kc[11, :2], kn[0, 2:]) and torch.equal(vc[2, :2], vn[1, 2:])


def test_validate_refuses_lengths_and_page_ids_before_any_write():
    # validate=True: host-side checks before the op (CPU tensors here: the checks come first; on the
    # GPU the same calls raise the same words, test below)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.zeros(2, 1, 4, 64, dtype=torch.float16, device=dev)
    pages = torch.zeros(12, 16, 2, 64, dtype=torch.float16, device=dev)
    table = torch.arange(8, dtype=torch.int32, device=dev).view(2, 4)
    fn = r"flashext.flash_attention_with_kvcache: "

    def call(lens, table=table, cache=pages, new=0):
        kv = {} if not new else {"k": pages.new_zeros(2, new, 2, 64), "v": pages.new_zeros(2, new, 2, 64)}
        lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        return flashext.flash_attention_with_kvcache(q, cache, cache, lens, block_table=table, validate=True, **kv)

    with pytest.raises(RuntimeError, match=fn + r"argument 'cache_seqlens' holds a negative length \(-1 at \[1\]\)"):
        call([3, -1])
    with pytest.raises(RuntimeError, match=fn + r"cache_seqlens\[0\] = 62 plus 3 new tokens is past the cache's "
                       r"capacity of 64 tokens per sequence"):
        call([62, 0], new=3)
    bad = table.clone()
    bad[1, 2] = 12
    with pytest.raises(RuntimeError, match=fn + r"argument 'block_table' has page id 12 at \[1, 2\], outside the "
                       r"cache's 12 pages"):
        call([3, 40], table=bad)
    dense = torch.zeros(2, 32, 2, 64, dtype=torch.float16, device=dev)
    with pytest.raises(RuntimeError, match=fn + r"cache_seqlens\[1\] = 33 plus 0 new tokens"):
        call([0, 33], table=None, cache=dense)
    if dev == "cuda":  # valid values pass, and page ids past the pages a sequence uses are not looked at
        bad[1, 2] = 4
        bad[0, 3] = -7
        lens = torch.tensor([3, 40], dtype=torch.int32, device=dev)
        pages.normal_()
        q.normal_()
        got = flashext.flash_attention_with_kvcache(q, pages, pages, lens, block_table=bad, validate=True)
        assert torch.equal(got, flashext.flash_attention_with_kvcache(q, pages, pages, lens, block_table=bad))


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_bad_input(device):
    q = randn(2, 1, 8, 64, dtype=torch.bfloat16, device=device)
    kc = randn(2, 128, 2, 64, dtype=torch.bfloat16, device=device)
    lens = torch.empty(2, dtype=torch.int32, device=device) if device == "meta" else \
        torch.tensor([1, 2], dtype=torch.int32, device=device)
    fn = r"flashext.flash_attention_with_kvcache: "
    cases = [
        ((q.float(), kc, kc), {}, r"argument 'q' must be float16 or bfloat16"),
        ((q, kc.half(), kc), {}, r"argument 'k_cache' must have the dtype of 'q'"),
        ((q, kc, kc[:, :64]), {}, r"argument 'v_cache' must have the shape of 'k_cache'"),
        ((q[:, :, :5], kc, kc), {}, r"the number of query heads \(5\) must be a multiple"),
        ((q, kc[:1], kc[:1]), {}, r"a dense 'k_cache' must have the batch size of 'q'"),
        ((q, kc, kc), {"k": kc[:, :1]}, r"arguments 'k' and 'v' go together"),
        ((q, kc, kc), {"k": kc[:, :1, :1], "v": kc[:, :1, :1]}, r"argument 'k' must be \(batch, seqlen_new"),
        ((q, kc, kc), {"num_splits": 65}, r"num_splits must be in \[0, 64\]"),
        ((q, kc, kc), {"softcap": -1.0}, r"softcap must be >= 0"),
        ((q, kc, kc), {"block_table": lens.view(2, 1).long()}, r"argument 'block_table' must be an int32 tensor"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(RuntimeError, match=fn + message):
            flashext.flash_attention_with_kvcache(*args, lens, **kwargs)
    message = r"argument 'cache_seqlens' must be a contiguous int32 tensor of shape \[2\]"
    with pytest.raises(RuntimeError, match=fn + message):
        flashext.flash_attention_with_kvcache(q, kc, kc, lens[:1])
    strided = torch.empty(4, dtype=torch.int32, device=device)[::2]
    with pytest.raises(RuntimeError, match=fn + message):
        flashext.flash_attention_with_kvcache(q, kc, kc, strided)
