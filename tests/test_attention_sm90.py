"""The Hopper forward (csrc/kernels/attention/flash_fwd_sm90.cu) through its private op
flashext::_flash_attn_fwd_sm90, and the Hopper backward (flash_bwd_sm90.cu) through
flashext::_flash_attn_bwd_sm90 (head dims up to 128, dense, full or causal), against the reference by
DESIGN.md's rule: D = 64, 128 and 256, dense, fp16 / bf16, every mask and option (flash_attention
and flash_attention_varlen dispatch to the forward at D = 128 and 256 and at long D = 64, and to
the backward at D = 64 and 128, where the whole attention suite runs on them too; the C++ test
covers varlen at every D).
The GPU tests run on an sm_90 GPU with a build holding sm_90a code and skip elsewhere with the
reason; the shape and argument checks run on meta tensors everywhere."""

import pytest
import torch

import flashext
from flashext import attention, reference as ref
from flashext.testing import GRADIENT_FACTOR, assert_close
from tests.helpers import HALF_DTYPES as DTYPES, HALF_IDS as DTYPE_IDS, at_offset, check_attention, kernel_names
from tests.helpers import make_qkv

requires_hopper = pytest.mark.skipif(not attention._hopper_forward_available(),
                                     reason="needs an sm_90 GPU and a build with sm_90a code")
attend = attention._flash_attention_sm90
SEQLENS = [(1, 1), (1, 300), (113, 203), (128, 128), (255, 1), (300, 257), (1023, 1024), (2048, 2048)]
HEAD_DIMS = [64, 128, 256]


@requires_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLENS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_seqlens_batches_gqa(dtype, causal, seqlen_q, seqlen_k, head_dim):
    for batch, heads_kv in ((1, 6), (3, 2), (2, 1)):
        check_attention(*make_qkv(batch, seqlen_q, seqlen_k, 6, heads_kv, head_dim, dtype), attend, causal=causal)


@requires_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_causal_units_on_persistent_ctas(dtype, head_dim):
    # 16 query blocks of 128 rows (masked calls under 4K keys take 128-row blocks at every D), 11
    # heads and 3 sequences: 264 units of two blocks, two whole rounds on 132 SMs, so each CTA walks
    # units (and, with fewer keys, blocks whose rows see no key)
    for seqlen_q, seqlen_k in ((2048, 2048), (2000, 1500)):
        check_attention(*make_qkv(3, seqlen_q, seqlen_k, 11, 1, head_dim, dtype), attend, causal=True)


@requires_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_short_last_blocks_on_persistent_ctas(dtype, head_dim):
    # Unmasked dense calls on fewer CTAs than tiles (a CTA per SM striding over them), whose last
    # query block of each head is short: 1000 rows are 5 blocks of 192 and 40 rows at D = 64 (two
    # of its three consumer warpgroups without a row), 1050 are 8 of 128 and 26 rows at D = 128
    # and 256 (one of two); 3 sequences of 11 query heads (GQA 11 / 1 and MHA), 198 or 297 tiles.
    for heads_kv in (1, 11):
        check_attention(*make_qkv(3, 1000 if head_dim == 64 else 1050, 777, 11, heads_kv, head_dim, dtype), attend)


@requires_hopper
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_long_masked_calls_at_d64(dtype):
    # D = 64 under a mask that leaves a row 4K keys or more: 192-row blocks on three consumers.
    # Causal at 4416: 23 query blocks, 12 units per head (the middle block alone in its unit),
    # 132 units on 132 SMs (paired); causal 6000 queries on 4096 keys (bottom-right): the first
    # 1904 rows see no key, so units pair a block with keys and one without (its O written at
    # once, after the previous tile's pending O), 176 units walked by 132 CTAs; a short query block
    # against long keys; a window 4201 keys wide.
    check_attention(*make_qkv(1, 4416, 4416, 11, 1, 64, dtype), attend, causal=True)
    check_attention(*make_qkv(1, 6000, 4096, 11, 1, 64, dtype), attend, causal=True)
    check_attention(*make_qkv(1, 200, 4300, 4, 2, 64, dtype), attend, causal=True)
    check_attention(*make_qkv(1, 700, 4500, 4, 2, 64, dtype), attend, window_size=(4000, 200))


