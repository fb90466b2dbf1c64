"""The autograd kernels of attention (csrc/torch/autograd.cpp) on meta tensors, so without a GPU:
which op each backward calls, with what, which gradients come back in which layout, no graph node
when nothing needs a gradient, and the refusal of a double backward. The gradients' values are
tests/test_attention_backward.py's (GPU)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import flashext


def meta(*shape, grad=True):
    return torch.empty(*shape, device="meta", dtype=torch.bfloat16, requires_grad=grad)


def called_ops(fn, *inputs):
    """The flashext ops a function of inputs runs, forward and backward, traced on fake tensors."""
    graph = make_fx(fn, tracing_mode="fake")(*inputs)
    return [str(n.target) for n in graph.graph.nodes if n.op == "call_function" and "flashext" in str(n.target)]


def test_dense_backward_calls_the_backward_op_with_the_forward_options():
    def step(q, k, v, dout):
        out = flashext.flash_attention(q, k, v, causal=True, softmax_scale=0.3, window_size=(5, 0), softcap=2.0,
                                       deterministic=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    q, k, v = (torch.randn(2, 9, h, 64, dtype=torch.bfloat16, requires_grad=True) for h in (4, 2, 2))
    graph = make_fx(step, tracing_mode="fake")(q, k, v, torch.randn(2, 9, 4, 64, dtype=torch.bfloat16))
    calls = [n for n in graph.graph.nodes if n.op == "call_function" and "flashext" in str(n.target)]
    assert [str(n.target) for n in calls] == ["flashext.flash_attn_fwd.default", "flashext.flash_attn_bwd.default"]
    fwd, bwd = calls
    # flash_attn_bwd(dout, q, k, v, out, lse, dlse, causal, scale, left, right, softcap, align, deterministic, like)
    assert bwd.args[7:] == fwd.args[3:] and bwd.args[6] is None
    assert bwd.args[1:4] == fwd.args[:3]


def test_gradients_of_out_and_lse_alone_and_together():
    q, k, v = meta(2, 7, 4, 32), meta(2, 11, 1, 32), meta(2, 11, 1, 32)
    out, lse = flashext.flash_attention(q, k, v, return_lse=True)
    assert out.grad_fn is not None and lse.grad_fn is out.grad_fn
    dq, dk, dv = torch.autograd.grad((out, lse), (q, k, v), (torch.empty_like(out), torch.empty_like(lse)))
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    out, lse = flashext.flash_attention(q, k, v, return_lse=True)
    (dq,) = torch.autograd.grad(lse, (q,), torch.empty_like(lse))  # no dout: the backward makes zeros
    assert dq.shape == q.shape
    # only the inputs that ask for a gradient get one
    out = flashext.flash_attention(q, k.detach(), v)
    assert torch.autograd.grad(out, (v,), torch.empty_like(out))[0].shape == v.shape


def test_varlen_backward_calls_its_op():
    def step(q, k, v, cu_q, cu_k, dout):
        out = flashext.flash_attention_varlen(q, k, v, cu_q, cu_k, 6, 9, causal=True, validate=False)
        return torch.autograd.grad(out, (q, k, v), dout)

    q, k, v = (torch.randn(n, h, 64, dtype=torch.bfloat16, requires_grad=True) for n, h in ((10, 4), (15, 2), (15, 2)))
    cu_q, cu_k = torch.tensor([0, 4, 10], dtype=torch.int32), torch.tensor([0, 6, 15], dtype=torch.int32)
    assert called_ops(step, q, k, v, cu_q, cu_k, torch.randn(10, 4, 64, dtype=torch.bfloat16)) == [
        "flashext.flash_attn_varlen_fwd.default", "flashext.flash_attn_varlen_bwd.default"]


def test_sdpa_gradients_come_back_in_the_inputs_layout():
    q, k, v = (meta(2, 9, 4, 64).transpose(1, 2) for _ in range(3))  # (B, H, S, D) views of (B, S, H, D)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flashext.scaled_dot_product_attention(q, k, v, is_causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.empty_like(out))
    for g, t in zip((dq, dk, dv), (q, k, v)):
        assert g.shape == t.shape and g.stride() == t.stride()


def test_no_graph_node_without_gradients():
    q, k, v = meta(1, 5, 2, 16), meta(1, 5, 2, 16), meta(1, 5, 2, 16)
    with torch.no_grad():
        assert flashext.flash_attention(q, k, v).grad_fn is None
    detached = [t.detach() for t in (q, k, v)]
    out = flashext.flash_attention(*detached)
    assert out.grad_fn is None and not out.requires_grad


def test_double_backward_is_refused():
    q, k, v = meta(1, 5, 2, 16), meta(1, 5, 2, 16), meta(1, 5, 2, 16)
    out = flashext.flash_attention(q, k, v)
    (dq,) = torch.autograd.grad(out, (q,), torch.empty_like(out), create_graph=True)
    assert dq.requires_grad
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(dq, (q,), torch.empty_like(dq))
