"""merge_attention_states: two partial attention results combined by their lse equal attention over
the union of the key sets (the reference's definition, the flashext op on the GPU, its Triton twin
on CPU under the interpreter), with the edge rows: both sides empty, one side empty, NaN, huge lse."""

import pytest
import torch

import flashext
from flashext import reference as ref
from flashext.testing import assert_close
from flashext.triton_ref import attention as twin
from tests.helpers import CHECK_DEVICES, HAS_CUDA, randn, requires_cuda

DEVICE = "cuda" if HAS_CUDA else "cpu"


def split_attention(q, k, v, split, **kwargs):
    """Attention over keys [0, split) and [split, Sk) apart: (o, lse) of each, from the reference."""
    a = ref.attention(q, k[:, :split], v[:, :split], return_lse=True, **kwargs)
    b = ref.attention(q, k[:, split:], v[:, split:], return_lse=True, **kwargs)
    return a, b


def test_reference_merge_is_attention_over_the_union():
    q, k, v = (torch.randn(2, 9, 4, 16, dtype=torch.float64) for _ in range(3))
    (o_a, lse_a), (o_b, lse_b) = split_attention(q, k, v, 4)
    o, lse = ref.merge_attention_states(o_a, lse_a, o_b, lse_b)
    want, want_lse = ref.attention(q, k, v, return_lse=True)
    torch.testing.assert_close(o, want)
    torch.testing.assert_close(lse, want_lse)


def test_reference_merge_edges():
    o_a, o_b = torch.randn(1, 3, 1, 8), torch.full((1, 3, 1, 8), float("nan"))
    lse_a = torch.tensor([[[0.5, -float("inf"), 2.0]]])
    lse_b = torch.tensor([[[-float("inf"), -float("inf"), float("nan")]]])
    o, lse = ref.merge_attention_states(o_a, lse_a, o_b, lse_b)
    torch.testing.assert_close(o[0, 0], o_a[0, 0].double())  # the other side empty: this side as is
    assert (o[0, 1] == 0).all() and lse[0, 0, 1] == -float("inf")  # both empty: 0 and −inf
    assert torch.isnan(o[0, 2]).all() and torch.isnan(lse[0, 0, 2])  # NaN stays


def merge_impls():
    impls = [("twin", twin.merge_attention_states)]
    if HAS_CUDA:
        impls.append(("flashext", flashext.merge_attention_states))
    return impls


@pytest.mark.parametrize("name, merge", merge_impls())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_merge_equals_attention_over_the_union(name, merge, dtype):
    shapes = [(2, 37, 4, 64)] if HAS_CUDA else [(1, 5, 2, 16)]
    for batch, seqlen, heads, head_dim in shapes:
        q, k, v = (randn(batch, seqlen if i == 0 else 3 * seqlen, heads, head_dim, device=DEVICE, dtype=torch.float64)
                   for i in range(3))
        for kwargs in ({}, {"causal": True}):
            (o_a, lse_a), (o_b, lse_b) = split_attention(q, k, v, seqlen, **kwargs)
            o, lse = merge(o_a.to(dtype), lse_a, o_b.to(dtype), lse_b)
            want, want_lse = ref.merge_attention_states(o_a.to(dtype), lse_a, o_b.to(dtype), lse_b)
            base = (torch.exp(lse_a - want_lse).transpose(-1, -2)[..., None].to(dtype) * o_a.to(dtype)
                    + torch.exp(lse_b - want_lse).transpose(-1, -2)[..., None].to(dtype) * o_b.to(dtype))
            assert o.dtype == dtype and lse.dtype == torch.float32
            assert_close(f"{name} o {dtype} {kwargs}", o, want, torch.nan_to_num(base))
            torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name, merge", merge_impls())
def test_merge_edge_rows(name, merge):
    o_a = randn(1, 4, 2, 16, device=DEVICE)
    o_b = torch.full_like(o_a, float("nan"))
    lse_a = torch.tensor([[[0.5, -float("inf"), 2.0, 9e4], [1.0, 1.0, -float("inf"), -9e4]]], device=DEVICE)
    lse_b = torch.tensor([[[-float("inf"), -float("inf"), float("nan"), -float("inf")],
                           [-float("inf"), -float("inf"), -float("inf"), -float("inf")]]], device=DEVICE)
    o, lse = merge(o_a, lse_a, o_b, lse_b)
    want, want_lse = ref.merge_attention_states(o_a, lse_a, o_b, lse_b)
    finite = torch.isfinite(want)
    torch.testing.assert_close(o[finite].double(), want[finite])
    assert torch.equal(torch.isnan(o), torch.isnan(want))
    assert torch.equal(torch.isnan(lse), torch.isnan(want_lse))
    assert (o[0, 1, 0] == 0).all() and (o[0, 2, 1] == 0).all()  # both sides empty: 0 and −inf, no NaN
    assert torch.isneginf(lse[0, 0, 1]) and torch.isneginf(lse[0, 1, 2])


