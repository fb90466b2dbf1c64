"""flashext.reference's attention and online softmax: the definitions the attention kernels are
judged against, checked against PyTorch's own SDPA and against brute-force masks (CPU, float64)."""

import pytest
import torch
import torch.nn.functional as F

from flashext import reference as ref


def qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype=torch.float64):
    return (torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype),
            torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype),
            torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype))


def sdpa(q, k, v, **kwargs):
    group = q.shape[2] // k.shape[2]
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(group, 2).transpose(1, 2),
        v.repeat_interleave(group, 2).transpose(1, 2), **kwargs).transpose(1, 2)


@pytest.mark.parametrize("heads_kv", [6, 3, 1])
def test_matches_sdpa_with_gqa(heads_kv):
    q, k, v = qkv(2, 17, 23, 6, heads_kv, 32)
    torch.testing.assert_close(ref.attention(q, k, v), sdpa(q, k, v), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ref.attention(q, k, v, softmax_scale=0.3), sdpa(q, k, v, scale=0.3), rtol=1e-10, atol=1e-10)


def test_causal_square_matches_sdpa():
    q, k, v = qkv(2, 31, 31, 4, 2, 16)
    torch.testing.assert_close(ref.attention(q, k, v, causal=True), sdpa(q, k, v, is_causal=True), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(5, 9), (9, 5), (1, 7), (7, 1), (6, 6)])
@pytest.mark.parametrize("causal, window", [(True, (-1, -1)), (False, (2, 1)), (False, (-1, 0)), (False, (0, -1)), (True, (3, -1))])
def test_mask_is_bottom_right_aligned(seqlen_q, seqlen_k, causal, window):
    mask = ref.attention_mask(seqlen_q, seqlen_k, causal, window)
    left, right = window
    right = 0 if causal else right
    for i in range(seqlen_q):
        for j in range(seqlen_k):
            diag = i + seqlen_k - seqlen_q
            want = (left < 0 or j >= diag - left) and (right < 0 or j <= diag + right)
            assert bool(mask[i, j]) == want, (i, j)


def test_masked_attention_equals_sdpa_with_that_mask():
    q, k, v = qkv(1, 9, 14, 2, 2, 8)
    mask = ref.attention_mask(9, 14, False, (3, 2))
    torch.testing.assert_close(ref.attention(q, k, v, window_size=(3, 2)), sdpa(q, k, v, attn_mask=mask),
                               rtol=1e-10, atol=1e-10)


def test_softcap():
    q, k, v = qkv(1, 5, 7, 2, 1, 8)
    cap = 1.5
    scores = (q.transpose(1, 2) @ k.repeat_interleave(2, 2).permute(0, 2, 3, 1)) * 8**-0.5
    probs = torch.softmax(cap * torch.tanh(scores / cap), dim=-1)
    want = (probs @ v.repeat_interleave(2, 2).transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(ref.attention(q, k, v, softcap=cap), want, rtol=1e-10, atol=1e-10)


def test_fully_masked_rows_are_zero_with_minus_inf_lse():
    q, k, v = qkv(1, 10, 4, 2, 2, 8)  # causal, bottom-right: rows 0-5 see no key
    out, lse = ref.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out[:, :6], torch.zeros_like(out[:, :6]))
    assert torch.isneginf(lse[:, :, :6]).all() and torch.isfinite(lse[:, :, 6:]).all()
    assert not torch.isnan(out).any()


def test_lse_is_natural_log():
    q, k, v = qkv(1, 4, 6, 1, 1, 8)
    _, lse = ref.attention(q, k, v, return_lse=True)
    scores = q[0, :, 0] @ k[0, :, 0].T * 8**-0.5
    torch.testing.assert_close(lse[0, 0].double(), torch.log(torch.exp(scores).sum(-1)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kwargs", [{}, {"causal": True}, {"window_size": (5, 2)}, {"softcap": 2.0, "causal": True},
                                    {"causal": True, "window_size": (4, -1)}])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(37, 53), (53, 37), (1, 40), (40, 1)])
