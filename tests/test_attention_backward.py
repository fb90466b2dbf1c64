"""flashext attention gradients (dq, dk, dv) against flashext.reference.attention_backward: every
mask and option of the forward, GQA, ragged batches, head dims 8 … 256, views, the lse's own
gradient, determinism, opcheck, torch.compile and CUDA graphs (GPU).

Rule (DESIGN.md): each gradient within 3× the error of plain PyTorch doing the backward in the
inputs' dtype, + 1e-5, against float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashext
from flashext import reference as ref
from flashext.testing import GRADIENT_FACTOR, assert_close, poison_cache

from .helpers import HALF_DTYPES, HALF_IDS, cu_seqlens, make_qkv, randn, requires_cuda

# on Hopper each test runs on both forward paths (the backward reads the lse of either)
pytestmark = [requires_cuda, pytest.mark.usefixtures("kernel_path")]


def grads(fn, q, k, v, dout, dlse=None):
    """(dq, dk, dv) of fn(q, k, v) -> out (or (out, lse)) for the output gradient dout (and dlse),
    computed into poisoned memory."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    result = fn(q, k, v)
    out, lse = result if isinstance(result, tuple) else (result, None)
    loss = (out.float() * dout.float()).sum()
    if dlse is not None:
        loss = loss + (lse * dlse).sum()
    poison_cache(q, k, v)
    return torch.autograd.grad(loss, (q, k, v))


def check_grads(q, k, v, dlse=False, deterministic=False, **kwargs):
    """flash_attention's gradients against the reference; returns them."""
    dout = randn(*q.shape, dtype=q.dtype)
    lse_grad = randn(q.shape[0], q.shape[2], q.shape[1]) if dlse else None
    got = grads(lambda q, k, v: flashext.flash_attention(q, k, v, return_lse=dlse, deterministic=deterministic,
                                                         **kwargs), q, k, v, dout, lse_grad)
    want = ref.attention_backward(dout, q, k, v, dlse=lse_grad, **kwargs)
    base = ref.attention_backward(dout, q, k, v, dlse=lse_grad, compute_dtype=q.dtype, **kwargs)
    for name, g, w, b, t in zip(("dq", "dk", "dv"), got, want, base, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype, name
        assert_close(f"{name} {tuple(q.shape)} {tuple(k.shape)} {kwargs}", g, w, b, factor=GRADIENT_FACTOR)
    return got


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(128, 128), (113, 203), (203, 113), (1, 300), (300, 1), (1000, 1000)])
def test_seqlens_gqa(dtype, causal, seqlen_q, seqlen_k):
    check_grads(*make_qkv(2, seqlen_q, seqlen_k, 4, 2, 64, dtype), causal=causal)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("head_dim", [40, 64, 128, 256])
def test_one_key_gives_exact_zero_ds(dtype, head_dim):
    # Every row sees one key: P = 1 and O is that key's V row, so dP = dO · v = D and dS = 0; dq
    # and dk are exactly 0 (as PyTorch's are), however many query rows a key's group sums.
    # (On the Hopper path the exact zero also needs wgmma's dP summed in mma.sync's k order: it is on
    # the H100 and H200, which PTX does not promise.) Varlen too: packed 64-row blocks of the
    # preprocess that span both sequences.
    q, k, v = make_qkv(2, 300, 1, 8, 2, head_dim, dtype)
    dout = randn(*q.shape, dtype=dtype)
    dq, dk, dv = grads(lambda q, k, v: flashext.flash_attention(q, k, v), q, k, v, dout)
    assert dq.abs().max().item() == 0 and dk.abs().max().item() == 0, (dq.abs().max(), dk.abs().max())
    assert dv.abs().max().item() > 0
    cu_q, cu_k = cu_seqlens([300, 77]), cu_seqlens([1, 1])
    q = randn(377, 8, head_dim, dtype=dtype)
    k, v = (randn(2, 2, head_dim, dtype=dtype) for _ in range(2))
    dq, dk, dv = grads(lambda q, k, v: flashext.flash_attention_varlen(q, k, v, cu_q, cu_k, 300, 1), q, k, v,
                       randn(377, 8, head_dim, dtype=dtype))
    assert dq.abs().max().item() == 0 and dk.abs().max().item() == 0, (dq.abs().max(), dk.abs().max())
    assert dv.abs().max().item() > 0


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("head_dim", [8, 32, 64, 72, 96, 128, 160, 200, 256])
def test_head_dims(dtype, head_dim):
    check_grads(*make_qkv(2, 150, 177, 4, 1, head_dim, dtype), causal=True)
    check_grads(*make_qkv(1, 129, 129, 2, 2, head_dim, dtype))


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("kwargs", [
    {"window_size": (64, 0)}, {"window_size": (32, 17)}, {"window_size": (-1, 40)}, {"window_size": (100, -1)},
    {"softcap": 30.0}, {"softcap": 5.0, "causal": True}, {"softmax_scale": 0.05}, {"causal": True, "window_size": (7, -1)}])
