"""flashext.distributed (ring attention): the ring on CPU under the gloo backend with the reference
kernels (2 and 3 ranks, spawned processes), the same steps simulated in one process with flashext's
kernels on one GPU, the zigzag sharding and the argument checks. Outputs and gradients against the
reference on the whole sequence, by the tolerance rule. (Two GPUs under NCCL: the example and
benchmarks/bench_context_parallel.py.)"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashext import distributed as cp, reference as ref
from flashext.testing import GRADIENT_FACTOR, assert_close
from tests.helpers import requires_cuda

CASES = [  # (batch, seqlen, heads, heads_kv, head_dim, causal, softcap)
    (2, 24, 4, 2, 16, False, 0.0),
    (2, 24, 4, 2, 16, True, 0.0),
    (1, 48, 3, 1, 8, True, 5.0),
]


def _inputs(case, dtype=torch.float32, device="cpu", seed=0):
    batch, seqlen, heads, heads_kv, head_dim, _, _ = case
    g = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(batch, seqlen, h, head_dim, generator=g).to(dtype).to(device)  # noqa: E731
    return make(heads), make(heads_kv), make(heads_kv), make(heads)


def _check_against_reference(label, q, k, v, dout, out, grads, causal, softcap):
    want = ref.attention(q, k, v, causal=causal, softcap=softcap)
    base = ref.attention(q, k, v, causal=causal, softcap=softcap, compute_dtype=q.dtype)
    assert_close(f"{label} out", out, want, base)
    want_g = ref.attention_backward(dout, q, k, v, causal=causal, softcap=softcap)
    base_g = ref.attention_backward(dout, q, k, v, causal=causal, softcap=softcap, compute_dtype=q.dtype)
    for name, g, w, b in zip(("dq", "dk", "dv"), grads, want_g, base_g):
        assert_close(f"{label} {name}", g, w, b, factor=GRADIENT_FACTOR)


def _worker(rank, world, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for case in CASES:
            causal, softcap = case[5], case[6]
            q, k, v, dout = _inputs(case)  # every rank draws the whole sequence, keeps its shard
            shard = lambda t: cp.zigzag_shard(t, rank, world).requires_grad_()  # noqa: E731
            ql, kl, vl = shard(q), shard(k), shard(v)
            out = cp.ring_attention(ql, kl, vl, causal=causal, softcap=softcap)
            grads = torch.autograd.grad(out, (ql, kl, vl), cp.zigzag_shard(dout, rank, world))
            gathered = [cp.zigzag_gather(t.detach()) for t in (out, *grads)]
            if rank == 0:
                _check_against_reference(f"ring W={world} {case}", q, k, v, dout, gathered[0], gathered[1:], causal,
                                         softcap)
        # a subgroup that is not the whole world: the ring among ranks [1, world) (global ranks in P2P ops)
        if world > 2:
            ranks = list(range(1, world))
            group = dist.new_group(ranks)
            if rank in ranks:
                sub_rank, sub_world = ranks.index(rank), len(ranks)
                case = CASES[1]
                q, k, v, dout = _inputs(case, seed=1)
                shard = lambda t: cp.zigzag_shard(t, sub_rank, sub_world).requires_grad_()  # noqa: E731
                ql, kl, vl = shard(q), shard(k), shard(v)
                out = cp.ring_attention(ql, kl, vl, group=group, causal=True)
                grads = torch.autograd.grad(out, (ql, kl, vl), cp.zigzag_shard(dout, sub_rank, sub_world))
                gathered = [cp.zigzag_gather(t.detach(), group=group) for t in (out, *grads)]
                if sub_rank == 0:
                    _check_against_reference("ring subgroup", q, k, v, dout, gathered[0], gathered[1:], True, 0.0)
        dist.barrier()
    finally:
        dist.destroy_process_group()


class _TinyCpModel(torch.nn.Module):
    """qkv projection, ring attention over the group's shards, output projection."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x):  # (B, S / W, width), this rank's zigzag rows
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).unbind(2)
        return self.out(cp.ring_attention(q, k, v, causal=True).reshape(b, s, w))


