"""flashext.flash_attention, flash_attention_varlen and scaled_dot_product_attention: semantics,
precision (DESIGN.md's rule: at most 2× plain PyTorch's error in the same dtype, + 1e-5, for the
output and the lse), layouts, masks, ragged batches, numerics at the edges, errors, tracing and
graph capture. GPU tests skip where no CUDA device is visible."""

import pytest
import torch
import torch.nn.functional as F

import flashext
from flashext import reference as ref
from flashext.testing import assert_close, poison_cache
from tests.helpers import CHECK_DEVICES, HALF_DTYPES as DTYPES, HALF_IDS as DTYPE_IDS, at_offset, check_attention
from tests.helpers import cu_seqlens, kernel_names, make_qkv, randn, requires_cuda

SEQLENS = [(1, 1), (1, 300), (113, 203), (128, 217), (255, 1), (512, 256), (1023, 1024), (2048, 2048)]
make, check = make_qkv, check_attention
pytestmark = pytest.mark.usefixtures("kernel_path")  # on Hopper: each test on both kernel paths


# ---- correctness on the GPU ---------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLENS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_seqlens_batches_gqa(dtype, causal, seqlen_q, seqlen_k):
    for batch, heads_kv in ((1, 6), (3, 3), (3, 2), (1, 1)):
        check(*make(batch, seqlen_q, seqlen_k, 6, heads_kv, 128, dtype), causal=causal)


@requires_cuda
@pytest.mark.parametrize("head_dim, seqlen", [(64, 200), (64, 1024), (128, 300), (256, 100), (80, 300)])
def test_each_path_runs_its_own_kernels(kernel_path, head_dim, seqlen):
    # The fixture's "hopper" reaches the Hopper forward at every head dim (D = 80 on its D = 128
    # kernel), also where the default would not (D = 64 under 512 keys), and the Hopper backward at
    # head dims up to 128; "portable" never runs a Hopper kernel. Dense and varlen.
    q, k, v = (t.requires_grad_() for t in make(2, seqlen, seqlen, 4, 2, head_dim, torch.bfloat16))
    lengths = cu_seqlens([seqlen - 5, seqlen + 5])

    def dense():
        out = flashext.flash_attention(q, k, v, causal=True)
        out.backward(torch.randn_like(out))

    def varlen():
        flat = [t.detach().flatten(0, 1).requires_grad_() for t in (q, k, v)]
        out = flashext.flash_attention_varlen(*flat, lengths, lengths, seqlen + 5, seqlen + 5, causal=True)
        out.backward(torch.randn_like(out))

    for run in (dense, varlen):
        names = kernel_names(run)
        forward, backward = "flash_fwd_sm90_kernel" in names, "flash_bwd_sm90_kernel" in names
        if kernel_path == "hopper":
            assert forward, names[:400]
            assert backward == (head_dim <= 128), names[:400]
        else:
            assert not forward and not backward, names[:400]
            assert "flash_fwd_kernel" in names and "flash_bwd_kernel" in names, names[:400]