def test_windows_softcap_scale(dtype, kwargs):
    for head_dim in (64, 128, 256):
        check_grads(*make_qkv(2, 300, 257, 4, 2, head_dim, dtype), **kwargs)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
def test_gradients_through_the_lse(dtype):
    for head_dim, causal in ((64, True), (128, False), (256, True)):
        check_grads(*make_qkv(2, 200, 180, 4, 2, head_dim, dtype), dlse=True, causal=causal)


def test_gqa_and_mqa_sum_over_the_group():
    for heads_kv in (8, 4, 1):
        check_grads(*make_qkv(1, 257, 190, 8, heads_kv, 128, torch.bfloat16), causal=True)


def test_packed_views_and_bhsd_layouts():
    q, k, v = make_qkv(2, 190, 190, 4, 4, 64, torch.float16, packed=True)
    assert not q.is_contiguous()
    dq, dk, dv = check_grads(q, k, v, causal=True)
    assert dq.shape == q.shape
    # the SDPA entry on (B, H, S, D) views, top-left causal, against SDPA's own math in fp64
    q, k, v = (t.transpose(1, 2) for t in make_qkv(2, 150, 230, 4, 2, 128, torch.bfloat16))
    dout = randn(*q.shape, dtype=q.dtype)
    got = grads(lambda q, k, v: flashext.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                q, k, v, dout)
    exact = grads(lambda q, k, v: F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                                                 enable_gqa=True), q, k, v, dout)
    base = grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), q, k, v,
                 dout)
    for name, g, w, b in zip(("dq", "dk", "dv"), got, exact, base):
        assert_close(f"sdpa {name}", g, w, b, factor=GRADIENT_FACTOR)


def test_rows_that_see_no_key_have_zero_gradients():
    # bottom-right causal with Sq > Sk: the first Sq - Sk queries see no key.
    q, k, v = make_qkv(2, 300, 100, 4, 2, 64, torch.bfloat16)
    dq, dk, dv = check_grads(q, k, v, causal=True)
    assert (dq[:, :200] == 0).all()
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all()


@pytest.mark.parametrize("seqlen", [1, 17, 127, 129, 1000])
def test_lengths_that_are_not_tile_multiples(seqlen):
    for head_dim in (64, 128, 256):
        check_grads(*make_qkv(2, seqlen, seqlen, 2, 1, head_dim, torch.bfloat16), causal=True)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
def test_varlen(dtype):
    lengths_q, lengths_k = [0, 1, 130, 17, 300, 64], [5, 1, 130, 0, 257, 200]
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    # (40 and 96: on Hopper, the D = 64 and 128 kernels, whose dK / dV stores at sequence ends must
    # keep to the tensors' columns)
    for head_dim, kwargs in ((64, {"causal": True}), (128, {}), (256, {"window_size": (40, 3)}),
                             (40, {"causal": True}), (96, {})):
        q = randn(sum(lengths_q), 4, head_dim, dtype=dtype)
        k = randn(sum(lengths_k), 2, head_dim, dtype=dtype)
        v = randn(sum(lengths_k), 2, head_dim, dtype=dtype)
        dout = randn(*q.shape, dtype=dtype)
        got = grads(lambda q, k, v: flashext.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q),
                                                                    max(lengths_k), **kwargs), q, k, v, dout)
        want = ref.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, **kwargs)
        base = ref.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, compute_dtype=dtype, **kwargs)
        for name, g, w, b in zip(("dq", "dk", "dv"), got, want, base):
            assert_close(f"varlen {name} {head_dim} {kwargs}", g, w, b, factor=GRADIENT_FACTOR)


def test_varlen_rows_no_sequence_covers_get_zero_gradients():
    cu = cu_seqlens([40, 30])  # the packed tensors hold 100 rows; the last 30 belong to none
    q, k, v = (randn(100, 2, 64, dtype=torch.float16) for _ in range(3))
    dq, dk, dv = grads(lambda q, k, v: flashext.flash_attention_varlen(q, k, v, cu, cu, 40, 40), q, k, v,
                       randn(100, 2, 64, dtype=torch.float16))
    for g in (dq, dk, dv):
        assert (g[70:] == 0).all() and torch.isfinite(g).all()


