"""flashext.fused_add_gelu and flashext.bias_gelu: semantics, precision, layouts, errors.

CUDA kernels are judged against flashext.reference (float64) by flashext.testing's rule: at most
2× (3× for gradients) PyTorch's own error in the input's dtype, plus 1e-5. Outputs are poisoned
with NaN before every launch. GPU tests skip where no CUDA device is visible.
"""

import pytest
import torch
import torch.nn.functional as F

import flashext
from flashext import reference as ref
from flashext.testing import GRADIENT_FACTOR, assert_close, assert_gelu_within_one_step, poison_cache
from tests.helpers import CHECK_DEVICES, FLOAT_DTYPES as DTYPES, FLOAT_IDS as DTYPE_IDS, at_offset, requires_cuda
from tests.helpers import randn as _randn

APPROX = ["none", "tanh"]
SIZES = [0, 1, 7, 1023, 2**20 + 3, 2**24]


def randn(*shape, dtype=torch.float32, device="cuda", scale=2.0):
    # scale 2: z = x + y spans GeLU's curved region and both tails
    return _randn(*shape, dtype=dtype, device=device, scale=scale)


# ---- helpers that run one op and judge all of its outputs ----------------------------------


def check_add_gelu(x, y, approximate, grad=True):
    """Forward via the functional and out= paths, backward via autograd; all vs the reference."""
    poison_cache(x)
    out = flashext.fused_add_gelu(x, y, approximate)
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
    baseline = F.gelu(x + y, approximate=approximate)
    assert_close(f"add_gelu {x.dtype} {approximate}", out, ref.add_gelu(x, y, approximate), baseline)

    out_buf = torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)
    assert flashext.fused_add_gelu(x, y, approximate, out=out_buf) is out_buf
    torch.testing.assert_close(out_buf, out, rtol=0, atol=0)

    if not grad:
        return
    g = randn(*x.shape, dtype=x.dtype, scale=1.0)
    xr, yr = x.detach().requires_grad_(), y.detach().requires_grad_()
    poison_cache(x)
    flashext.fused_add_gelu(xr, yr, approximate).backward(g)
    expected = ref.add_gelu_backward(g, x, y, approximate)
    baseline = torch.ops.aten.gelu_backward(g, x + y, approximate=approximate)
    assert_close("add_gelu grad_x", xr.grad, expected, baseline, GRADIENT_FACTOR)
    assert_close("add_gelu grad_y", yr.grad, expected, baseline, GRADIENT_FACTOR)


def check_bias_gelu(x, bias, approximate, grad=True):
    poison_cache(x)
    out = flashext.bias_gelu(x, bias, approximate)
    assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
    baseline = F.gelu(x + bias, approximate=approximate)
    assert_close(f"bias_gelu {x.dtype} {approximate}", out, ref.bias_gelu(x, bias, approximate), baseline)

    out_buf = torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)
    flashext.bias_gelu(x, bias, approximate, out=out_buf)
    torch.testing.assert_close(out_buf, out, rtol=0, atol=0)

    if not grad:
        return
    g = randn(*x.shape, dtype=x.dtype, scale=1.0)
    xr, br = x.detach().requires_grad_(), bias.detach().requires_grad_()
    poison_cache(x, bias)
    flashext.bias_gelu(xr, br, approximate).backward(g)
    grad_x, grad_bias = ref.bias_gelu_backward(g, x, bias, approximate)
    base_x = torch.ops.aten.gelu_backward(g, x + bias, approximate=approximate)
    base_bias = base_x.reshape(-1, x.shape[-1]).sum(0)
    assert_close("bias_gelu grad_x", xr.grad, grad_x, base_x, GRADIENT_FACTOR)
    assert_close("bias_gelu grad_bias", br.grad, grad_bias, base_bias, GRADIENT_FACTOR)


# ---- the reference itself (everywhere) ------------------------------------------------------


