"""flashext as SDPA's flash implementation (flashext.integrations.sdpa): registered by import, never
activated by it; activate / restore round-trip (CPU). On the GPU, with it active: SDPA under the
flash backend runs flashext's kernels (the profiler sees them) and its outputs and gradients pass
the reference rule over a shape grid (GQA, causal, Sq != Sk, odd head dims, bf16/fp16); calls it
does not take (dropout) run PyTorch's own kernel, bitwise as without the provider; deterministic
mode; torch.compile; restore brings PyTorch's kernel back."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

import flashext
from flashext import reference as ref
from flashext.integrations import sdpa
from flashext.testing import GRADIENT_FACTOR, assert_close
from tests.helpers import HALF_DTYPES, HALF_IDS, kernel_names, randn, requires_cuda

attention = torch.nn.attention
requires_registry = pytest.mark.skipif(not hasattr(attention, "register_flash_attention_impl"),
                                       reason="this torch has no flash-attention registry (torch >= 2.10)")
requires_extension = pytest.mark.skipif(not flashext.build_info()["built"], reason="flashext._C is not built")


@contextlib.contextmanager
def active():
    attention.activate_flash_attention_impl("flashext")
    try:
        yield
    finally:
        attention.restore_flash_attention_impl()


@requires_registry
def test_registered_not_activated():
    assert "flashext" in attention.list_flash_attention_impls()
    assert attention.current_flash_attention_impl() is None  # import alone changes nothing


@requires_registry
@requires_extension
def test_activate_restore_round_trip():
    def cuda_kernel(op):  # who serves the op's CUDA key now
        lines = torch._C._dispatch_dump(f"aten::{op}").splitlines()
        return next(line for line in lines if line.startswith("CUDA:"))

    ops = ("_flash_attention_forward", "_flash_attention_backward")
    native = [cuda_kernel(op) for op in ops]
    assert not any("flashext" in k for k in native)
    for _ in range(2):  # twice: restore must leave the dispatcher as it found it
        with active():
            assert attention.current_flash_attention_impl() == "flashext"
            assert all("flashext/integrations/sdpa.py" in cuda_kernel(op) for op in ops)
        assert attention.current_flash_attention_impl() is None
        assert [cuda_kernel(op) for op in ops] == native


@pytest.mark.parametrize("case, reason", [
    ("dropout", "dropout"), ("float32", "dtype"), ("head_dim_100", "head dim"), ("head_dim_512", "head dim"),
    ("heads", "heads"), ("layout", "layout"), ("scale_zero", "scale"), ("scale_nan", "scale")])
def test_what_falls_back(case, reason):
    """The calls flashext leaves to PyTorch's kernel, decided before any device query (meta)."""
    dtype = torch.float32 if case == "float32" else torch.bfloat16
    head_dim = {"head_dim_100": 100, "head_dim_512": 512}.get(case, 64)
    q = torch.empty(2, 16, 6 if case == "heads" else 8, head_dim, dtype=dtype, device="meta")
    kv = torch.empty(2, 16, 4, head_dim, dtype=dtype, device="meta")
    if case == "layout":
        q = q[0]  # 3-D without cu_seqlens
    scale = {"scale_zero": 0.0, "scale_nan": float("nan")}.get(case)
    assert sdpa._unsupported(q, kv, kv, None, 0.1 if case == "dropout" else 0.0, scale) == reason


def test_windows_bounded_as_flash_attention_2():
    assert [sdpa._window(w, 100) for w in (None, -1, -7, 0, 99, 100, 1000)] == [-1, -1, -1, 0, 99, -1, -1]


def sdpa_grads(q, k, v, dout, **kwargs):
    """SDPA under the flash backend, (B, H, S, D) inputs: out and (dq, dk, dv)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    return (out, *torch.autograd.grad(out, (q, k, v), dout))


OURS = "attention_detail::flash"


@requires_cuda
@requires_registry
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim, causal", [
    (2, 8, 8, 128, 128, 64, False),
    (2, 8, 2, 257, 257, 128, True),     # GQA, causal, ragged tile edge
    (1, 4, 4, 77, 300, 96, False),      # Sq != Sk, head dim padded to the kernel's 128
    (3, 6, 3, 200, 200, 256, True),
    (2, 4, 1, 1, 513, 40, False),       # MQA, one query
])
def test_sdpa_runs_flashext_and_matches(dtype, batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim, causal):
    q = randn(batch, heads, seqlen_q, head_dim, dtype=dtype)
    k, v = (randn(batch, heads_kv, seqlen_k, head_dim, dtype=dtype) for _ in range(2))
    dout = randn(batch, heads, seqlen_q, head_dim, dtype=dtype)
    kwargs = {"is_causal": causal, "enable_gqa": heads_kv != heads}
    with active():
        names = kernel_names(lambda: sdpa_grads(q, k, v, dout, **kwargs))
        out, *grads = sdpa_grads(q, k, v, dout, **kwargs)
    assert OURS in names and "pytorch_flash" not in names, names[:400]
    # the reference in flashext's (B, S, H, D) layout (causal cases have Sq = Sk: no alignment question)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    want = ref.attention_backward(t(dout), t(q), t(k), t(v), causal=causal)
    base = ref.attention_backward(t(dout), t(q), t(k), t(v), causal=causal, compute_dtype=dtype)
    for name, g, w, b in zip(("dq", "dk", "dv"), grads, want, base):
        assert_close(f"sdpa provider {name}", t(g), w, b, factor=GRADIENT_FACTOR)
    want_out = ref.attention(t(q), t(k), t(v), causal=causal)
    base_out = ref.attention(t(q), t(k), t(v), causal=causal, compute_dtype=dtype)
    assert_close("sdpa provider out", t(out), want_out, base_out)


@requires_cuda
@requires_registry
def test_layouts_match_pytorchs_kernel():
    """out and the gradients in the strides PyTorch's own kernel returns (compiled graphs assert them)."""
    q, k, v, dout = (randn(2, 4, 96, 64, dtype=torch.float16) for _ in range(4))
    native = sdpa_grads(q, k, v, dout, is_causal=True)
    with active():
        provided = sdpa_grads(q, k, v, dout, is_causal=True)
    assert [t.stride() for t in provided] == [t.stride() for t in native]


