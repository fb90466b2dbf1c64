"""flashext.online_softmax: torch.softmax(x, -1) in one pass over each row. Precision by the rule
(2× PyTorch's error in the dtype, + 1e-5), layouts and alignments, the NaN rows torch gives, huge
logits, errors. GPU tests skip where no CUDA device is visible."""

import pytest
import torch

import flashext
from flashext import reference as ref
from flashext.testing import assert_close, poison_cache
from tests.helpers import CHECK_DEVICES, FLOAT_DTYPES, FLOAT_IDS, at_offset, randn, requires_cuda


def check(x, name):
    poison_cache(x)
    got = flashext.online_softmax(x)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert_close(name, got, torch.softmax(x.double(), -1), torch.softmax(x, -1))
    return got


@requires_cuda
@pytest.mark.parametrize("cols", [1, 7, 1000, 4096, 32768, 32769, 65536, 98304, 100003])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_row_lengths(dtype, cols):
    x = randn(max(1, 2**21 // cols), cols, dtype=dtype, scale=5.0)
    x[0, : cols // 2] = float("-inf")  # masked entries
    check(x, f"online_softmax {cols}")


def test_reference_is_the_tiled_definition():
    x = torch.randn(5, 300, dtype=torch.float64) * 4
    x[1, :100] = float("-inf")
    torch.testing.assert_close(ref.online_softmax(x, tile=64), torch.softmax(x, -1), rtol=1e-12, atol=1e-14)


@requires_cuda
def test_layouts():
    x = randn(64, 3000, dtype=torch.bfloat16)
    check(x[:, :1000], "strided rows")
    check(x.t(), "transposed")
    z = randn(65, 4096)
    check(z[:, 8:], "aligned strided rows (vector path)")
    check(z.flatten()[1 : 1 + 64 * 4096].view(64, 4096), "unaligned start (scalar path)")
    assert flashext.online_softmax(torch.empty(0, 5, device="cuda")).shape == (0, 5)
    assert flashext.online_softmax(torch.empty(3, 0, device="cuda")).shape == (3, 0)


@requires_cuda
@pytest.mark.parametrize("offset", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_any_start_alignment(dtype, offset):
    for cols in (8, 1000, 4096):
        check(at_offset(randn(33, cols, dtype=dtype, scale=3.0), offset), f"offset {offset} cols {cols}")


@requires_cuda
@pytest.mark.parametrize("cols", [1, 3, 8, 5000, 70000])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=FLOAT_IDS)
def test_nan_rows_are_torchs(dtype, cols):
    # torch.softmax: a row holding NaN or +inf, or only −inf, is all NaN; −inf alone is 0.
    inf, nan = float("inf"), float("nan")
    specials = [[nan], [inf], [inf, inf], [-inf], [inf, -inf], [nan, inf], [-inf] * cols, [nan] * cols]
    x = randn(len(specials) + 1, cols, dtype=dtype, scale=2.0)
    for row, special in enumerate(specials):
        values = torch.tensor(special[:cols], dtype=dtype)
        x[row, torch.randperm(cols)[: len(values)]] = values.cuda()
    got, want = flashext.online_softmax(x), torch.softmax(x, -1)
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (torch.isnan(got).sum(-1), torch.isnan(want).sum(-1))
    assert torch.equal(torch.isnan(got), torch.isnan(torch.softmax(x.cpu().double(), -1)).cuda())
    finite = ~torch.isnan(want)
    torch.testing.assert_close(got[finite], want[finite])


@requires_cuda
@pytest.mark.parametrize("scale", [1e3, 1e4, 1e30])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_huge_logits_keep_their_digits(dtype, scale):
    for cols in (1, 2, 1000, 40000):
        x = randn(16, cols, scale=scale).clamp(-3e38, 3e38).to(dtype)
        check(x, f"scale {scale:g} cols {cols}")
    one = flashext.online_softmax(randn(8, 1, scale=scale).to(dtype))
    assert torch.equal(one, torch.ones_like(one))


@requires_cuda
def test_inputs_are_never_written_graphs_replay_and_compile():
    x = randn(100, 5000)
    before = x.clone()
    flashext.online_softmax(x)
    torch.cuda.synchronize()
    assert torch.equal(x, before)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = flashext.online_softmax(x)
    x.copy_(randn(100, 5000))
    graph.replay()
    assert torch.equal(y, flashext.online_softmax(x))
    compiled = torch.compile(lambda t: flashext.online_softmax(t) * 2, fullgraph=True, dynamic=True)
    for rows in (100, 37):
        torch.testing.assert_close(compiled(x[:rows]), flashext.online_softmax(x[:rows]) * 2, rtol=0, atol=0)


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_bad_input(device):
    fn = r"flashext.online_softmax: "
    for x, message in ((randn((), device=device), r"argument 'x' must have at least one dimension"),
                       (randn(4, 4, dtype=torch.float64, device=device), r"argument 'x' must be float32, float16 or "
                        r"bfloat16, got Double"),
                       (torch.zeros(4, 4, dtype=torch.int32, device=device), r"argument 'x' must be float32")):
        with pytest.raises(RuntimeError, match=fn + message):
            flashext.online_softmax(x)
    with pytest.raises(RuntimeError, match=fn + r"argument 'x' must be a CUDA tensor"):
        flashext.online_softmax(torch.randn(4, 4))
