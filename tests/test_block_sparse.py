"""flashext.block_sparse_attention against flashext.reference.block_sparse_attention (GPU): block
sizes aligned with the kernel's tiles and not (1 × 1, 7 × 33, 200 × 50), masks empty, full, random
and one block per row, broadcast batch / head dims, GQA, causal and windows, softcap, every head
dim; a full mask at tile-aligned blocks is bitwise flash_attention; poisoned outputs; CUDA-graph
replay with new mask values; opcheck and torch.compile; bad input on meta and CUDA."""

import pytest
import torch

import flashext
from flashext import reference as ref
from flashext.testing import assert_close, poison_cache
from tests.helpers import CHECK_DEVICES, HALF_DTYPES, HALF_IDS, make_qkv, requires_cuda


def blocks(batch, heads, seqlen_q, seqlen_k, block_size, density, seed=0, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    rows, cols = -(-seqlen_q // block_size[0]), -(-seqlen_k // block_size[1])
    return (torch.rand(batch, heads, rows, cols, generator=g) < density).to(device)


def check(q, k, v, block_mask, block_size, **kwargs):
    poison_cache(q)
    out, lse = flashext.block_sparse_attention(q, k, v, block_mask, block_size, return_lse=True, **kwargs)
    want, want_lse = ref.block_sparse_attention(q, k, v, block_mask, block_size, return_lse=True, **kwargs)
    base, base_lse = ref.block_sparse_attention(q, k, v, block_mask, block_size, return_lse=True,
                                                compute_dtype=q.dtype, **kwargs)
    assert_close(f"block-sparse out {block_size} {kwargs}", out, want, base)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse)), "rows that see no key"
    assert_close(f"block-sparse lse {block_size} {kwargs}", lse[finite], want_lse[finite], base_lse[finite].float())
    return out, lse


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("block_size", [(128, 128), (64, 64), (128, 64), (7, 33), (200, 50), (1, 1)])
def test_random_masks(dtype, head_dim, block_size):
    batch, seqlen_q, seqlen_k, heads, heads_kv = 2, 300, 333, 4, 2
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype)
    mask = blocks(batch, heads, seqlen_q, seqlen_k, block_size, 0.3, seed=head_dim)
    check(q, k, v, mask, block_size)
    check(q, k, v, mask, block_size, causal=True)