@requires_cuda
@requires_registry
@pytest.mark.skipif(not hasattr(attention, "varlen"), reason="no torch.nn.attention.varlen")
def test_varlen_attn_through_the_provider():
    from torch.nn.attention.varlen import varlen_attn

    from tests.helpers import cu_seqlens

    lengths = [1, 130, 0, 77]
    cu = cu_seqlens(lengths)
    q, k, v, dout = (randn(sum(lengths), 4, 64, dtype=torch.bfloat16) for _ in range(4))

    def run():
        qi, ki, vi = (t.detach().requires_grad_() for t in (q, k, v))
        out = varlen_attn(qi, ki, vi, cu, cu, max(lengths), max(lengths), window_size=(-1, 0))
        return (out, *torch.autograd.grad(out, (qi, ki, vi), dout))

    native = run()
    with active():
        names = kernel_names(run)
        provided = run()
    if "cudnn" not in names.lower():  # (a torch whose varlen_attn prefers cuDNN never reaches the provider)
        assert OURS in names, names[:400]
    want = ref.attention_varlen(q, k, v, cu, cu, causal=True)
    for got, theirs in zip(provided, native):
        assert got.shape == theirs.shape and got.stride() == theirs.stride()
    base = ref.attention_varlen(q, k, v, cu, cu, causal=True, compute_dtype=q.dtype)
    assert_close("varlen_attn out", provided[0], want, base)


@requires_cuda
@requires_registry
def test_dropout_falls_back_bitwise():
    q, k, v, dout = (randn(2, 4, 128, 64, dtype=torch.bfloat16) for _ in range(4))

    def run():
        torch.manual_seed(7)
        return sdpa_grads(q, k, v, dout, dropout_p=0.25)

    native = run()
    with active():
        names = kernel_names(run)
        provided = run()
    assert OURS not in names and "pytorch_flash" in names
    for a, b in zip(native, provided):
        assert torch.equal(a, b)


@requires_cuda
@requires_registry
def test_restore_brings_pytorch_back():
    q, k, v, dout = (randn(1, 2, 64, 64, dtype=torch.float16) for _ in range(4))
    with active():
        pass
    names = kernel_names(lambda: sdpa_grads(q, k, v, dout))
    assert OURS not in names and "pytorch_flash" in names


@requires_cuda
@requires_registry
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_mode_is_bitwise(causal):
    q = randn(2, 8, 500, 128, dtype=torch.bfloat16)
    k, v = (randn(2, 2, 500, 128, dtype=torch.bfloat16) for _ in range(2))
    dout = randn(2, 8, 500, 128, dtype=torch.bfloat16)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with active():
            first = sdpa_grads(q, k, v, dout, enable_gqa=True, is_causal=causal)
            for _ in range(5):
                again = sdpa_grads(q, k, v, dout, enable_gqa=True, is_causal=causal)
                assert all(torch.equal(a, b) for a, b in zip(first, again))
    finally:
        torch.use_deterministic_algorithms(previous)


@requires_cuda
@requires_registry
def test_compiled_sdpa_uses_flashext():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (randn(2, 4, 256, 64, dtype=torch.bfloat16) for _ in range(3))

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with active(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        eager = attend(q, k, v)
        compiled = torch.compile(attend, fullgraph=True)
        names = kernel_names(lambda: compiled(q, k, v))
        assert torch.equal(compiled(q, k, v), eager)
    assert OURS in names


@requires_cuda
@requires_registry
def test_direct_aten_calls_with_windows():
    """aten::_flash_attention_forward called directly with windows (as varlen and nested callers do),
    bottom-right aligned as FlashAttention-2 has them: flashext against PyTorch's kernel."""
    q = randn(2, 300, 4, 64, dtype=torch.bfloat16)
    k, v = (randn(2, 200, 2, 64, dtype=torch.bfloat16) for _ in range(2))

    def run():
        return torch.ops.aten._flash_attention_forward(q, k, v, None, None, 300, 200, 0.0, False, False,
                                                       window_size_left=40, window_size_right=10)[:2]

    _, native_lse = run()
    with active():
        names = kernel_names(run)
        out, lse = run()
    assert OURS in names, names[:400]
    want = ref.attention(q, k, v, window_size=(40, 10))
    base = ref.attention(q, k, v, window_size=(40, 10), compute_dtype=q.dtype)
    assert_close("aten flash forward, windows", out, want, base)
    finite = torch.isfinite(native_lse)  # (rows 0-89 see no key: lse −inf here, +inf in FlashAttention-2)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], native_lse[finite], rtol=1e-2, atol=1e-2)