@requires_cuda
@pytest.mark.parametrize("head_dim", [8, 64, 80, 128, 200, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_head_dims(dtype, head_dim):
    for causal in (False, True):
        check(*make(2, 300, 257, 6, 2, head_dim, dtype), causal=causal)


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 200, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_persistent_blocks(dtype, head_dim):
    # Uniform work (no mask, no window, dense) with about three times the query blocks that fit on
    # the GPU at once: the D = 256 kernel's resident blocks walk several tiles each, requesting the
    # next tile's Q and first K during the current one's last key block (odd lengths: partial tiles;
    # at D = 64 on the Hopper path, 3183 rows: 16 blocks of 192 and a short one of 111 rows).
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seqlen_q = 64 * (3 * 2 * sms // 16 + 1) - 17  # 2 blocks per SM, 16 (batch, head) pairs
    check(*make(2, seqlen_q, 333, 8, 2, head_dim, dtype))
    check(*make(2, seqlen_q, 333, 8, 8, head_dim, dtype), softcap=20.0, softmax_scale=0.3)
    check(*make(2, seqlen_q, seqlen_q, 8, 4, head_dim, dtype, packed=True))  # strided views of one qkv
    # The same call captured in a CUDA graph and replayed.
    q, k, v = make(2, seqlen_q, 333, 8, 2, head_dim, dtype)
    want = flashext.flash_attention(q, k, v)
    graph, out = torch.cuda.CUDAGraph(), None
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = flashext.flash_attention(q, k, v)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@requires_cuda
@pytest.mark.parametrize("kwargs", [{"window_size": (64, 0)}, {"window_size": (-1, 17)}, {"window_size": (3, 3)},
                                    {"window_size": (0, 0)}, {"softcap": 30.0}, {"softcap": 5.0, "causal": True},
                                    {"softcap": 5.0, "window_size": (100, 10)}, {"softmax_scale": 0.02},
                                    {"causal": True, "window_size": (128, -1)},
                                    {"window_size": (2**40, 2**33)}, {"causal": True, "window_size": (2**31, 2**31)}])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_windows_softcap_scale(dtype, kwargs):
    # Windows past int32 must mean "unbounded", not wrap around.
    check(*make(2, 333, 500, 6, 3, 64, dtype), **kwargs)
    check(*make(1, 500, 333, 6, 6, 128, dtype), **kwargs)
    check(*make(1, 300, 700, 4, 2, 256, dtype), **kwargs)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_packed_qkv_and_bhsd_views(dtype):
    q, k, v = make(2, 300, 300, 6, 6, 64, dtype, packed=True)
    assert not q.is_contiguous()
    check(q, k, v, causal=True)
    qt = torch.randn(2, 6, 129, 64, device="cuda").to(dtype)  # (B, H, S, D) memory, viewed as (B, S, H, D)
    kt = torch.randn(2, 2, 77, 64, device="cuda").to(dtype)
    vt = torch.randn(2, 2, 77, 64, device="cuda").to(dtype)
    check(qt.transpose(1, 2), kt.transpose(1, 2), vt.transpose(1, 2))


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128])
def test_broadcast_views(head_dim):
    # k and v expanded over the batch and the heads (zero strides; at D = 128 on Hopper the TMA maps
    # take none, so the FA2-design kernel runs them)
    q = torch.randn(3, 200, 4, head_dim, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(1, 150, 1, head_dim, device="cuda").to(torch.bfloat16).expand(3, -1, 2, -1)
            for _ in range(2))
    assert k.stride(0) == 0 and k.stride(2) == 0
    check(q, k, v, causal=True)
    check(q, k, v, window_size=(30, 5))


@requires_cuda
def test_fully_masked_rows_are_zero_never_nan():
    q, k, v = make(2, 300, 100, 6, 2, 64, torch.bfloat16)  # causal, bottom-right: 200 rows see nothing
    out, lse = check(q, k, v, causal=True)
    assert torch.equal(out[:, :200], torch.zeros_like(out[:, :200]))
    assert torch.isneginf(lse[:, :, :200]).all() and not torch.isnan(out).any()
    out, lse = flashext.flash_attention(q, k[:, :0], v[:, :0], return_lse=True)  # no keys at all
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


@requires_cuda
def test_large_logits_stay_finite():
    q, k, v = make(1, 256, 256, 2, 2, 64, torch.float16, scale=150.0)  # scores of ±1e4 after scaling
    out, lse = check(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("head_dim", [128, 96, 40])  # (96 and 40: on the next kernel up, O copied out)
def test_varlen(dtype, head_dim):
    lengths_q, lengths_k = [0, 1, 7, 300, 129, 1], [5, 0, 7, 250, 400, 1]
    cu_q = torch.tensor([0] + torch.tensor(lengths_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lengths_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lengths_q), 6, head_dim, device="cuda").to(dtype)
    k = torch.randn(sum(lengths_k), 2, head_dim, device="cuda").to(dtype)
    v = torch.randn(sum(lengths_k), 2, head_dim, device="cuda").to(dtype)
    for causal in (False, True):
        poison_cache(q)
        out, lse = flashext.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                                   causal=causal, return_lse=True)
        want, want_lse = ref.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, return_lse=True)
        base, base_lse = ref.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, return_lse=True, compute_dtype=dtype)
        assert_close("varlen out", out, want, base)
        assert_close("varlen lse", lse, want_lse, base_lse.float())


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_varlen_never_reads_past_its_sequences(head_dim):
    # NaN in the key rows no sequence covers, and inf in the first sequence's values: a sequence's
    # last key block reaches past its end (into the next sequence's rows, or the uncovered tail),
    # and its output must not see them (P is 0 there, but 0 · NaN is not). On Hopper D = 128 and
    # 256 run the Hopper kernel and D = 64 (under 512 keys) the FA2-design one (the C++ test covers
    # Hopper varlen at every D).
    lengths_q, lengths_k = [37, 100, 5], [50, 70, 3]
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    q = randn(sum(lengths_q), 4, head_dim, dtype=torch.bfloat16)
    k, v = (randn(sum(lengths_k) + 60, 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    k[sum(lengths_k):], v[sum(lengths_k):] = float("nan"), float("nan")
    v[:50] = float("inf")  # only the first sequence reads these
    for kwargs in ({}, {"causal": True}):
        out, lse = flashext.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                                   return_lse=True, **kwargs)
        later = slice(37, None)  # the second and third sequences: finite, and right
        covered_k, covered_v = k[: sum(lengths_k)], v[: sum(lengths_k)]
        want, want_lse = ref.attention_varlen(q, covered_k, covered_v, cu_q, cu_k, return_lse=True, **kwargs)
        base, base_lse = ref.attention_varlen(q, covered_k, covered_v, cu_q, cu_k, return_lse=True,
                                              compute_dtype=torch.bfloat16, **kwargs)
        assert torch.isfinite(out[later]).all(), kwargs
        assert_close(f"varlen past the sequences out {kwargs}", out[later], want[later], base[later])
        assert_close(f"varlen past the sequences lse {kwargs}", lse[:, later], want_lse[:, later],
                     base_lse[:, later].float())


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128])
def test_varlen_with_no_query_rows_is_a_no_op(head_dim):
    # max_seqlen_q = 0 (every sequence empty, the rows uncovered): zeros and lse −inf, on either kernel
    q = randn(5, 4, head_dim, dtype=torch.bfloat16)
    k = randn(30, 2, head_dim, dtype=torch.bfloat16)
    out, lse = flashext.flash_attention_varlen(q, k, k, cu_seqlens([0, 0]), cu_seqlens([10, 20]), 0, 20,
                                               return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


@requires_cuda
def test_varlen_rows_no_sequence_covers_are_zero():
    # Rows past cu_seqlens_q[-1] (and every row of an empty batch) are not computed: 0, lse −inf.
    q = torch.randn(40, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(30, 2, 64, device="cuda", dtype=torch.bfloat16)
    cu_q, cu_k = cu_seqlens([25]), cu_seqlens([30])
    poison_cache(q)
    out, lse = flashext.flash_attention_varlen(q, k, k, cu_q, cu_k, 25, 30, return_lse=True)
    assert torch.equal(out[25:], torch.zeros_like(out[25:])) and torch.isneginf(lse[:, 25:]).all()
    assert_close("covered rows", out[:25], ref.attention_varlen(q[:25], k, k, cu_q, cu_k),
                 ref.attention_varlen(q[:25], k, k, cu_q, cu_k, compute_dtype=torch.bfloat16))
    poison_cache(q)
    out, lse = flashext.flash_attention_varlen(q, k, k, cu_seqlens([]), cu_seqlens([]), 0, 0, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


@requires_cuda
def test_varlen_offsets_are_validated():
    q = torch.randn(10, 2, 64, device="cuda", dtype=torch.float16)
    good = torch.tensor([0, 4, 10], dtype=torch.int32, device="cuda")
    for bad, message in [(torch.tensor([0, 6, 4], dtype=torch.int32, device="cuda"), "non-decreasing"),
                         (torch.tensor([0, 4, 11], dtype=torch.int32, device="cuda"), "ends past"),
                         (torch.tensor([1, 4, 10], dtype=torch.int32, device="cuda"), "must start at 0")]:
        with pytest.raises(RuntimeError, match=message):
            flashext.flash_attention_varlen(q, q, q, bad, good, 10, 10)
    with pytest.raises(RuntimeError, match="longer than its max_seqlen"):
        flashext.flash_attention_varlen(q, q, q, good, good, 5, 10)
    # without validation the kernel clamps: no out-of-bounds access, whatever the offsets
    flashext.flash_attention_varlen(q, q, q, torch.tensor([0, 60, 4], dtype=torch.int32, device="cuda"), good, 10, 10,
                                    validate=False)
    torch.cuda.synchronize()


@requires_cuda
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(128, 128), (100, 300), (300, 100)])
def test_sdpa_compatible_entry_point(seqlen_q, seqlen_k):
    query = torch.randn(2, 8, seqlen_q, 64, device="cuda", dtype=torch.bfloat16)
    key = torch.randn(2, 2, seqlen_k, 64, device="cuda", dtype=torch.bfloat16)
    value = torch.randn(2, 2, seqlen_k, 64, device="cuda", dtype=torch.bfloat16)
    for is_causal in (False, True):
        got = flashext.scaled_dot_product_attention(query, key, value, is_causal=is_causal, enable_gqa=True)
        # torch's own semantics (top-left causal), computed in fp64 with the math backend
        want = F.scaled_dot_product_attention(query.double(), key.double().repeat_interleave(4, 1),
                                              value.double().repeat_interleave(4, 1), is_causal=is_causal)
        base = F.scaled_dot_product_attention(query, key.repeat_interleave(4, 1), value.repeat_interleave(4, 1),
                                              is_causal=is_causal)
        rows = torch.isfinite(want).all(-1)  # torch gives NaN for a row that sees no key
        assert_close("sdpa", got[rows], want[rows], base[rows])


@requires_cuda
def test_memory_is_linear_in_sequence_length():
    q, k, v = make(1, 65536, 65536, 1, 1, 128, torch.float16)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = flashext.flash_attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra <= 32 * 2**20, f"peak extra memory {extra / 2**20:.1f} MiB"
    del out


# ---- tracing, graphs, modes ----------------------------------------------------------------------


@requires_cuda
def test_opcheck():
    q, k, v = make(2, 37, 45, 4, 2, 64, torch.bfloat16)
    torch.library.opcheck(torch.ops.flashext.flash_attn_fwd.default, (q, k, v, True, None, -1, -1, 0.0, False))
    cu = torch.tensor([0, 10, 37], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 20, 45], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.flashext.flash_attn_varlen_fwd.default,
                          (q[0], k[0], v[0], cu, cu_k, 27, 25, False, None, -1, -1, 0.0))