@pytest.mark.parametrize("head_dim", [64, 128])  # (on Hopper: the Hopper backward's two tile shapes)
@pytest.mark.parametrize("lengths", [[40, 30], [100, 200]])
def test_varlen_rows_no_sequence_covers_may_hold_nan(lengths, head_dim):
    # A padded packed buffer: the rows past the last sequence hold any bits. Blocks reaching past
    # a sequence read them; nothing of them may reach the sequences' gradients (0 · NaN is NaN).
    # ([100, 200]: the last sequence's second key block and its upper half of keys reach the NaN.)
    cu, total = cu_seqlens(lengths), sum(lengths)
    q, k, v, dout = (randn(total + 60, 2, head_dim, dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v, dout):
        t[total:] = float("nan")
    call = lambda q, k, v: flashext.flash_attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=True)
    dq, dk, dv = grads(call, q, k, v, dout)
    rows = slice(0, total)
    want = ref.attention_varlen_backward(dout[rows], q[rows], k[rows], v[rows], cu, cu, causal=True)
    base = ref.attention_varlen_backward(dout[rows], q[rows], k[rows], v[rows], cu, cu, causal=True,
                                         compute_dtype=torch.bfloat16)
    for name, g, w, b in zip(("dq", "dk", "dv"), (dq, dk, dv), want, base):
        assert (g[total:] == 0).all(), name
        assert_close(f"varlen, NaN past the sequences: {name}", g[rows], w, b, factor=GRADIENT_FACTOR)


@pytest.mark.parametrize("head_dim", [64, 128, 256])  # 128-, 64- and 128-row query steps
def test_deterministic_is_bitwise_reproducible(head_dim):
    q, k, v = make_qkv(2, 1000, 1000, 4, 2, head_dim, torch.bfloat16)
    dout = randn(*q.shape, dtype=q.dtype)
    for kwargs in ({"causal": True}, {"window_size": (200, 50)}, {}):
        fn = lambda q, k, v: flashext.flash_attention(q, k, v, deterministic=True, **kwargs)  # noqa: E731
        first = grads(fn, q, k, v, dout)
        for _ in range(19):
            for a, b in zip(first, grads(fn, q, k, v, dout)):
                assert torch.equal(a, b), kwargs
        check_grads(q, k, v, deterministic=True, **kwargs)
    torch.use_deterministic_algorithms(True)
    try:
        fn = lambda q, k, v: flashext.flash_attention(q, k, v, causal=True)  # noqa: E731
        first = grads(fn, q, k, v, dout)
        for _ in range(5):
            assert all(torch.equal(a, b) for a, b in zip(first, grads(fn, q, k, v, dout)))
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_deterministic_varlen_is_bitwise_reproducible(head_dim):
    lengths_q, lengths_k = [7, 700, 300], [9, 900, 250]
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    q = randn(sum(lengths_q), 4, head_dim, dtype=torch.bfloat16)
    k, v = (randn(sum(lengths_k), 2, head_dim, dtype=torch.bfloat16) for _ in range(2))
    dout = randn(*q.shape, dtype=q.dtype)
    for kwargs in ({"causal": True}, {"window_size": (300, 20)}):
        fn = lambda q, k, v: flashext.flash_attention_varlen(  # noqa: E731
            q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), deterministic=True, **kwargs)
        first = grads(fn, q, k, v, dout)
        for _ in range(9):
            for a, b in zip(first, grads(fn, q, k, v, dout)):
                assert torch.equal(a, b), kwargs
        want = ref.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, **kwargs)
        base = ref.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, compute_dtype=q.dtype, **kwargs)
        for name, g, w, b in zip(("dq", "dk", "dv"), first, want, base):
            assert_close(f"deterministic varlen {name} {head_dim} {kwargs}", g, w, b, factor=GRADIENT_FACTOR)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_deterministic_top_left_causal_is_bitwise_reproducible(head_dim):
    # is_causal as torch aligns it (top-left) with Sq > Sk: the diagonal through (0, 0), so every key
    # block sees query blocks from its own start on, another order of adds than bottom-right's.
    q = randn(2, 4, 700, head_dim, dtype=torch.bfloat16)
    k, v = (randn(2, 4, 500, head_dim, dtype=torch.bfloat16) for _ in range(2))
    dout = randn(*q.shape, dtype=q.dtype)
    fn = lambda q, k, v: flashext.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    torch.use_deterministic_algorithms(True)
    try:
        first = grads(fn, q, k, v, dout)
        for _ in range(9):
            assert all(torch.equal(a, b) for a, b in zip(first, grads(fn, q, k, v, dout)))
    finally:
        torch.use_deterministic_algorithms(False)


