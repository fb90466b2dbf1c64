"""A seeded fuzz of bad calls across every public op (attention, varlen, SDPA, KV-cache decode,
merge, block-sparse, the GeLU epilogues, online softmax): each must raise a clear error that names the
op (RuntimeError, or NotImplementedError for what the SDPA entry point does not support), before
any launch; the process survives, and good calls afterwards are still correct.

Every call is one valid call with one or two mutations that make it invalid (dtype, device mix,
rank, shapes, strides, head dims, GQA divisibility, cu_seqlens length/dtype/device/values, window,
softcap, scale, approximate, out=). On meta tensors (always, CI included) this checks the words
tracing gives; on CUDA, that the kernels' own path refuses the same calls.
"""

from __future__ import annotations

import random
import re

import pytest
import torch

import flashext
from flashext import reference as ref
from flashext.testing import assert_close
from tests.helpers import CHECK_DEVICES, cu_seqlens

CALLS = 1200
OTHER_DEVICE = "cpu"
BAD_DTYPES = [torch.float64, torch.int32, torch.int64, torch.bool, torch.uint8]


def t(shape, dtype, device):
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    return torch.ones(shape, device=device).to(dtype)


def bad_head_dim(rng):
    return rng.choice([d for d in range(1, 300) if d % 8 != 0 or d > 256 or d == 0])


# ---- attention (dense, varlen, SDPA) -------------------------------------------------------------