@requires_cuda
def test_torch_compile_fullgraph_and_cuda_graph():
    q, k, v = make(2, 200, 200, 4, 2, 64, torch.float16)
    compiled = torch.compile(lambda q, k, v: flashext.flash_attention(q, k, v, causal=True) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), flashext.flash_attention(q, k, v, causal=True) * 2)
    static = [t.clone() for t in (q, k, v)]
    flashext.flash_attention(*static)  # warm up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashext.flash_attention(*static)
    fresh = make(2, 200, 200, 4, 2, 64, torch.float16)
    for s, f in zip(static, fresh):
        s.copy_(f)
    graph.replay()
    torch.testing.assert_close(out, flashext.flash_attention(*fresh), rtol=0, atol=0)


@requires_cuda
def test_inference_mode():
    q, k, v = make(1, 64, 64, 2, 2, 64, torch.bfloat16)
    with torch.inference_mode():
        out = flashext.flash_attention(q, k, v)
    assert not out.requires_grad
    torch.testing.assert_close(out, flashext.flash_attention(q, k, v), rtol=0, atol=0)


# ---- numerics at the edges ------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_huge_logits_stay_finite_and_match(dtype, head_dim):
    # q and k scaled ×100: scores of about 1e4·√D, far past fp16's range, so PyTorch's own attention
    # in that dtype (the rule's usual baseline) overflows; the baseline is PyTorch's fused kernels in
    # the input dtype instead, which keep fp32 scores as ours does: SDPA's default (cuDNN on Hopper)
    # and its FlashAttention-2 kernel, the larger of their two errors. The fp32 rounding of scores
    # this large dominates every kernel's error and each maximum over the elements is one draw of it
    # (H200, 150 draws of causal 256 × 256 fp16: ours over that baseline's median 1.00 at D = 64 and
    # 0.87 at 128 on both paths, but past 2x in 1-4 draws each, up to 2.0-4.7x): the allowance gets
    # one unit in the last place of the output's largest magnitude on top, the rounding step of O.
    for causal, (seqlen_q, seqlen_k) in ((True, (256, 256)), (True, (1000, 1000)), (False, (300, 700)),
                                         (True, (100, 300)), (False, (1, 129))):
        q, k, v = make(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype, scale=100.0, k_scale=100.0)
        poison_cache(q)
        out, lse = flashext.flash_attention(q, k, v, causal=causal, return_lse=True)
        want, want_lse = ref.attention(q, k, v, causal=causal, return_lse=True)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all(), f"causal={causal} {seqlen_q}x{seqlen_k}"
        if seqlen_q == seqlen_k or not causal:
            qt, kt, vt = q.transpose(1, 2), k.repeat_interleave(2, 2).transpose(1, 2), v.repeat_interleave(2, 2).transpose(1, 2)
            default = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
            flash, base_lse = torch.ops.aten._scaled_dot_product_flash_attention(qt, kt, vt, 0.0, causal)[:2]
            base = max((default, flash.transpose(1, 2)), key=lambda b: (b.double() - want).abs().max().item())
            ulp = torch.finfo(dtype).eps * 2.0 ** torch.frexp(want.abs().max())[1].item() / 2
            assert_close(f"x100 causal={causal} {seqlen_q}x{seqlen_k}", out, want, base, atol=ulp)
            # lse ~ 1e4-1e5 here, and the fp32 accumulation of the raw scores dominates its error:
            # held to 2× that of SDPA's FlashAttention-2 kernel (which returns the lse), same dtype.
            assert_close(f"x100 lse causal={causal} {seqlen_q}x{seqlen_k}", lse, want_lse, base_lse)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_stays_in_its_batch_entry(dtype):
    q, k, v = make(3, 200, 200, 4, 2, 64, dtype)
    q[1, 7, 2, 5] = float("nan")
    k[1, 150, 0, 3] = float("nan")
    for causal in (False, True):
        out = flashext.flash_attention(q, k, v, causal=causal)
        for b in (0, 2):
            assert_close(f"batch {b}", out[b:b + 1], ref.attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], causal=causal),
                         ref.attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], causal=causal, compute_dtype=dtype))
        assert torch.isnan(out[1]).any()