@pytest.mark.parametrize("approximate", APPROX)
def test_reference_matches_torch_gelu(approximate):
    z = torch.randn(10000, dtype=torch.float64) * 4
    torch.testing.assert_close(ref.gelu(z, approximate), F.gelu(z, approximate=approximate), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("approximate", APPROX)
def test_reference_gradient_matches_autograd(approximate):
    z = (torch.randn(10000, dtype=torch.float64) * 4).requires_grad_()
    (auto,) = torch.autograd.grad(F.gelu(z, approximate=approximate).sum(), z)
    torch.testing.assert_close(ref.gelu_grad(z.detach(), approximate), auto, rtol=1e-12, atol=1e-12)


def test_reference_bias_gradient_is_row_sum():
    x, b, g = torch.randn(6, 5, 7), torch.randn(7), torch.randn(6, 5, 7)
    grad_x, grad_bias = ref.bias_gelu_backward(g, x, b)
    torch.testing.assert_close(grad_bias, grad_x.sum(dim=(0, 1)))


# ---- CUDA kernels: sizes, dtypes, both forms ------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_add_gelu_sizes(dtype, approximate, n):
    check_add_gelu(randn(n, dtype=dtype), randn(n, dtype=dtype), approximate)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_exact_form_every_16bit_value(dtype):
    """The exact form's 16-bit results (erff-free Φ, FLASHEXT_GELU_FAST_PHI) for every finite 16-bit z,
    through both kernels, forward and backward: within one rounding step of the exact value."""
    z = torch.arange(-(2**15), 2**15, dtype=torch.int32, device="cuda").to(torch.int16).view(dtype)
    z = z[torch.isfinite(z)].contiguous()
    zero = torch.zeros_like(z)
    assert_gelu_within_one_step("add_gelu", z.double(), flashext.fused_add_gelu(z, zero),
                                torch.ops.flashext.add_gelu_backward(torch.ones_like(z), z, zero, "none"))
    x = z[: z.numel() // 64 * 64].reshape(-1, 64)
    bias = torch.zeros(64, dtype=dtype, device="cuda")
    grad_x, _ = torch.ops.flashext.bias_gelu_backward(torch.ones_like(x), x, bias, "none")
    assert_gelu_within_one_step("bias_gelu", x.double(), flashext.bias_gelu(x, bias), grad_x)


@requires_cuda
@pytest.mark.parametrize("shape", [(1000,), (7, 113), (3, 5, 127), (2, 3, 4, 129), (1, 1, 1, 1)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_add_gelu_shapes(dtype, shape):
    check_add_gelu(randn(*shape, dtype=dtype), randn(*shape, dtype=dtype), "none")


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_add_gelu_views(dtype):
    base = randn(64, 1001, dtype=dtype)
    other = randn(64, 1001, dtype=dtype)
    # unaligned (offset by one element), transposed, strided, and a broadcast (stride-0) y
    check_add_gelu(base.view(-1)[1:], other.view(-1)[1:], "none")
    check_add_gelu(base.view(-1)[1:], other.view(-1)[:-1], "tanh")
    check_add_gelu(base.t(), other.t(), "none")
    check_add_gelu(base[:, :1000:2], other[:, 1::2], "tanh")
    check_add_gelu(base, other[:1].expand(64, 1001), "none")


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_add_gelu_in_place(dtype):
    x, y = randn(4099, dtype=dtype), randn(4099, dtype=dtype)
    expected = ref.add_gelu(x, y)
    baseline = F.gelu(x + y)
    out = flashext.fused_add_gelu(x, y, out=x)
    assert out.data_ptr() == x.data_ptr()
    assert_close("add_gelu in place", x, expected, baseline)


@requires_cuda
@pytest.mark.parametrize("shape", [(1, 1), (7, 1), (1, 7), (113, 64), (1023, 1000), (8, 16384), (3, 5, 256), (2, 3, 4, 40)])
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bias_gelu_shapes(dtype, approximate, shape):
    check_bias_gelu(randn(*shape, dtype=dtype), randn(shape[-1], dtype=dtype), approximate)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bias_gelu_many_rows(dtype):
    # many rows per block and several row groups: the partial-sum reduction of grad_bias
    check_bias_gelu(randn(8192, 1024, dtype=dtype), randn(1024, dtype=dtype), "none")
    check_bias_gelu(randn(2**16 + 5, 24, dtype=dtype), randn(24, dtype=dtype), "tanh")


@requires_cuda
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bias_gelu_many_waves(dtype, approximate):
    # 33 column segments x 257 row groups at 4 rows: over 4 waves, so the vectorized fp32 forward
    # keeps 4 rows in flight per thread (bias_gelu_fwd_rows_fp32); a part-filled last segment and
    # row group, then strided rows
    check_bias_gelu(randn(8195, 4100, dtype=dtype), randn(4100, dtype=dtype), approximate)
    check_bias_gelu(randn(8195, 4104, dtype=dtype)[:, :4100], randn(4100, dtype=dtype), approximate)


@requires_cuda
@pytest.mark.parametrize("approximate", APPROX)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bias_gelu_few_rows_one_pass(dtype, approximate):
    # up to 1024 rows of wide, aligned columns: the backward's one-launch path (a block per column
    # strip walks every row); 16008 columns leave a part-filled last strip, 67 rows a part-filled
    # last batch of rows; 5 rows leave most row threads without a row
    check_bias_gelu(randn(67, 16008, dtype=dtype), randn(16008, dtype=dtype), approximate)
    check_bias_gelu(randn(5, 16008, dtype=dtype), randn(16008, dtype=dtype), approximate)
    check_bias_gelu(randn(1024, 16008, dtype=dtype), randn(16008, dtype=dtype), approximate)
    check_bias_gelu(randn(2, 33, 16008, dtype=dtype), randn(16008, dtype=dtype), approximate)
    check_bias_gelu(randn(67, 16040, dtype=dtype)[:, :16008], randn(16008, dtype=dtype), approximate)  # row stride


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bias_gelu_views(dtype):
    wide = randn(300, 2 * 520, dtype=dtype)
    bias = randn(2 * 520, dtype=dtype)
    check_bias_gelu(wide[:, :520], bias[:520], "none")  # row stride 1040: read in place
    check_bias_gelu(wide[:, 3:523], bias[1:521], "tanh")  # unaligned rows and bias
    check_bias_gelu(wide.view(-1)[1:520 * 299 + 1].view(299, 520), bias[:520], "none")  # unaligned start
    check_bias_gelu(wide[:, :300].t(), bias[:300], "none")  # transposed: copied
    check_bias_gelu(wide[:, ::2], bias[::2], "tanh")  # strided last dim and bias: copied
    check_bias_gelu(wide.view(3, 100, 1040)[:, :, :520], bias[:520], "none")  # 3-D, collapsible
    check_bias_gelu(wide.view(3, 100, 1040)[:, ::2, :520], bias[:520], "none")  # not collapsible


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bias_gelu_empty(dtype):
    for shape in [(0, 16), (4, 0), (0,), (2, 0, 8)]:
        x = randn(*shape, dtype=dtype).requires_grad_()
        b = randn(shape[-1], dtype=dtype).requires_grad_()
        out = flashext.bias_gelu(x, b)
        assert out.shape == x.shape
        out.sum().backward()
        assert x.grad.shape == x.shape
        assert torch.equal(b.grad, torch.zeros_like(b))


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bias_gelu_in_place(dtype):
    x, b = randn(37, 520, dtype=dtype), randn(520, dtype=dtype)
    expected, baseline = ref.bias_gelu(x, b), F.gelu(x + b)
    flashext.bias_gelu(x, b, out=x)
    assert_close("bias_gelu in place", x, expected, baseline)


@requires_cuda
def test_inference_mode_and_no_grad():
    x, y, b = randn(1000), randn(1000), randn(1000)
    with torch.inference_mode():
        check_add_gelu(x, y, "none", grad=False)
        check_bias_gelu(x.view(10, 100), b[:100], "tanh", grad=False)
    with torch.no_grad():
        out = flashext.fused_add_gelu(x.requires_grad_(), y)
        assert not out.requires_grad


@requires_cuda
def test_double_backward_is_refused():
    x, y = randn(100).requires_grad_(), randn(100)
    out = flashext.fused_add_gelu(x, y)
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        gx.sum().backward()


@requires_cuda
@pytest.mark.large
def test_past_2_to_the_31_elements():
    n = 2**31 + 4099  # 64-bit indexing: offsets past int32, plus a tail that is not a full pack
    x = randn(n, dtype=torch.bfloat16, scale=1.0)
    y = randn(n, dtype=torch.bfloat16, scale=1.0)
    out = flashext.fused_add_gelu(x, y)
    for sl in (slice(0, 2**20), slice(2**31 - 2**19, n)):
        assert_close("add_gelu >2^31", out[sl], ref.add_gelu(x[sl], y[sl]), F.gelu(x[sl] + y[sl]))
    del out
    g = randn(n, dtype=torch.bfloat16, scale=1.0)
    grad = torch.ops.flashext.add_gelu_backward(g, x, y, "none")
    sl = slice(n - 2**20, n)
    assert_close("add_gelu bwd >2^31", grad[sl], ref.add_gelu_backward(g[sl], x[sl], y[sl]),
                 torch.ops.aten.gelu_backward(g[sl], x[sl] + y[sl]), GRADIENT_FACTOR)
    del x, y, g, grad
    cols = 8192
    rows = n // cols + 3
    x = randn(rows, cols, dtype=torch.bfloat16, scale=1.0)
    b = randn(cols, dtype=torch.bfloat16)
    out = flashext.bias_gelu(x, b)
    tail = slice(rows - 300, rows)
    assert_close("bias_gelu >2^31", out[tail], ref.bias_gelu(x[tail], b), F.gelu(x[tail] + b))
    del out
    torch.cuda.empty_cache()


# ---- bad input: a clear error naming the function and the argument --------------------------


def test_cpu_tensors_are_refused():
    x = torch.randn(8)
    with pytest.raises(RuntimeError, match=r"flashext.fused_add_gelu: argument 'x' must be a CUDA tensor"):
        flashext.fused_add_gelu(x, x)
    with pytest.raises(RuntimeError, match=r"flashext.bias_gelu: argument 'x' must be a CUDA tensor"):
        flashext.bias_gelu(x.view(2, 4), x[:4])


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_add_gelu_bad_input(device):
    def r(*shape, dtype=torch.float32):
        return randn(*shape, dtype=dtype, device=device)

    for x, y, message in [
        (r(8), torch.randn(8), r"argument 'y' must be on the same device as 'x'"),
        (r(8), r(8, dtype=torch.float16), r"argument 'y' must have the dtype of 'x'"),
        (r(8), r(9), r"argument 'y' must have the shape of 'x'"),
        (r(8, dtype=torch.int32), r(8, dtype=torch.int32), r"argument 'x' must be float32, float16 or bfloat16, got Int"),
        (r(8, dtype=torch.bool), r(8, dtype=torch.bool), r"argument 'x' must be float32, float16 or bfloat16, got Bool"),
        (r(8, dtype=torch.float64), r(8, dtype=torch.float64), r"argument 'x' must be float32, float16 or bfloat16, got Double"),
    ]:
        with pytest.raises(RuntimeError, match=r"flashext.fused_add_gelu: " + message):
            flashext.fused_add_gelu(x, y)


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_bias_gelu_bad_input(device):
    def r(*shape, dtype=torch.float32):
        return randn(*shape, dtype=dtype, device=device)

    x = r(4, 8)
    for bias, message in [
        (r(7), r"argument 'bias' must be 1-D of length x.shape\[-1\] = 8, got shape \[7\]"),
        (r(2, 8), r"argument 'bias' must be 1-D"),
        (torch.randn(8), r"argument 'bias' must be on the same device"),
        (r(8, dtype=torch.bfloat16), r"argument 'bias' must have the dtype of 'x'"),
    ]:
        with pytest.raises(RuntimeError, match=r"flashext.bias_gelu: " + message):
            flashext.bias_gelu(x, bias)
    with pytest.raises(RuntimeError, match=r"flashext.bias_gelu: argument 'x' must have at least one dimension"):
        flashext.bias_gelu(r(()), r(1))
    with pytest.raises(RuntimeError, match=r"flashext.bias_gelu: argument 'approximate' must be 'none' or 'tanh'"):
        flashext.bias_gelu(x, r(8), "foo")


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_bad_approximate_and_out(device):
    def r(*shape, dtype=torch.float32):
        return randn(*shape, dtype=dtype, device=device)

    x, y = r(8), r(8)
    with pytest.raises(RuntimeError, match=r"flashext.fused_add_gelu: argument 'approximate' must be 'none' or 'tanh', got 'erf'"):
        flashext.fused_add_gelu(x, y, "erf")
    with pytest.raises(RuntimeError, match=r"argument 'out' must have shape"):
        flashext.fused_add_gelu(x, y, out=r(9))
    with pytest.raises(RuntimeError, match=r"argument 'out' must be contiguous"):
        flashext.fused_add_gelu(x, y, out=r(16)[::2])
    with pytest.raises(RuntimeError, match=r"argument 'out' must have the dtype of 'x'"):
        flashext.fused_add_gelu(x, y, out=r(8, dtype=torch.float16))
    with pytest.raises(RuntimeError, match=r"out= is not differentiable"):
        flashext.fused_add_gelu(x.requires_grad_(), y, out=r(8))
    if device != "meta":  # overlap needs real storage
        big = r(9)
        with pytest.raises(RuntimeError, match=r"argument 'out' partially overlaps an input"):
            flashext.fused_add_gelu(big[:8], y, out=big[1:])


@requires_cuda
@pytest.mark.parametrize("offset", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_any_start_alignment(dtype, offset):
    # Inputs and out= buffers that start `offset` elements into their storage (not 16-byte aligned).
    for shape in ((1000,), (7, 1024), (33, 4100)):
        x, y = at_offset(randn(*shape, dtype=dtype), offset), at_offset(randn(*shape, dtype=dtype), offset)
        check_add_gelu(x, y, "none")
        out = at_offset(torch.full(shape, float("nan"), dtype=dtype, device="cuda"), offset)
        flashext.fused_add_gelu(x, y, out=out)
        torch.testing.assert_close(out, flashext.fused_add_gelu(x, y), rtol=0, atol=0)
        if len(shape) == 2:
            bias = at_offset(randn(shape[1], dtype=dtype), offset)
            check_bias_gelu(x, bias, "tanh")
            flashext.bias_gelu(x, bias, out=out)
            torch.testing.assert_close(out, flashext.bias_gelu(x, bias), rtol=0, atol=0)


# ---- fake kernels, opcheck, torch.compile, CUDA graphs ---------------------------------------


def test_fake_kernels_trace_on_meta():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, y, b):
        return flashext.bias_gelu(flashext.fused_add_gelu(x, y), b, "tanh")

    x = torch.empty(3, 5, 16, device="meta")
    out = f(x, x, torch.empty(16, device="meta"))
    assert out.shape == (3, 5, 16) and out.device.type == "meta"
    gx, gb = torch.ops.flashext.bias_gelu_backward(x, x, torch.empty(16, device="meta"))
    assert gx.shape == x.shape and gb.shape == (16,)
    graph = make_fx(f, tracing_mode="fake")(torch.randn(3, 5, 16), torch.randn(3, 5, 16), torch.randn(16))
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert targets == ["flashext.add_gelu.default", "flashext.bias_gelu.default"]
    with pytest.raises(Exception, match=r"argument 'bias' must be 1-D of length"):
        torch.ops.flashext.bias_gelu(x, torch.empty(15, device="meta"))


def test_autograd_wiring_on_meta():
    # The autograd registration (csrc/torch/autograd.cpp) on meta tensors: each op records a node whose backward
    # is its fused backward op, gradients only for inputs that ask for one, no second derivative.
    def meta(*shape):
        return torch.empty(*shape, device="meta", requires_grad=True)

    x, y, b = meta(3, 5, 16), meta(3, 5, 16), meta(16)
    out = flashext.bias_gelu(flashext.fused_add_gelu(x, y), b)
    assert out.grad_fn is not None and out.shape == (3, 5, 16)
    gx, gy, gb = torch.autograd.grad(out, (x, y, b), torch.empty_like(out))
    assert gx.shape == gy.shape == x.shape and gb.shape == (16,)
    gb_only = flashext.bias_gelu(x.detach(), b)
    (gb,) = torch.autograd.grad(gb_only, (b,), torch.empty_like(gb_only))
    assert gb.shape == (16,)
    with torch.no_grad():
        assert flashext.bias_gelu(x, b).grad_fn is None
    (gx,) = torch.autograd.grad(flashext.fused_add_gelu(x, y.detach()), (x,), torch.empty_like(x), create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(gx, (x,), torch.empty_like(gx))


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck(dtype):
    x, y, b = randn(7, 33, dtype=dtype), randn(7, 33, dtype=dtype), randn(33, dtype=dtype)
    ops = torch.ops.flashext
    cases = [
        (ops.add_gelu.default, (x.requires_grad_(), y.requires_grad_(), "tanh")),
        (ops.add_gelu.default, (x.detach(), y.detach(), "none")),
        (ops.bias_gelu.default, (x.detach().requires_grad_(), b.requires_grad_(), "none")),
        (ops.add_gelu_out.default, (x.detach(), y.detach(), "none", torch.empty_like(x))),
        (ops.bias_gelu_out.default, (x.detach(), b.detach(), "tanh", torch.empty_like(x))),
        (ops.add_gelu_backward.default, (y.detach(), x.detach(), y.detach(), "none")),
        (ops.bias_gelu_backward.default, (y.detach(), x.detach(), b.detach(), "tanh")),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


@requires_cuda
def test_torch_compile_fullgraph():
    def block(x, w, b, residual):
        h = flashext.bias_gelu(x @ w.t(), b)
        return flashext.fused_add_gelu(h, residual, "tanh")

    compiled = torch.compile(block, fullgraph=True)
    args = [randn(64, 96), randn(128, 96, scale=0.1), randn(128), randn(64, 128)]
    eager_args = [a.clone().requires_grad_() for a in args]
    comp_args = [a.clone().requires_grad_() for a in args]
    expected = block(*eager_args)
    got = compiled(*comp_args)
    torch.testing.assert_close(got, expected)
    g = randn(64, 128)
    expected.backward(g)
    got.backward(g)
    for a, b in zip(comp_args, eager_args):
        torch.testing.assert_close(a.grad, b.grad)


@requires_cuda
def test_cuda_graph_capture():
    x, y, b, g = randn(256, 1024), randn(256, 1024), randn(1024), randn(256, 1024)
    static = [t.clone() for t in (x, y, b, g)]

    def step(x, y, b, g):
        out = flashext.bias_gelu(flashext.fused_add_gelu(x, y), b)
        grad_x, grad_b = torch.ops.flashext.bias_gelu_backward(g, x, b, "none")
        return out, grad_x, grad_b

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside capture
        step(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step(*static)
    for _ in range(2):  # new data in the static inputs, then replay
        fresh = (randn(256, 1024), randn(256, 1024), randn(1024), randn(256, 1024))
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        expected = step(*fresh)
        for got, want in zip(outputs, expected):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
