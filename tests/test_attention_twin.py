"""The Triton twin of the FlashAttention forward (flashext/triton_ref/attention.py) against
flashext.reference, by the tolerance rule of DESIGN.md: at most 2× the error of plain PyTorch
attention in the same dtype, plus 1e-5, for the output and the lse. Without a GPU it runs under
the Triton interpreter on small shapes; on a GPU, on the issue's grid of shapes."""

import pytest
import torch

from flashext import reference as ref
from flashext.testing import GRADIENT_FACTOR, assert_close
from flashext.triton_ref import attention as twin
from tests.helpers import HAS_CUDA

DEVICE = "cuda" if HAS_CUDA else "cpu"
BLOCK = {} if HAS_CUDA else {"block_m": 16, "block_n": 16}
DTYPES = [torch.float16, torch.bfloat16]
if HAS_CUDA:
    SEQLENS = [(1, 1), (1, 300), (113, 203), (128, 217), (255, 1), (512, 256), (1023, 1024)]
    HEADS_KV, HEAD_DIMS = [6, 3, 2, 1], [64, 80, 128]
else:
    SEQLENS = [(1, 1), (1, 37), (13, 29), (32, 17), (40, 40)]
    HEADS_KV, HEAD_DIMS = [6, 2, 1], [16, 40]


def make(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype, packed=False):
    if packed:  # q, k, v as strided views of one packed qkv tensor (seqlen_q == seqlen_k)
        qkv = torch.randn(batch, seqlen_q, 3, heads, head_dim, device=DEVICE).to(dtype)
        return qkv[:, :, 0], qkv[:, :, 1, :heads_kv], qkv[:, :, 2, :heads_kv]
    return (torch.randn(batch, seqlen_q, heads, head_dim, device=DEVICE).to(dtype),
            torch.randn(batch, seqlen_k, heads_kv, head_dim, device=DEVICE).to(dtype),
            torch.randn(batch, seqlen_k, heads_kv, head_dim, device=DEVICE).to(dtype))


def check(q, k, v, **kwargs):
    batch, seqlen_q, heads, _ = q.shape
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)  # poisoned
    lse = torch.full((batch, heads, seqlen_q), float("nan"), device=q.device)
    twin.flash_attention(q, k, v, **kwargs, **BLOCK, out=out, lse=lse)
    want, want_lse = ref.attention(q, k, v, return_lse=True, **kwargs)
    base, base_lse = ref.attention(q, k, v, return_lse=True, compute_dtype=q.dtype, **kwargs)
    assert_close(f"twin out {kwargs}", out, want, base)
    assert_close(f"twin lse {kwargs}", lse, want_lse, base_lse.float())


@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLENS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_twin_seqlens(dtype, seqlen_q, seqlen_k, causal):
    for batch, heads_kv in ((1, HEADS_KV[0]), (3 if HAS_CUDA else 2, HEADS_KV[-1])):
        check(*make(batch, seqlen_q, seqlen_k, 6, heads_kv, HEAD_DIMS[0], dtype), causal=causal)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads_kv", HEADS_KV)
def test_twin_gqa_and_head_dims(heads_kv, head_dim):
    check(*make(2, 37, 45, 6, heads_kv, head_dim, torch.bfloat16), causal=True)


@pytest.mark.parametrize("kwargs", [{"window_size": (8, 0)}, {"window_size": (-1, 5)}, {"window_size": (3, 3)},
                                    {"softcap": 3.0}, {"softcap": 3.0, "causal": True, "window_size": (16, -1)},
                                    {"softmax_scale": 0.05}])
def test_twin_windows_softcap_scale(kwargs):
    check(*make(2, 40, 33, 6, 2, HEAD_DIMS[0], torch.float16), **kwargs)


def test_twin_packed_qkv_views():
    q, k, v = make(2, 33, 33, 6, 3, HEAD_DIMS[0], torch.bfloat16, packed=True)
    assert not q.is_contiguous()
    check(q, k, v, causal=True)


def test_twin_large_logits_stay_finite():
    q, k, v = make(1, 32, 48, 2, 1, 16, torch.float16)
    q = (q.float() * 300).to(torch.float16)  # scores of ±1e4 after scaling
    out, lse = twin.flash_attention(q, k, v, **BLOCK)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    check(q, k, v)


def test_twin_fully_masked_rows():
    q, k, v = make(1, 20, 6, 4, 2, 16, torch.float16)  # causal bottom-right: rows 0-13 see nothing
    out, lse = twin.flash_attention(q, k, v, causal=True, **BLOCK)
    assert torch.equal(out[:, :14], torch.zeros_like(out[:, :14]))
    assert torch.isneginf(lse[:, :, :14]).all()
    check(q, k, v, causal=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
def test_twin_varlen(dtype):
    lengths_q, lengths_k = [0, 1, 7, 19, 33], [3, 0, 7, 10, 40]
    cu_q = torch.tensor([0] + torch.tensor(lengths_q).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0] + torch.tensor(lengths_k).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(lengths_q), 6, 40, device=DEVICE).to(dtype)
    k = torch.randn(sum(lengths_k), 2, 40, device=DEVICE).to(dtype)
    v = torch.randn(sum(lengths_k), 2, 40, device=DEVICE).to(dtype)
    out, lse = twin.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True, **BLOCK)
    want, want_lse = ref.attention_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=True)
    base, base_lse = ref.attention_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=True, compute_dtype=dtype)
    assert_close("twin varlen out", out, want, base)
    assert_close("twin varlen lse", lse, want_lse, base_lse.float())