@requires_hopper
@pytest.mark.parametrize("kwargs", [{"window_size": (100, 50)}, {"window_size": (0, 0)}, {"window_size": (7, -1)},
                                    {"softcap": 5.0, "causal": True}, {"softmax_scale": 0.05},
                                    {"causal": True, "window_size": (64, 0)}])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_options(dtype, head_dim, kwargs):
    check_attention(*make_qkv(2, 333, 517, 4, 2, head_dim, dtype), attend, **kwargs)


@requires_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_layouts(dtype, head_dim):
    # strided views of one packed qkv, a transposed (B, H, S, D) layout, and an unaligned start
    check_attention(*make_qkv(2, 257, 257, 4, 4, head_dim, dtype, packed=True), attend, causal=True)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in make_qkv(2, 200, 300, 4, 2, head_dim, dtype))
    check_attention(q, k, v, attend)
    q, k, v = make_qkv(1, 150, 170, 2, 2, head_dim, dtype)
    check_attention(at_offset(q, 3), at_offset(k, 5), v, attend)


@requires_hopper
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_huge_logits_stay_finite(head_dim):
    q, k, v = make_qkv(1, 256, 256, 2, 2, head_dim, torch.bfloat16, scale=100.0, k_scale=100.0)
    check_attention(q, k, v, attend, causal=True)


@requires_hopper
@pytest.mark.parametrize("head_dim", [8, 40, 80, 96, 112, 136, 200, 248])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_on_the_next_kernel(causal, head_dim):
    # Head dims between the compiled ones run on the next (64, 128, 256): the TMA reads the columns
    # past the tensors' head dim as zeros and the epilogue stores only the tensors' own. Packed views
    # too, whose rows continue into the next head's columns (which must not be read as this head's).
    for batch, seqlen_q, seqlen_k, packed in ((2, 300, 257, False), (1, 1023, 1024, False), (2, 200, 200, True)):
        q, k, v = make_qkv(batch, seqlen_q, seqlen_k, 4, 2 if not packed else 4, head_dim, torch.bfloat16,
                           packed=packed)
        check_attention(q, k, v, attend, causal=causal)  # (outputs poisoned first: every element checked)


@requires_hopper
def test_refusals_name_the_function():
    q, k, v = make_qkv(1, 16, 0, 2, 2, 128, torch.float16)
    with pytest.raises(RuntimeError, match=r"flashext._flash_attn_fwd_sm90: argument 'k' must hold"):
        attend(q, k, v)


@requires_hopper
def test_opcheck():
    q, k, v = make_qkv(1, 130, 70, 4, 2, 128, torch.bfloat16)
    torch.library.opcheck(torch.ops.flashext._flash_attn_fwd_sm90.default, (q, k, v, True, None, -1, -1, 0.0))


def test_meta_shapes_and_checks():
    q, k, v = make_qkv(2, 33, 45, 4, 2, 128, torch.float16, device="meta")
    out, lse = attend(q, k, v, causal=True)
    assert out.shape == q.shape and out.device.type == "meta" and lse.shape == (2, 4, 33)
    with pytest.raises(RuntimeError, match=r"flashext._flash_attn_fwd_sm90: head dim must be a multiple of 8"):
        attend(*make_qkv(1, 8, 8, 2, 2, 100, torch.float16, device="meta"))
    with pytest.raises(RuntimeError, match=r"flashext._flash_attn_fwd_sm90: the number of query heads"):
        attend(*make_qkv(1, 8, 8, 3, 2, 128, torch.float16, device="meta"))


# ---- the Hopper backward -----------------------------------------------------------------------