def test_default_mode_spread_is_reported_and_small():
    # The default adds dq by atomics: its bits may vary; dk and dv never do. Reports the spread.
    q, k, v = make_qkv(1, 2048, 2048, 8, 8, 128, torch.bfloat16)
    dout = randn(*q.shape, dtype=q.dtype)
    fn = lambda q, k, v: flashext.flash_attention(q, k, v, causal=True)  # noqa: E731
    first = grads(fn, q, k, v, dout)
    spread = 0.0
    for _ in range(20):
        again = grads(fn, q, k, v, dout)
        spread = max(spread, (again[0].float() - first[0].float()).abs().max().item())
        assert torch.equal(again[1], first[1]) and torch.equal(again[2], first[2])
    print(f"dq spread over 20 runs: {spread:.3e} (max |dq| {first[0].abs().max().item():.3e})")
    assert spread <= 1e-2 * first[0].abs().max().item()


def test_inputs_are_never_written():
    q, k, v = make_qkv(2, 200, 200, 4, 2, 64, torch.float16)
    copies = [t.clone() for t in (q, k, v)]
    grads(lambda q, k, v: flashext.flash_attention(q, k, v, causal=True), q, k, v, randn(*q.shape, dtype=q.dtype))
    for t, c in zip((q, k, v), copies):
        assert torch.equal(t, c)


def test_opcheck():
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 37, 45, 4, 2, 64, torch.bfloat16))
    torch.library.opcheck(torch.ops.flashext.flash_attn_fwd.default, (q, k, v, True, None, -1, -1, 0.0, False, False))
    cu = torch.tensor([0, 10, 37], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 20, 45], dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.flashext.flash_attn_varlen_fwd.default,
                          (q[0], k[0], v[0], cu, cu_k, 27, 25, False, None, -1, -1, 0.0, False, False))
    out, lse = flashext.flash_attention(q.detach(), k.detach(), v.detach(), return_lse=True)
    torch.library.opcheck(torch.ops.flashext.flash_attn_bwd.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, None, False))


def test_torch_compile_training_step_and_cuda_graph():
    torch.manual_seed(0)
    layer = torch.nn.Linear(128, 3 * 128, device="cuda", dtype=torch.bfloat16)

    def loss_fn(x):
        q, k, v = layer(x).view(2, 256, 3, 2, 64).unbind(2)
        return flashext.flash_attention(q, k, v, causal=True).float().square().mean()

    x = randn(2, 256, 128, dtype=torch.bfloat16)
    eager_loss = loss_fn(x)
    eager_loss.backward()
    eager_grad = layer.weight.grad.clone()
    layer.weight.grad = None
    compiled_loss = torch.compile(loss_fn, fullgraph=True)(x)  # forward and backward graphs (AOTAutograd)
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss)
    torch.testing.assert_close(layer.weight.grad, eager_grad, rtol=2e-2, atol=2e-3)
    # forward + backward captured in one CUDA graph and replayed on new inputs
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 300, 300, 4, 2, 64, torch.float16))
    dout = randn(*q.shape, dtype=q.dtype)

    def fwd_bwd():
        return torch.autograd.grad((flashext.flash_attention(q, k, v, causal=True) * dout).sum(), (q, k, v))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fwd_bwd()  # warm up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fwd_bwd()
    fresh = make_qkv(2, 300, 300, 4, 2, 64, torch.float16)
    with torch.no_grad():
        for t, f in zip((q, k, v), fresh):
            t.copy_(f)
    graph.replay()
    want = ref.attention_backward(dout, *fresh, causal=True)
    base = ref.attention_backward(dout, *fresh, causal=True, compute_dtype=torch.float16)
    for name, g, w, b in zip(("dq", "dk", "dv"), captured, want, base):
        assert_close(f"graph {name}", g, w, b, factor=GRADIENT_FACTOR)


def test_huge_logits_have_finite_gradients():
    q, k, v = make_qkv(2, 256, 256, 4, 2, 64, torch.float16, scale=30.0, k_scale=30.0)
    dq, dk, dv = grads(lambda q, k, v: flashext.flash_attention(q, k, v, causal=True), q, k, v,
                       randn(*q.shape, dtype=q.dtype))
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()


def test_bad_gradient_inputs_are_refused():
    q, k, v = make_qkv(1, 64, 64, 2, 2, 64, torch.float16)
    out, lse = flashext.flash_attention(q, k, v, return_lse=True)
    bwd = torch.ops.flashext.flash_attn_bwd
    with pytest.raises(RuntimeError, match=r"flashext.flash_attention \(backward\): argument 'dout' must have the "
                                           r"shape of 'q'"):
        bwd(out[:, :10], q, k, v, out, lse, None)
    with pytest.raises(RuntimeError, match=r"argument 'lse' must be float32"):
        bwd(out, q, k, v, out, lse.half(), None)
    with pytest.raises(RuntimeError, match=r"argument 'dlse' must have shape \[1, 2, 64\]"):
        bwd(out, q, k, v, out, lse, lse[:, :1])
    with pytest.raises(RuntimeError, match=r"argument 'out' must have the dtype of 'q'"):
        bwd(out, q, k, v, out.float(), lse, None)