@requires_cuda
@pytest.mark.parametrize("seqlen", [1, 17, 127, 129, 1000])
def test_lengths_that_are_not_tile_multiples(seqlen):
    for head_dim in (64, 128, 256):
        check(*make(2, seqlen, seqlen, 4, 1, head_dim, torch.bfloat16), causal=True)
        check(*make(1, seqlen, 129, 2, 2, head_dim, torch.float16))


@requires_cuda
def test_empty_batch_and_zero_lengths():
    for batch, seqlen_q, seqlen_k in ((0, 16, 16), (2, 0, 16), (2, 16, 0), (2, 0, 0)):
        q, k, v = make(batch, seqlen_q, seqlen_k, 4, 2, 64, torch.float16)
        out, lse = flashext.flash_attention(q, k, v, return_lse=True)
        assert out.shape == q.shape and lse.shape == (batch, 4, seqlen_q)
        if seqlen_k == 0:  # queries that see no key: 0 and −inf
            assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    q, k, v = make(1, 0, 0, 4, 2, 64, torch.float16)
    out = flashext.flash_attention_varlen(q[0], k[0], v[0], cu_seqlens([]), cu_seqlens([]), 0, 0)
    assert out.shape == (0, 4, 64)


@requires_cuda
def test_inputs_are_never_written():
    q, k, v = make(2, 300, 333, 8, 2, 128, torch.bfloat16)
    before = [t.clone() for t in (q, k, v)]
    flashext.flash_attention(q, k, v, causal=True)
    flashext.flash_attention(q, k, v, window_size=(50, 7), softcap=10.0)
    flashext.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))