def test_tiled_loop_equals_attention(kwargs, seqlen_q, seqlen_k):
    q, k, v = qkv(2, seqlen_q, seqlen_k, 6, 2, 16)
    out, lse = ref.attention(q, k, v, return_lse=True, **kwargs)
    tiled_out, tiled_lse = ref.attention_tiled(q, k, v, block_n=16, **kwargs)
    torch.testing.assert_close(tiled_out, out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(tiled_lse, lse, rtol=1e-6, atol=1e-6)


def test_varlen_is_attention_per_sequence():
    lengths_q, lengths_k = [0, 1, 7, 19], [3, 0, 7, 10]
    cu_q = torch.tensor([0] + list(torch.tensor(lengths_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lengths_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(lengths_q), 4, 8, dtype=torch.float64)
    k = torch.randn(sum(lengths_k), 2, 8, dtype=torch.float64)
    v = torch.randn(sum(lengths_k), 2, 8, dtype=torch.float64)
    out, lse = ref.attention_varlen(q, k, v, cu_q, cu_k, causal=True, return_lse=True)
    assert out.shape == q.shape and lse.shape == (4, sum(lengths_q))
    b = 3
    qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
    torch.testing.assert_close(out[qs], ref.attention(q[None, qs], k[None, ks], v[None, ks], causal=True)[0])
    row = int(cu_q[1])  # sequence 1: one query, no keys
    assert torch.equal(out[row], torch.zeros_like(out[row])) and torch.isneginf(lse[:, row]).all()


@pytest.mark.parametrize("tile", [1, 7, 64, 1000])
def test_online_softmax_equals_softmax(tile):
    x = torch.randn(5, 300, dtype=torch.float64) * 20
    x[0, :150] = float("-inf")  # a row whose first tiles are all masked
    torch.testing.assert_close(ref.online_softmax(x, tile), torch.softmax(x, dim=-1), rtol=1e-12, atol=1e-15)


def test_online_softmax_two_tiles_walkthrough():
    # "two tiles, never the whole row": the second tile raises the max, the first tile's sum is rescaled
    x = torch.tensor([[1.0, 2.0, 3.0, 10.0, 0.0, -1.0]], dtype=torch.float64)
    torch.testing.assert_close(ref.online_softmax(x, 3), torch.softmax(x, dim=-1), rtol=1e-15, atol=1e-15)


# ---- the backward's definition --------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, seqlen_q, seqlen_k, heads_kv", [
    ({}, 7, 9, 2), ({"causal": True}, 9, 9, 1), ({"causal": True}, 6, 11, 4), ({"window_size": (3, 2)}, 10, 12, 2),
    ({"softcap": 5.0, "causal": True}, 8, 8, 4), ({"softmax_scale": 0.3}, 5, 5, 1)])
def test_backward_equals_autograd_of_attention(kwargs, seqlen_q, seqlen_k, heads_kv):
    # Shapes where every query sees a key (autograd through attention()'s torch.where is NaN
    # for a row that sees none; attention_backward gives 0 there, tested below).
    q, k, v = (t.requires_grad_() for t in qkv(2, seqlen_q, seqlen_k, 4, heads_kv, 16))
    dout = torch.randn(2, seqlen_q, 4, 16, dtype=torch.float64)
    want = torch.autograd.grad((ref.attention(q, k, v, **kwargs) * dout).sum(), (q, k, v))
    got = ref.attention_backward(dout, q.detach(), k.detach(), v.detach(), **kwargs)
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"d{name}")


def test_backward_through_the_lse():
    q, k, v = (t.requires_grad_() for t in qkv(2, 6, 9, 4, 2, 16))
    dout, dlse = torch.randn(2, 6, 4, 16, dtype=torch.float64), torch.randn(2, 4, 6, dtype=torch.float64)
    qf, kf, vf, scale = ref._heads_first(q, k, v, None, torch.float64)
    lse = torch.logsumexp(qf @ kf.transpose(-1, -2) * scale, dim=-1)  # fp64 (attention() returns fp32)
    want = torch.autograd.grad((ref.attention(q, k, v) * dout).sum() + (lse * dlse).sum(), (q, k, v))
    got = ref.attention_backward(dout, q.detach(), k.detach(), v.detach(), dlse=dlse)
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=f"d{name}")


def test_backward_of_rows_that_see_no_key_is_zero():
    q, k, v = qkv(1, 8, 4, 2, 2, 16)  # causal, bottom-right: queries 0-3 see no key
    dout = torch.randn(1, 8, 2, 16, dtype=torch.float64)
    dq, dk, dv = ref.attention_backward(dout, q, k, v, causal=True)
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    assert (dq[:, :4] == 0).all()
    # the rows that see keys get the gradients of attention() on those rows alone
    want = ref.attention_backward(dout[:, 4:], q[:, 4:], k, v, causal=True)
    torch.testing.assert_close(dq[:, 4:], want[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dk, want[1], rtol=1e-12, atol=1e-12)


def test_gradcheck_of_the_definition():
    q, k, v = (t.requires_grad_() for t in qkv(1, 5, 6, 2, 1, 8))
    assert torch.autograd.gradcheck(lambda q, k, v: ref.attention(q, k, v, softcap=3.0, window_size=(2, 1)), (q, k, v))


def test_varlen_backward_is_backward_per_sequence():
    cu_q = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 6, 12], dtype=torch.int32)
    q, k, v = torch.randn(8, 4, 16, dtype=torch.float64), torch.randn(12, 2, 16, dtype=torch.float64), \
        torch.randn(12, 2, 16, dtype=torch.float64)
    dout = torch.randn(8, 4, 16, dtype=torch.float64)
    dq, dk, dv = ref.attention_varlen_backward(dout, q, k, v, cu_q, cu_k, causal=True)
    for b in range(3):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        want = ref.attention_backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks], causal=True)
        torch.testing.assert_close(dq[qs], want[0][0])
        torch.testing.assert_close(dk[ks], want[1][0])
        torch.testing.assert_close(dv[ks], want[2][0])
    assert (dk[4:6] == 0).all()  # the sequence with no query (lengths 3, 0, 5 against 4, 2, 6)