def attention_call(rng, device):
    """A mutated flash_attention / flash_attention_varlen call: returns (fn, args, kwargs)."""
    varlen = rng.random() < 0.35
    batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim = 2, 16, 24, 4, 2, 64
    dtype = rng.choice([torch.float16, torch.bfloat16])
    shape = {"q": [batch, seqlen_q, heads, head_dim], "k": [batch, seqlen_k, heads_kv, head_dim],
             "v": [batch, seqlen_k, heads_kv, head_dim]}
    dtypes = {"q": dtype, "k": dtype, "v": dtype}
    devices = {"q": device, "k": device, "v": device}
    transpose_last = set()
    kwargs, cu = {}, {"cu_seqlens_q": [0, 10, 16], "cu_seqlens_k": [0, 20, 24]}
    cu_dtype, cu_device, cu_shape_2d, max_seqlen = torch.int32, device, False, [10, 20]
    mutations = []
    kinds = ["dtype", "dtype_mix", "device_mix", "rank", "v_shape", "head_dim", "head_dim_mix", "gqa", "zero_heads",
             "last_stride", "window", "softcap", "scale", "grid_limit"]
    kinds += ["cu_dtype", "cu_device", "cu_rank", "cu_len", "cu_empty", "max_seqlen", "many_sequences",
              "cu_values"] if varlen else ["batch_mix"]
    for kind in rng.sample(kinds, rng.choice([1, 2])):
        mutations.append(kind)
        name = rng.choice(["q", "k", "v"])
        if kind == "dtype":
            bad = rng.choice(BAD_DTYPES + [torch.float32])
            for n in dtypes:
                dtypes[n] = bad
        elif kind == "dtype_mix":
            dtypes[rng.choice(["k", "v"])] = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
        elif kind == "device_mix":
            devices[rng.choice(["k", "v"])] = OTHER_DEVICE
        elif kind == "rank":
            shape[name] = shape[name][:-1] if rng.random() < 0.5 else [1] + shape[name]
        elif kind == "v_shape":
            shape["v"][rng.choice([1, 2, 3])] += rng.choice([1, 8])
        elif kind == "head_dim":
            d = bad_head_dim(rng)
            for n in shape:
                shape[n][-1] = d
        elif kind == "head_dim_mix":
            shape["k"][-1] = shape["v"][-1] = 128
        elif kind == "gqa":
            shape["q"][2] = rng.choice([3, 5, 7])
        elif kind == "zero_heads":
            shape["k"][2] = shape["v"][2] = 0
        elif kind == "last_stride":
            transpose_last.add(name)
        elif kind == "window":
            kwargs["window_size"] = (rng.randint(-100, -2), rng.randint(-1, 5)) if rng.random() < 0.5 else \
                (rng.randint(-1, 5), rng.randint(-100, -2))
        elif kind == "softcap":
            kwargs["softcap"] = rng.choice([-1.0, -1e-3, float("nan"), float("inf")])
        elif kind == "scale":
            kwargs["softmax_scale"] = rng.choice([float("nan"), float("inf"), -float("inf"), 0.0, -0.125, -1e-30])
        elif kind == "grid_limit":  # more heads than the grid's 65535
            for n in shape:
                shape[n][2:] = [65536, 8]
                shape[n][1] = 1
        elif kind == "many_sequences":  # more sequences than the grid's 65535
            cu["cu_seqlens_q"] = [0] * 65536 + [16]
            cu["cu_seqlens_k"] = [0] * 65536 + [24]
        elif kind == "batch_mix":
            shape["k"][0] = shape["v"][0] = 1
        elif kind == "cu_dtype":
            cu_dtype = rng.choice([torch.int64, torch.float32, torch.int16])
        elif kind == "cu_device":
            cu_device = OTHER_DEVICE
        elif kind == "cu_rank":
            cu_shape_2d = True
        elif kind == "cu_len":
            cu["cu_seqlens_k"] = [0, 5, 20, 24]
        elif kind == "cu_empty":
            cu["cu_seqlens_q"] = cu["cu_seqlens_k"] = []
        elif kind == "max_seqlen":
            max_seqlen[rng.randint(0, 1)] = rng.choice([-1, -100, 2**31, 2**40])
        elif kind == "cu_values":
            which = rng.choice(["cu_seqlens_q", "cu_seqlens_k"])
            cu[which] = rng.choice([[1, 10, 16], [0, 12, 10], [0, 10, 100], [0, 15, 16] if which == "cu_seqlens_q"
                                    else [0, 22, 24]])

    def tensor(n):
        s = shape[n]
        if varlen:  # packed (total, heads, head_dim): drop the batch dim, fold it into the rows
            s = [s[0] * s[1]] + s[2:] if len(s) >= 2 else s
        x = t(s, dtypes[n], devices[n])
        if n in transpose_last and x.dim() >= 2:
            x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
        return x

    q, k, v = tensor("q"), tensor("k"), tensor("v")
    if not varlen:
        return flashext.flash_attention, (q, k, v), kwargs, mutations

    def offsets(values):
        if cu_device == "meta":
            x = torch.empty(len(values), dtype=cu_dtype, device="meta")
        else:
            x = torch.tensor(values, dtype=cu_dtype, device=cu_device)
        return x[None].expand(2, -1) if cu_shape_2d else x

    args = (q, k, v, offsets(cu["cu_seqlens_q"]), offsets(cu["cu_seqlens_k"]), *max_seqlen)
    return flashext.flash_attention_varlen, args, kwargs, mutations


def sdpa_call(rng, device):
    batch, heads, seqlen, head_dim = 2, 4, 16, 64
    q = t([batch, heads, seqlen, head_dim], torch.bfloat16, device)
    k = t([batch, heads, seqlen, head_dim], torch.bfloat16, device)
    kind = rng.choice(["mask", "dropout", "rank", "gqa", "dtype", "head_dim"])
    kwargs = {}
    if kind == "mask":
        kwargs["attn_mask"] = t([seqlen, seqlen], torch.bool, device)
    elif kind == "dropout":
        kwargs["dropout_p"] = rng.choice([0.1, 0.5])
    elif kind == "rank":
        q = q[0]
    elif kind == "gqa":
        k = k[:, :2]
    elif kind == "dtype":
        q = q.float()
        k = k.float()
    elif kind == "head_dim":
        d = bad_head_dim(rng)
        q, k = t([batch, heads, seqlen, d], torch.bfloat16, device), t([batch, heads, seqlen, d], torch.bfloat16, device)
    return flashext.scaled_dot_product_attention, (q, k, k), kwargs, [kind]