def check_backward(q, k, v, causal=False):
    """_flash_attn_bwd_sm90's (dq, dk, dv) from flash_attention's out and lse, against the float64
    reference by the gradient rule."""
    out, lse = flashext.flash_attention(q, k, v, causal=causal, return_lse=True)
    dout = torch.randn_like(q)
    got = attention._flash_attention_backward_sm90(dout, q, k, v, out, lse, causal=causal)
    want = ref.attention_backward(dout, q, k, v, causal=causal)
    base = ref.attention_backward(dout, q, k, v, causal=causal, compute_dtype=q.dtype)
    for name, g, w, b, t in zip(("dq", "dk", "dv"), got, want, base, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype, name
        assert_close(f"sm90 {name} {tuple(q.shape)} {tuple(k.shape)} causal={causal}", g, w, b, factor=GRADIENT_FACTOR)


@requires_hopper
@pytest.mark.parametrize("head_dim", [64, 128])  # 128- and 64-query steps
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 300), (64, 128), (113, 203), (300, 257), (255, 1), (1024, 1024)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_backward_against_the_reference(dtype, causal, seqlen_q, seqlen_k, head_dim):
    # (255 × 1: every row sees one key, so dS = 0 and the exact dq and dk are 0; D summed in dP's
    # order keeps that exact however many rows a key's group adds up.)
    layouts = ((1, 4), (2, 2), (2, 1))
    for batch, heads_kv in layouts:
        check_backward(*make_qkv(batch, seqlen_q, seqlen_k, 4, heads_kv, head_dim, dtype), causal=causal)


@requires_hopper
@pytest.mark.parametrize("head_dim", [8, 40, 96, 120])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_head_dims_on_the_next_kernel(causal, head_dim):
    # Head dims under 64 and 128 on those kernels: q, k, v and dO read with zero columns past the
    # head dim, dk and dv stored and dq converted in the tensors' own columns only. Packed views too.
    for batch, seqlen_q, seqlen_k, heads_kv, packed in ((2, 300, 257, 2, False), (1, 200, 200, 4, True)):
        check_backward(*make_qkv(batch, seqlen_q, seqlen_k, 4, heads_kv, head_dim, torch.bfloat16, packed=packed),
                       causal=causal)


@requires_hopper
def test_backward_refusals_name_the_function():
    q, k, v = make_qkv(1, 16, 16, 2, 2, 136, torch.float16)
    out, lse = flashext.flash_attention(q, k, v, return_lse=True)
    with pytest.raises(RuntimeError, match=r"flashext._flash_attn_bwd_sm90: head dim must be at most 128, got 136"):
        attention._flash_attention_backward_sm90(torch.randn_like(q), q, k, v, out, lse)


def test_backward_meta_shapes():
    q, k, v = make_qkv(2, 33, 45, 4, 2, 128, torch.float16, device="meta")
    out = torch.empty_like(q)
    lse = torch.empty(2, 4, 33, device="meta")
    dq, dk, dv = attention._flash_attention_backward_sm90(torch.empty_like(q), q, k, v, out, lse, causal=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and dq.device.type == "meta"


@requires_hopper
@pytest.mark.parametrize("mode", [True, "always"])
def test_dispatch_by_head_dim_and_length(mode):
    # flash_attention's forward: by default the Hopper kernel on its D = 128 and 256 kernels (head
    # dims 72-256) at every length and on its D = 64 kernel (head dims 8-64) from 512 keys, where it
    # is the faster; the FA2-design kernel elsewhere; "always" takes D <= 64 at every length too.
    previous = flashext.use_hopper_kernels(mode)
    try:
        for head_dim, seqlen_k, default in ((64, 511, False), (64, 512, True), (128, 33, True), (256, 33, True),
                                            (96, 33, True), (40, 511, False), (40, 512, True)):
            q, k, v = make_qkv(1, 64, seqlen_k, 2, 2, head_dim, torch.bfloat16)
            names = kernel_names(lambda: flashext.flash_attention(q, k, v))
            hopper = default or (mode == "always" and head_dim <= 64)
            assert ("flash_fwd_sm90_kernel" in names) == hopper, (head_dim, seqlen_k, names[:300])
            assert ("flash_fwd_kernel" in names) == (not hopper), (head_dim, seqlen_k, names[:300])
    finally:
        flashext.use_hopper_kernels(previous)