# ---- the backward twin ----------------------------------------------------------------------------


def check_grads(q, k, v, dlse=False, **kwargs):
    out, lse = twin.flash_attention(q, k, v, **kwargs, **BLOCK)
    dout = torch.randn(*q.shape, device=DEVICE).to(q.dtype)
    lse_grad = torch.randn(*lse.shape, device=DEVICE) if dlse else None
    got = twin.flash_attention_backward(dout, q, k, v, out, lse, dlse=lse_grad, **kwargs, **BLOCK)
    want = ref.attention_backward(dout, q, k, v, dlse=lse_grad, **kwargs)
    base = ref.attention_backward(dout, q, k, v, dlse=lse_grad, compute_dtype=q.dtype, **kwargs)
    for name, g, w, b in zip(("dq", "dk", "dv"), got, want, base):
        assert_close(f"twin {name} {kwargs}", g, w, b, factor=GRADIENT_FACTOR)


@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLENS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_twin_backward_seqlens(dtype, seqlen_q, seqlen_k, causal):
    # Two query heads per KV head. With one key the exact dk is 0, and so is PyTorch's (P = 1
    # cancels exactly); the D = rowsum(dO ∘ O) form leaves the fp32 rounding of two dot products
    # per query row, summed into dk over every row of the group: under MQA (6 heads × 255 rows)
    # that sum reaches the 1e-5 floor. Grouping itself is checked below and in the options test.
    check_grads(*make(2, seqlen_q, seqlen_k, 6, 3, HEAD_DIMS[0], dtype), causal=causal)


@pytest.mark.parametrize("head_dim", [256, 200] if HAS_CUDA else [136])
def test_twin_backward_large_head_dims(head_dim):
    # above 128 columns the backward's tiles are halved and unpipelined to fit shared memory
    check_grads(*make(2, 130, 97, 4, 2, head_dim, torch.bfloat16), causal=True)
    check_grads(*make(1, 64, 200, 2, 1, head_dim, torch.float16))


@pytest.mark.parametrize("kwargs", [{"window_size": (8, 0)}, {"window_size": (3, 3)}, {"softcap": 3.0, "causal": True},
                                    {"softmax_scale": 0.05}, {"causal": True, "dlse": True}])
def test_twin_backward_options(kwargs):
    check_grads(*make(2, 40, 33, 6, 2, HEAD_DIMS[-1], torch.float16), **kwargs)


def test_twin_backward_varlen_and_empty_rows():
    lengths_q, lengths_k = [0, 1, 7, 19], [3, 0, 7, 10]
    cu_q = torch.tensor([0] + torch.tensor(lengths_q).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0] + torch.tensor(lengths_k).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(lengths_q), 6, 16, device=DEVICE).to(torch.bfloat16)
    k = torch.randn(sum(lengths_k), 2, 16, device=DEVICE).to(torch.bfloat16)
    v = torch.randn(sum(lengths_k), 2, 16, device=DEVICE).to(torch.bfloat16)
    args = (cu_q, cu_k, max(lengths_q), max(lengths_k))
    out, lse = twin.flash_attention_varlen(q, k, v, *args, causal=True, **BLOCK)
    dout = torch.randn(*q.shape, device=DEVICE).to(q.dtype)
    got = twin.flash_attention_varlen_backward(dout, q, k, v, out, lse, *args, causal=True, **BLOCK)
    want = ref.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, causal=True)
    base = ref.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, causal=True, compute_dtype=q.dtype)
    for name, g, w, b in zip(("dq", "dk", "dv"), got, want, base):
        assert_close(f"twin varlen {name}", g, w, b, factor=GRADIENT_FACTOR)
    # row 0 is the second sequence's only query, which has no key: dq = 0
    assert torch.equal(got[0][0], torch.zeros_like(got[0][0]))


# ---- block-sparse -----------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [(16, 16), (5, 7), (1, 1), (64, 32)])
@pytest.mark.parametrize("causal", [False, True])
def test_twin_block_sparse(block_size, causal):
    q, k, v = make(2, 40, 45, 4, 2, HEAD_DIMS[0], torch.float16)
    rows, cols = block_size
    shape = (2, 1, -(-40 // rows), -(-45 // cols))  # per batch entry, shared by the heads
    for density in (0.0, 0.3, 1.0):
        block_mask = torch.rand(shape, device=DEVICE) < density
        out, lse = twin.block_sparse_attention(q, k, v, block_mask, block_size, causal=causal, **BLOCK)
        want, want_lse = ref.block_sparse_attention(q, k, v, block_mask, block_size, causal=causal, return_lse=True)
        base = ref.block_sparse_attention(q, k, v, block_mask, block_size, causal=causal, compute_dtype=q.dtype)
        assert_close(f"twin block-sparse {block_size} {density}", out, want, base)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))


def test_reference_block_sparse_full_and_empty():
    q, k, v = (t.double() for t in make(1, 20, 30, 2, 2, 16, torch.float16))
    full = torch.ones(1, 1, 3, 4, dtype=torch.bool, device=DEVICE)
    torch.testing.assert_close(ref.block_sparse_attention(q, k, v, full, (8, 8), causal=True),
                               ref.attention(q, k, v, causal=True))
    empty, lse = ref.block_sparse_attention(q, k, v, ~full, (8, 8), return_lse=True)
    assert (empty == 0).all() and torch.isneginf(lse).all()