# ---- GeLU and online softmax ------------------------------------------------------------------------


def gelu_call(rng, device):
    bias_op = rng.random() < 0.5
    rows, cols = 8, 33
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
    x = t([rows, cols], dtype, device)
    other = t([cols] if bias_op else [rows, cols], dtype, device)
    approximate, out, backward = rng.choice(["none", "tanh"]), None, rng.random() < 0.25
    grad = t([rows, cols], dtype, device)
    kinds = ["dtype", "dtype_mix", "device_mix", "shape", "approximate", "scalar"]
    kinds += ["grad_shape", "grad_dtype"] if backward else ["out_shape", "out_dtype", "out_stride", "out_device"]
    kind = rng.choice(kinds)
    if kind == "dtype":
        bad = rng.choice(BAD_DTYPES)
        x, other = t(list(x.shape), bad, device), t(list(other.shape), bad, device)
    elif kind == "dtype_mix":
        other = other.to(torch.float16 if dtype != torch.float16 else torch.bfloat16)
    elif kind == "device_mix":
        other = t(list(other.shape), dtype, OTHER_DEVICE)
    elif kind == "shape":
        other = t([rng.choice([1, cols - 1, cols + 1])] if bias_op else [rows, cols + 1], dtype, device) \
            if rng.random() < 0.7 else t([2, cols] if bias_op else [rows], dtype, device)
    elif kind == "approximate":
        approximate = rng.choice(["erf", "", "Tanh", "gelu", "none "])
    elif kind == "scalar":
        x = t([], dtype, device)
        other = t([1] if bias_op else [2], dtype, device)
    elif kind == "grad_shape":
        grad = t([rows, cols + 1], dtype, device)
    elif kind == "grad_dtype":
        grad = t([rows, cols], torch.float16 if dtype != torch.float16 else torch.bfloat16, device)
    elif kind == "out_shape":
        out = t([rows, cols - 1], dtype, device)
    elif kind == "out_dtype":
        out = t([rows, cols], torch.float64 if dtype != torch.float64 else torch.float32, device)
    elif kind == "out_stride":
        out = t([rows, 2 * cols], dtype, device)[:, ::2]
    elif kind == "out_device":
        out = t([rows, cols], dtype, OTHER_DEVICE)
    ops = torch.ops.flashext
    if backward:
        op = ops.bias_gelu_backward if bias_op else ops.add_gelu_backward
        return op, (grad, x, other, approximate), {}, [kind]
    fn = flashext.bias_gelu if bias_op else flashext.fused_add_gelu
    return fn, (x, other, approximate), ({"out": out} if out is not None else {}), [kind]


def softmax_call(rng, device):
    kind = rng.choice(["scalar", "dtype"])
    x = t([], torch.float32, device) if kind == "scalar" else t([4, 9], rng.choice(BAD_DTYPES), device)
    return flashext.online_softmax, (x,), {}, [kind]


# ---- serving: KV-cache decode, merge, block-sparse ----------------------------------------------