@requires_cuda
def test_eight_streams_at_once_match_one_stream():
    problems = [make(2, 100 + 37 * i, 200 + 11 * i, 8, 2 ** (i % 4), 64 * (1 + i % 2), torch.float16)
                for i in range(8)]
    want = [flashext.flash_attention(*p, causal=i % 2 == 1) for i, p in enumerate(problems)]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in problems]
    got = []
    for i, (stream, p) in enumerate(zip(streams, problems)):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            got.append(flashext.flash_attention(*p, causal=i % 2 == 1))
    for stream in streams:
        torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@requires_cuda
@pytest.mark.parametrize("offset", [1, 2, 3, 4, 5, 8])
def test_any_start_alignment(offset):
    # Views that start `offset` elements into their storage: contiguous, but not 16-byte aligned
    # (they are copied before the launch), dense, varlen and the SDPA entry alike.
    q, k, v = (at_offset(t, offset) for t in make(2, 100, 77, 4, 2, 64, torch.float16))
    check(q, k, v, causal=True)
    cu_q, cu_k = cu_seqlens([100, 100]), cu_seqlens([77, 77])
    flat = [t.reshape(-1, t.shape[2], t.shape[3]) for t in (q, k, v)]
    flat = [at_offset(t, offset) for t in flat]
    out = flashext.flash_attention_varlen(*flat, cu_q, cu_k, 100, 77)
    want = ref.attention_varlen(*flat, cu_q, cu_k)
    assert_close("varlen at an offset", out, want, ref.attention_varlen(*flat, cu_q, cu_k, compute_dtype=torch.float16))
    got = flashext.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    assert_close("sdpa at an offset", got.transpose(1, 2), ref.attention(q, k, v),
                 ref.attention(q, k, v, compute_dtype=torch.float16))