@requires_cuda
@pytest.mark.parametrize("block_size", [(128, 128), (64, 64), (16, 100)])
def test_special_masks(block_size):
    q, k, v = make_qkv(2, 257, 257, 4, 4, 128, torch.bfloat16)
    rows, cols = -(-257 // block_size[0]), -(-257 // block_size[1])
    out, lse = check(q, k, v, torch.zeros(2, 4, rows, cols, dtype=torch.bool, device="cuda"), block_size)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()  # empty: nothing seen
    check(q, k, v, torch.ones(1, 1, rows, cols, dtype=torch.bool, device="cuda"), block_size)  # full, broadcast
    diagonal = torch.zeros(1, 4, rows, cols, dtype=torch.bool, device="cuda")
    for i in range(rows):
        diagonal[0, :, i, min(i * block_size[0] // block_size[1], cols - 1)] = True  # one block per row
    check(q, k, v, diagonal, block_size)
    check(q, k, v, blocks(2, 1, 257, 257, block_size, 0.5), block_size, window_size=(100, 20), softcap=30.0)


@requires_cuda
def test_mask_layouts_and_edges():
    """Expanded (stride-0) and non-contiguous masks, causal with Sq > Sk, no keys at all."""
    q, k, v = make_qkv(2, 200, 150, 4, 2, 64, torch.float16)
    one = blocks(1, 1, 200, 150, (50, 30), 0.5)
    check(q, k, v, one.expand(2, 4, -1, -1), (50, 30))  # batch and head strides 0
    strided = blocks(2, 4, 200, 150, (50, 30), 0.5).transpose(-1, -2).contiguous().transpose(-1, -2)
    assert strided.stride(-1) != 1
    check(q, k, v, strided, (50, 30), causal=True)  # Sq > Sk: the first 50 rows see no key
    out, lse = flashext.block_sparse_attention(q, k[:, :0], v[:, :0], one[..., :0], (50, 30), return_lse=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


@requires_cuda
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=HALF_IDS)
def test_full_mask_is_flash_attention(dtype):
    """Every key block whole: the same blocks in the same order as the dense FA2-design kernel, bitwise."""
    # (the last: D = 256 with more query blocks than fit at once, where the dense op runs persistent)
    for batch, seqlen_q, head_dim, causal in ((2, 512, 64, False), (2, 512, 128, True), (2, 512, 256, False),
                                              (4, 2560, 256, False)):
        q, k, v = make_qkv(batch, seqlen_q, 640, 8, 2, head_dim, dtype)
        mask = torch.ones(batch, 8, seqlen_q // 128, 5, dtype=torch.bool, device="cuda")
        out, lse = flashext.block_sparse_attention(q, k, v, mask, (128, 128), causal=causal, return_lse=True)
        hopper = flashext.use_hopper_kernels(False)  # the dense kernel of the same design
        try:
            dense, dense_lse = flashext.flash_attention(q, k, v, causal=causal, return_lse=True)
        finally:
            flashext.use_hopper_kernels(hopper)
        assert torch.equal(out, dense) and torch.equal(lse, dense_lse)


@requires_cuda
def test_cuda_graph_replays_new_masks():
    q, k, v = make_qkv(1, 384, 384, 4, 4, 64, torch.float16)
    mask = blocks(1, 4, 384, 384, (64, 64), 0.4, seed=1)
    flashext.block_sparse_attention(q, k, v, mask, (64, 64))  # warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashext.block_sparse_attention(q, k, v, mask, (64, 64))
    for seed in (2, 3):
        mask.copy_(blocks(1, 4, 384, 384, (64, 64), 0.4, seed=seed))
        graph.replay()
        want = ref.block_sparse_attention(q, k, v, mask, (64, 64))
        base = ref.block_sparse_attention(q, k, v, mask, (64, 64), compute_dtype=q.dtype)
        assert_close(f"graph replay, mask seed {seed}", out, want, base)


@requires_cuda
def test_opcheck_and_compile():
    q, k, v = make_qkv(2, 130, 200, 4, 2, 64, torch.bfloat16)
    mask = blocks(2, 1, 130, 200, (32, 64), 0.5)
    torch.library.opcheck(torch.ops.flashext.flash_attn_block_sparse_fwd.default,
                          (q, k, v, mask, 32, 64, True, None, -1, -1, 0.0))
    fn = torch.compile(lambda q, k, v, m: flashext.block_sparse_attention(q, k, v, m, (32, 64), causal=True),
                       fullgraph=True)
    assert torch.equal(fn(q, k, v, mask), flashext.block_sparse_attention(q, k, v, mask, (32, 64), causal=True))


@pytest.mark.parametrize("device", CHECK_DEVICES)
def test_bad_input(device):
    q, k, v = make_qkv(2, 100, 90, 4, 2, 64, torch.bfloat16, device=device)
    good = torch.ones(2, 4, 2, 2, dtype=torch.bool, device=device)
    fn = "flashext.block_sparse_attention: "
    cases = [
        ((good.to(torch.uint8), (64, 64)), r"argument 'block_mask' must be a bool tensor, got Byte"),
        ((good[:, :, :1], (64, 64)), r"argument 'block_mask' must have shape \(batch or 1, heads or 1, "
                                     r"ceil\(seqlen_q / R\), ceil\(seqlen_k / C\)\) = \(2 or 1, 4 or 1, 2, 2\)"),
        ((good[:, :3], (64, 64)), r"argument 'block_mask' must have shape"),
        ((good[0], (64, 64)), r"argument 'block_mask' must have shape"),
        ((good, (0, 64)), r"block_size entries must be >= 1, got \(0, 64\)"),
        ((good, (64, -1)), r"block_size entries must be >= 1"),
        ((good, (2**62, 64)), r"argument 'block_mask' must have shape .* = \(2 or 1, 4 or 1, 1, 2\)"),  # no overflow
    ]
    if device == "cuda":
        cases.append(((good.cpu(), (64, 64)), r"argument 'block_mask' must be on the device of 'q'"))
    for (mask, block_size), message in cases:
        with pytest.raises(RuntimeError, match=fn + message):
            flashext.block_sparse_attention(q, k, v, mask, block_size)
    with pytest.raises(RuntimeError, match=fn + r"argument 'q' must be float16 or bfloat16"):
        flashext.block_sparse_attention(q.float(), k.float(), v.float(), good, (64, 64))