def kvcache_call(rng, device):
    """A mutated flash_attention_with_kvcache call (dense or paged cache)."""
    batch, heads, heads_kv, head_dim, dtype = 2, 8, 2, 64, rng.choice([torch.float16, torch.bfloat16])
    paged = rng.random() < 0.4
    q = t([batch, 1, heads, head_dim], dtype, device)
    cache = [6, 16, heads_kv, head_dim] if paged else [batch, 128, heads_kv, head_dim]
    kc, vc = t(cache, dtype, device), t(cache, dtype, device)
    lens = t([batch], torch.int32, device)
    kwargs = {"block_table": t([batch, 3], torch.int32, device)} if paged else {}
    new = t([batch, 2, heads_kv, head_dim], dtype, device)
    kind = rng.choice(["dtype", "cache_dtype", "v_shape", "gqa", "k_alone", "k_shape", "num_splits", "softcap",
                       "lens_shape", "lens_stride", "head_dim"] + (["table_dtype"] if paged else ["batch"]))
    if kind == "dtype":
        q = q.float()
    elif kind == "cache_dtype":
        kc = kc.to(torch.float16 if dtype != torch.float16 else torch.bfloat16)
    elif kind == "v_shape":
        vc = vc[:, : cache[1] // 2]
    elif kind == "gqa":
        q = q[:, :, :5]
    elif kind == "batch":
        kc, vc = kc[:1], vc[:1]
    elif kind == "k_alone":
        kwargs["k"] = new
    elif kind == "k_shape":
        kwargs["k"], kwargs["v"] = new[:, :, :1], new[:, :, :1]
    elif kind == "num_splits":
        kwargs["num_splits"] = rng.choice([65, 100])
    elif kind == "softcap":
        kwargs["softcap"] = -rng.random() - 0.1
    elif kind == "lens_shape":
        lens = lens[:1]
    elif kind == "lens_stride":
        lens = t([2 * batch], torch.int32, device)[::2]
    elif kind == "table_dtype":
        kwargs["block_table"] = kwargs["block_table"].long()
    elif kind == "head_dim":
        d = bad_head_dim(rng)
        q = t([batch, 1, heads, d], dtype, device)
        kc, vc = (t(cache[:3] + [d], dtype, device) for _ in range(2))
    return flashext.flash_attention_with_kvcache, (q, kc, vc, lens), kwargs, [kind]


def merge_call(rng, device):
    o = t([2, 16, 4, 64], torch.bfloat16, device)
    lse = t([2, 4, 16], torch.float32, device)
    kind = rng.choice(["dtype_mix", "shape", "lse_shape", "lse_dtype", "head_dim", "rank", "dtype"])
    args = {"dtype_mix": (o, lse, o.half(), lse), "shape": (o, lse, o[:, :8], lse),
            "lse_shape": (o, lse[:, :, :8], o, lse), "lse_dtype": (o, lse, o, lse.half()),
            "head_dim": (o[..., :12], lse, o[..., :12], lse), "rank": (o[0, 0], lse, o[0, 0], lse),
            "dtype": (o.int(), lse, o.int(), lse)}[kind]
    return flashext.merge_attention_states, args, {}, [kind]


def block_sparse_call(rng, device):
    dtype = rng.choice([torch.float16, torch.bfloat16])
    q, k = t([2, 100, 4, 64], dtype, device), t([2, 90, 2, 64], dtype, device)
    mask, block_size = t([2, 4, 2, 2], torch.bool, device), (64, 64)
    kind = rng.choice(["mask_dtype", "mask_rows", "mask_heads", "mask_rank", "block_size", "huge_block", "dtype"])
    if kind == "mask_dtype":
        mask = mask.to(torch.uint8)
    elif kind == "mask_rows":
        mask = mask[:, :, :1]
    elif kind == "mask_heads":
        mask = mask[:, :3]
    elif kind == "mask_rank":
        mask = mask[0]
    elif kind == "block_size":
        block_size = rng.choice([(0, 64), (64, -1), (-3, 0)])
    elif kind == "huge_block":
        block_size = (2**62, 64)
    elif kind == "dtype":
        q, k = q.float(), k.float()
    return flashext.block_sparse_attention, (q, k, k, mask, block_size), {}, [kind]


MAKERS = [attention_call, attention_call, attention_call, sdpa_call, gelu_call, gelu_call, softmax_call, kvcache_call,
          merge_call, block_sparse_call]


def bad_call(i: int, device: str):
    """Make and run bad call number i (the same call on every device): (message, op name, mutations),
    or message None where the call's fault cannot show on this device (offset values on meta)."""
    rng = random.Random(20261201 + i)
    fn, args, kwargs, mutations = rng.choice(MAKERS)(rng, device)
    name = getattr(fn, "__name__", str(fn))
    if device == "meta" and "cu_values" in mutations:
        return None, name, mutations
    with pytest.raises((RuntimeError, NotImplementedError)) as info:
        fn(*args, **kwargs)
    return str(info.value).splitlines()[0], name, mutations


def same_words(a: str, b: str) -> bool:
    return re.sub(r"\b(meta|cuda(:\d+)?)\b", "DEVICE", a) == re.sub(r"\b(meta|cuda(:\d+)?)\b", "DEVICE", b)


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_bad_calls_raise_clear_errors(device):
    counts: dict[str, int] = {}
    for i in range(CALLS):
        message, name, mutations = bad_call(i, device)
        if message is None:  # offset values cannot be checked on meta tensors
            continue
        assert "flashext" in message, f"call {i} ({name}, {mutations}): the error does not name the op: {message}"
        assert "CUDA error" not in message, f"call {i} ({name}, {mutations}) reached a launch: {message}"
        if device == "cuda" and "cu_values" not in mutations and "overlap" not in message:
            # the words tracing gives (meta) are the CUDA path's, devices aside
            meta_message, _, _ = bad_call(i, "meta")
            assert same_words(meta_message, message), f"call {i} ({name}, {mutations}):\n{meta_message}\n{message}"
        counts[name] = counts.get(name, 0) + 1
    assert sum(counts.values()) >= 1000 and len(counts) >= 10, counts
    if device == "cuda":
        torch.cuda.synchronize()  # no launch went out, so no asynchronous error can be pending
        good_calls_are_still_correct()


def good_calls_are_still_correct():
    q = torch.randn(2, 100, 4, 64, device="cuda").bfloat16()
    k = torch.randn(2, 77, 2, 64, device="cuda").bfloat16()
    v = torch.randn(2, 77, 2, 64, device="cuda").bfloat16()
    assert_close("attention after the fuzz", flashext.flash_attention(q, k, v, causal=True),
                 ref.attention(q, k, v, causal=True), ref.attention(q, k, v, causal=True, compute_dtype=torch.bfloat16))
    cu_q, cu_k = cu_seqlens([30, 70]), cu_seqlens([17, 60])
    out = flashext.flash_attention_varlen(q[0], k[0], v[0], cu_q, cu_k, 70, 60)
    assert_close("varlen after the fuzz", out, ref.attention_varlen(q[0], k[0], v[0], cu_q, cu_k),
                 ref.attention_varlen(q[0], k[0], v[0], cu_q, cu_k, compute_dtype=torch.bfloat16))
    x, b = torch.randn(64, 1000, device="cuda"), torch.randn(1000, device="cuda")
    assert_close("bias_gelu after the fuzz", flashext.bias_gelu(x, b), ref.bias_gelu(x, b), torch.nn.functional.gelu(x + b))
    assert_close("add_gelu after the fuzz", flashext.fused_add_gelu(x, x), ref.add_gelu(x, x),
                 torch.nn.functional.gelu(x + x))
    assert_close("online_softmax after the fuzz", flashext.online_softmax(x), torch.softmax(x.double(), -1),
                 torch.softmax(x, -1))
    kc, vc = k[:, :64].contiguous(), v[:, :64].contiguous()
    lens = torch.tensor([5, 64], dtype=torch.int32, device="cuda")
    assert_close("decode after the fuzz", flashext.flash_attention_with_kvcache(q[:, :1], kc, vc, lens),
                 ref.attention_with_kvcache(q[:, :1], kc, vc, lens),
                 ref.attention_with_kvcache(q[:, :1], kc, vc, lens, compute_dtype=torch.bfloat16))