@requires_cuda
@pytest.mark.large
def test_past_2_to_the_31_elements():
    # 2^31 + a row of elements in q, k and v each (4 GiB apiece): 64-bit offsets throughout. Only a
    # few rows at the far end are compared (the reference materialises S × S).
    seqlen, heads, head_dim = 2**31 // (16 * 128) + 1, 16, 128  # B = 1
    q, k, v = make(1, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16)
    assert q.numel() > 2**31
    window = (1000, 0)  # causal with a window: each query sees its last 1001 keys
    out = flashext.flash_attention(q, k, v, causal=True, window_size=window)
    rows = slice(seqlen - 129, seqlen)
    keys = slice(seqlen - 129 - 1000, seqlen)
    want = ref.attention(q[:, rows], k[:, keys], v[:, keys], causal=True, window_size=window)
    base = ref.attention(q[:, rows], k[:, keys], v[:, keys], causal=True, window_size=window, compute_dtype=torch.bfloat16)
    assert_close("past 2^31", out[:, rows], want, base)


# ---- bad input: refused before any launch, with the same words on CUDA and in tracing (meta) ----


def test_cpu_tensors_are_refused():
    q = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"flashext.flash_attention: argument 'q' must be a CUDA tensor"):
        flashext.flash_attention(q, q, q)


def test_sdpa_unsupported_arguments_are_refused():
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(NotImplementedError, match="attn_mask is not supported"):
        flashext.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout_p must be 0.0"):
        flashext.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(RuntimeError, match="enable_gqa=True"):
        flashext.scaled_dot_product_attention(q, q[:, :1], q[:, :1])


def test_use_hopper_kernels_round_trips():
    # the switch itself (no GPU needed): returns the previous setting, and restoring it restores it
    before = flashext.use_hopper_kernels(False)
    try:
        assert flashext.use_hopper_kernels(True) is False
        assert flashext.use_hopper_kernels("always") is True
        assert flashext.use_hopper_kernels(True) == "always"
        assert flashext.use_hopper_kernels(True) is True
        for bad in ("yes", 2, None):
            with pytest.raises(ValueError, match="use_hopper_kernels: enabled"):
                flashext.use_hopper_kernels(bad)
        assert flashext.use_hopper_kernels(True) is True  # a refused value changed nothing
    finally:
        flashext.use_hopper_kernels(before)


def test_output_shapes_on_meta():
    q = torch.empty(2, 5, 6, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 9, 2, 64, device="meta", dtype=torch.bfloat16)
    out, lse = torch.ops.flashext.flash_attn_fwd(q, k, k)
    assert out.shape == q.shape and lse.shape == (2, 6, 5) and lse.dtype == torch.float32
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    out, lse = torch.ops.flashext.flash_attn_varlen_fwd(q[0], k[0], k[0], cu, cu, 5, 9)
    assert out.shape == (5, 6, 64) and lse.shape == (6, 5)