@requires_cuda
def test_cascade_shared_prefix_attention():
    # One shared prefix of 300 keys attended once for 4 queries' sequences; each suffix apart; merged.
    heads, head_dim = 4, 64
    prefix_k, prefix_v = (randn(1, 300, heads, head_dim, dtype=torch.bfloat16) for _ in range(2))
    q = randn(3, 50, heads, head_dim, dtype=torch.bfloat16)
    suffix_k, suffix_v = (randn(3, 80, heads, head_dim, dtype=torch.bfloat16) for _ in range(2))
    o_prefix, lse_prefix = flashext.flash_attention(q.reshape(1, 150, heads, head_dim), prefix_k, prefix_v,
                                                    return_lse=True)
    o_prefix = o_prefix.view(3, 50, heads, head_dim)
    lse_prefix = lse_prefix.view(1, heads, 3, 50).permute(2, 1, 0, 3).reshape(3, heads, 50)
    o_suffix, lse_suffix = flashext.flash_attention(q, suffix_k, suffix_v, return_lse=True)
    o, lse = flashext.merge_attention_states(o_prefix, lse_prefix, o_suffix, lse_suffix)
    k = torch.cat([prefix_k.expand(3, -1, -1, -1), suffix_k], dim=1)
    v = torch.cat([prefix_v.expand(3, -1, -1, -1), suffix_v], dim=1)
    want, want_lse = ref.attention(q, k, v, return_lse=True)
    base = ref.attention(q, k, v, compute_dtype=torch.bfloat16)
    assert_close("cascade", o, want, base)
    torch.testing.assert_close(lse, want_lse, rtol=1e-4, atol=1e-3)


@requires_cuda
def test_merge_views_packed_and_graphs():
    o_a, o_b = (randn(100, 4, 64, dtype=torch.float16) for _ in range(2))
    lse_a, lse_b = randn(4, 100), randn(4, 100)
    o, lse = flashext.merge_attention_states(o_a, lse_a, o_b, lse_b)
    want, want_lse = ref.merge_attention_states(o_a, lse_a, o_b, lse_b)
    torch.testing.assert_close(o.double(), want, rtol=2e-3, atol=2e-3)
    # strided views (every other head), an unaligned start, a transposed lse
    wide = randn(2, 30, 8, 64, dtype=torch.bfloat16)
    lse_t = randn(2, 30, 4).transpose(1, 2)
    unaligned = torch.empty(2 * 30 * 4 * 64 + 3, dtype=torch.bfloat16, device="cuda")[3:].view(2, 30, 4, 64)
    unaligned.copy_(randn(2, 30, 4, 64, dtype=torch.bfloat16))
    lse_u = randn(2, 4, 30)
    o, lse = flashext.merge_attention_states(wide[:, :, ::2], lse_t, unaligned, lse_u)
    want, want_lse = ref.merge_attention_states(wide[:, :, ::2], lse_t, unaligned, lse_u)
    assert o.shape == (2, 30, 4, 64) and o.is_contiguous()
    torch.testing.assert_close(o.double(), want, rtol=1e-2, atol=1e-2)  # bf16 output
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
    torch.library.opcheck(torch.ops.flashext.merge_attention_states.default, (o_a, lse_a, o_b, lse_b))
    compiled = torch.compile(lambda *a: flashext.merge_attention_states(*a)[0] * 2, fullgraph=True)
    torch.testing.assert_close(compiled(o_a, lse_a, o_b, lse_b),
                               flashext.merge_attention_states(o_a, lse_a, o_b, lse_b)[0] * 2, rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    flashext.merge_attention_states(o_a, lse_a, o_b, lse_b)
    with torch.cuda.graph(graph):
        captured, _ = flashext.merge_attention_states(o_a, lse_a, o_b, lse_b)
    graph.replay()
    torch.testing.assert_close(captured, flashext.merge_attention_states(o_a, lse_a, o_b, lse_b)[0], rtol=0, atol=0)


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_merge_bad_input(device):
    o = randn(2, 16, 4, 64, dtype=torch.bfloat16, device=device)
    lse = randn(2, 4, 16, device=device)
    fn = r"flashext.merge_attention_states: "
    for args, message in (
            ((o, lse, o.half(), lse), r"argument 'o_b' must have the dtype of 'o_a'"),
            ((o, lse, o[:, :8], lse), r"argument 'o_b' must have the shape of 'o_a'"),
            ((o, lse[:, :, :8], o, lse), r"argument 'lse_a' must have shape \[2, 4, 16\]"),
            ((o, lse, o, lse.half()), r"argument 'lse_b' must be float32"),
            ((o[..., :12], lse, o[..., :12], lse), r"head dim must be a positive multiple of 8, got 12"),
            ((o[0, 0], lse, o[0, 0], lse), r"argument 'o_a' must be \(batch, seqlen, heads, head_dim\)"),
            ((o.int(), lse, o.int(), lse), r"argument 'o_a'")):
        with pytest.raises(RuntimeError, match=fn + message):
            flashext.merge_attention_states(*args)