def _ddp_worker(rank, world, port):
    """ring_attention inside a DistributedDataParallel model and under torch.compile: the same
    loss and parameter gradients as the model run on the whole sequence in one process."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = _TinyCpModel()
        x = torch.randn(2, 24, 32)
        target = torch.randn(2, 24, 32)

        def whole_sequence_reference():  # the same model, attention by the reference on every row
            q, k, v = model.qkv(x).view(2, 24, 3, 4, 8).unbind(2)
            y = model.out(ref.attention(q, k, v, causal=True, compute_dtype=torch.float32).reshape(2, 24, 32))
            loss = ((y - target) ** 2).mean()
            return loss, torch.autograd.grad(loss, list(model.parameters()))

        want_loss, want_grads = whole_sequence_reference()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        for forward in (ddp, torch.compile(ddp)):
            ddp.zero_grad()
            y = forward(cp.zigzag_shard(x, rank, world))
            # the mean over every row: DDP averages the ranks' gradients, so each takes its rows' mean
            loss = ((y - cp.zigzag_shard(target, rank, world)) ** 2).mean()
            loss.backward()
            total = loss.detach().clone()
            dist.all_reduce(total)
            torch.testing.assert_close(total / world, want_loss.detach(), rtol=1e-5, atol=1e-6)
            for p, w in zip(model.parameters(), want_grads):
                torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-6)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed without gloo")
def test_ring_inside_ddp_and_compile():
    mp.spawn(_ddp_worker, args=(2, _free_port()), nprocs=2, join=True)


def _gpu_worker(rank, world, port):
    """The ring under NCCL, a GPU per rank: against single-GPU flash_attention on the whole sequence
    (the forward and backward tolerance rules, with the reference as the measure)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        for causal in (False, True):
            case = (2, 2048, 8, 2, 128, causal, 0.0)
            q, k, v, dout = _inputs(case, dtype=torch.bfloat16, device=f"cuda:{rank}")
            shard = lambda t: cp.zigzag_shard(t, rank, world).requires_grad_()  # noqa: E731
            ql, kl, vl = shard(q), shard(k), shard(v)
            out = cp.ring_attention(ql, kl, vl, causal=causal)
            grads = torch.autograd.grad(out, (ql, kl, vl), cp.zigzag_shard(dout, rank, world))
            gathered = [cp.zigzag_gather(t.detach()) for t in (out, *grads)]
            if rank == 0:
                _check_against_reference(f"NCCL ring W={world} causal={causal}", q, k, v, dout, gathered[0],
                                         gathered[1:], causal, 0.0)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2 or not dist.is_nccl_available(), reason="needs two CUDA GPUs and NCCL")
def test_ring_on_two_gpus_with_nccl():
    for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        os.environ.setdefault(name, "0" if name == "NCCL_NVLS_ENABLE" else "1")  # no NVLink multicast
    mp.spawn(_gpu_worker, args=(2, _free_port()), nprocs=2, join=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed without gloo")
@pytest.mark.parametrize("world", [1, 2, 3])
def test_ring_on_cpu_with_gloo(world):
    mp.spawn(_worker, args=(world, _free_port()), nprocs=world, join=True)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"causal{int(c[5])}-cap{c[6]:g}-h{c[2]}x{c[3]}")
def test_simulated_ring_on_cpu(case, world):
    causal, softcap = case[5], case[6]
    q, k, v, dout = _inputs(case)
    shards = [[cp.zigzag_shard(t, r, world) for r in range(world)] for t in (q, k, v, dout)]
    outs, grads = cp.simulate_ring(*shards[:3], causal=causal, softcap=softcap, douts=shards[3])
    _check_against_reference(f"simulated W={world}", q, k, v, dout, cp.zigzag_unshard(outs),
                             [cp.zigzag_unshard([g[i] for g in grads]) for i in range(3)], causal, softcap)


@requires_cuda
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_simulated_ring_on_one_gpu(dtype, causal, world):
    """The kernels' part of the ring on CUDA: each step's flash_attention block, the merges and the
    backward from the merged out and lse, against the reference on the whole sequence."""
    case = (2, 512, 8, 2, 128, causal, 0.0)
    q, k, v, dout = _inputs(case, dtype=dtype, device="cuda")
    shards = [[cp.zigzag_shard(t, r, world) for r in range(world)] for t in (q, k, v, dout)]
    outs, grads = cp.simulate_ring(*shards[:3], causal=causal, douts=shards[3])
    _check_against_reference(f"simulated on CUDA W={world}", q, k, v, dout, cp.zigzag_unshard(outs),
                             [cp.zigzag_unshard([g[i] for g in grads]) for i in range(3)], causal, 0.0)


def test_zigzag_round_trip_and_refusals():
    x = torch.arange(2 * 24 * 3).reshape(2, 24, 3)
    shards = [cp.zigzag_shard(x, r, 3) for r in range(3)]
    assert torch.equal(shards[0][:, :4], x[:, :4]) and torch.equal(shards[0][:, 4:], x[:, 20:])
    assert torch.equal(cp.zigzag_unshard(shards), x)
    with pytest.raises(ValueError, match=r"zigzag_shard: the sequence length 24 \(dim 1 of 'x'\) must be divisible "
                                         r"by 2 × world_size = 10"):
        cp.zigzag_shard(x, 0, 5)
    with pytest.raises(ValueError, match=r"zigzag_shard: rank 3 is not in \[0, world_size = 3\)"):
        cp.zigzag_shard(x, 3, 3)


def test_ring_attention_refusals_name_the_argument():
    q = k = v = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match=r"ring_attention: argument 'window_size' must be \(-1, -1\)"):
        cp.ring_attention(q, k, v, window_size=(4, 0))
    with pytest.raises(ValueError, match=r"ring_attention: argument 'q' must be 4-D"):
        cp.ring_attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"ring_attention: causal attention takes zigzag shards"):
        cp.ring_attention(q[:, :7], k[:, :7], v[:, :7], causal=True)
    with pytest.raises(ValueError, match=r"ring_attention: the number of query heads \(3\)"):
        cp.ring_attention(torch.randn(1, 8, 3, 16), k, v)