def test_symbolic_shapes_trace_through_the_checks():
    # torch.compile with dynamic shapes reaches the Meta registration with symbolic sizes.
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(q, k, v):
        return flashext.flash_attention(q, k, v, causal=True, window_size=(17, -1))

    graph = make_fx(f, tracing_mode="symbolic")(torch.randn(2, 33, 4, 64).half(), torch.randn(2, 40, 2, 64).half(),
                                                torch.randn(2, 40, 2, 64).half())
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert "flashext.flash_attn_fwd.default" in targets


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_bad_input(device):
    q, k, v = make(2, 16, 16, 6, 2, 64, torch.bfloat16, device=device)
    fn = r"flashext.flash_attention: "
    cases = [
        ((q.float(), k.float(), v.float()), r"argument 'q' must be float16 or bfloat16, got Float"),
        ((q.double(), k.double(), v.double()), r"argument 'q' must be float16 or bfloat16, got Double"),
        ((q, k.half(), v), r"argument 'k' must have the dtype of 'q'"),
        ((q, torch.empty(k.shape, dtype=k.dtype, device="cpu"), v), r"argument 'k' must be on the same device as 'q'"),
        ((q, k, v[:, :8]), r"argument 'v' must have the shape of 'k'"),
        ((q[:1], k, v), r"arguments 'q' and 'k' must have the same batch size, got 1 and 2"),
        ((q[..., :60], k[..., :60], v[..., :60]), r"head dim must be a multiple of 8"),
        ((q[..., :7], k[..., :7], v[..., :7]), r"head dim must be a multiple of 8 between 8 and 256, got 7"),
        ((q[:, :, :5], k, v), r"the number of query heads \(5\) must be a multiple of the number of key/value heads \(2\)"),
        ((q[0], k[0], v[0]), r"argument 'q' must be 4-D"),
        ((randn(2, 16, 6, 264, dtype=torch.bfloat16, device=device),) * 3,
         r"head dim must be a multiple of 8 between 8 and 256"),
        ((q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), r"argument 'q' must have a contiguous last dimension"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=fn + message):
            flashext.flash_attention(*args)
    for kwargs, message in (({"window_size": (-2, 0)}, "window_size entries must be >= -1"),
                            ({"softcap": -1.0}, "softcap must be >= 0"),
                            ({"softcap": float("nan")}, "softcap must be >= 0"),
                            ({"softmax_scale": float("inf")}, "softmax_scale must be finite and > 0"),
                            ({"softmax_scale": 0.0}, "softmax_scale must be finite and > 0"),
                            ({"softmax_scale": -0.125}, "softmax_scale must be finite and > 0")):
        with pytest.raises(RuntimeError, match=fn + message):
            flashext.flash_attention(q, k, v, **kwargs)
    cu = torch.empty(2, dtype=torch.int32, device="meta") if device == "meta" else cu_seqlens([16])
    fnv = r"flashext.flash_attention_varlen: "
    with pytest.raises(RuntimeError, match=fnv + r"argument 'cu_seqlens_q' must be int32"):
        flashext.flash_attention_varlen(q[0], k[0], v[0], cu.long(), cu, 16, 16, validate=False)
    with pytest.raises(RuntimeError, match=fnv + r"arguments 'cu_seqlens_q' and 'cu_seqlens_k' must have the same "
                       r"length \(batch \+ 1\), got 2 and 3"):
        flashext.flash_attention_varlen(q[0], k[0], v[0], cu, torch.empty(3, dtype=torch.int32, device=device), 16, 16,
                                        validate=False)
    with pytest.raises(RuntimeError, match=fnv + r"argument 'cu_seqlens_k' must be on the device of 'q'"):
        flashext.flash_attention_varlen(q[0], k[0], v[0], cu, torch.zeros(2, dtype=torch.int32), 16, 16, validate=False)
    with pytest.raises(RuntimeError, match=fnv + r"max_seqlen_q and max_seqlen_k must be in \[0, 2\^29\]"):
        flashext.flash_attention_varlen(q[0], k[0], v[0], cu, cu, -1, 16, validate=False)
    with pytest.raises(RuntimeError, match=fnv + r"max_seqlen_q and max_seqlen_k must be in \[0, 2\^29\]"):
        flashext.flash_attention_varlen(q[0], k[0], v[0], cu, cu, 16, 2**29 + 1, validate=False)


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_backward_bad_input(device):
    # The backward ops (autograd's) check what the forward checks, plus dout, out and lse.
    q, k, v = make(2, 16, 16, 6, 2, 64, torch.bfloat16, device=device)
    out = randn(*q.shape, dtype=q.dtype, device=device)
    lse = randn(2, 6, 16, device=device)
    bwd, fn = torch.ops.flashext.flash_attn_bwd, r"flashext.flash_attention \(backward\): "
    for args, message in (
            ((out, q, k, v, out, lse, None), None),
            ((out, q[:, :, :5], k, v, out, lse, None), r"the number of query heads \(5\)"),
            ((out[:, :8], q, k, v, out, lse, None), r"argument 'dout' must have the shape of 'q'"),
            ((out, q, k, v, out.half(), lse, None), r"argument 'out' must have the dtype of 'q'"),
            ((out, q, k, v, out, lse[:, :, :8], None), r"argument 'lse' must have shape \[2, 6, 16\]"),
            ((out, q, k, v, out, lse.double(), None), r"argument 'lse' must be float32"),
            ((out, q, k, v, out, lse, lse[:1]), r"argument 'dlse' must have shape \[2, 6, 16\]")):
        if message is None:
            dq, dk, dv = bwd(*args)
            assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
            continue
        with pytest.raises(RuntimeError, match=fn + message):
            bwd(*args)
    cu = torch.empty(2, dtype=torch.int32, device="meta") if device == "meta" else cu_seqlens([16])
    with pytest.raises(RuntimeError, match=r"flashext.flash_attention_varlen \(backward\): argument 'lse' must have "
                                           r"shape \[6, 16\]"):
        torch.ops.flashext.flash_attn_varlen_bwd(out[0], q[0], k[0], v[0], out[0], lse[0, :, :3], None, cu, cu, 16, 16)


def test_lengths_past_the_kernels_int_bounds_are_refused():
    # The kernel's row and key-block bounds are 32-bit; lengths up to 2^29 keep every sum below 2^31.
    q = torch.empty(1, 16, 1, 8, device="meta", dtype=torch.float16)
    k = torch.empty(1, 2**29 + 1, 1, 8, device="meta", dtype=torch.float16)
    with pytest.raises(RuntimeError, match=r"flashext.flash_attention: sequence lengths must be at most 2\^29"):
        flashext.flash_attention(q, k, k)
    flashext.flash_attention(q, k[:, : 2**29], k[:, : 2**29])  # the limit itself is fine


def test_output_layouts():
    """Outputs are contiguous, or with like_inputs in the inputs' layouts (empty_like), as PyTorch's
    own kernels return them (what SDPA's callers and compiled graphs expect); meta suffices."""
    q, k, v = (torch.empty(2, 4, 96, 64, dtype=torch.bfloat16, device="meta").transpose(1, 2) for _ in range(3))
    ops = torch.ops.flashext
    out, _ = ops.flash_attn_fwd(q, k, v)
    assert out.is_contiguous()
    out, lse = ops.flash_attn_fwd(q, k, v, like_inputs=True)
    assert out.stride() == torch.empty_like(q).stride() != out.contiguous().stride()
    grads = ops.flash_attn_bwd(out, q, k, v, out, lse, None, like_inputs=True)
    assert [g.stride() for g in grads] == [torch.empty_like(t).stride() for t in (q, k, v)]
    assert all(g.is_contiguous() for g in ops.flash_attn_bwd(out, q, k, v, out, lse, None))
    # flashext.scaled_dot_product_attention returns (B, H, S, D) contiguous, as torch's does
    query = torch.empty(2, 4, 96, 64, dtype=torch.bfloat16, device="meta")
    assert flashext.scaled_dot_product_attention(query, query, query).is_contiguous()


@requires_cuda
def test_like_inputs_changes_only_the_layout():
    """like_inputs writes the same values into the inputs' layouts, forward and backward."""
    q, k, v = (randn(2, 6, 200, 64, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    ops = torch.ops.flashext
    out, lse = ops.flash_attn_fwd(q, k, v, True)
    out_like, lse_like = ops.flash_attn_fwd(q, k, v, True, like_inputs=True)
    assert out_like.stride() == torch.empty_like(q).stride()
    assert torch.equal(out_like, out) and torch.equal(lse_like, lse)
    dout = randn(2, 200, 6, 64, dtype=torch.bfloat16)
    plain = ops.flash_attn_bwd(dout, q, k, v, out, lse, None, True, deterministic=True)
    like = ops.flash_attn_bwd(dout, q, k, v, out, lse, None, True, deterministic=True, like_inputs=True)
    for a, b, t in zip(plain, like, (q, k, v)):
        assert b.stride() == torch.empty_like(t).stride() and torch.equal(a, b)
