"""Ring attention over W GPUs (flashext.distributed) against one GPU and PyTorch's context-parallel SDPA.

    python benchmarks/bench_context_parallel.py [--world 2] [--seqlens 65536,262144] [--out DIR]

One sequence (B = 1, 16 heads, D = 128, bf16), causal and not, forward + backward: flashext's
ring_attention on zigzag shards, a process per GPU under NCCL; flashext.flash_attention on the whole
sequence on one GPU (rank 0; "out of memory" where it does not fit); PyTorch's context-parallel
SDPA (torch.distributed.tensor.experimental.context_parallel over the same GPUs, its K/V rotated
ring-wise: set_rotate_method("alltoall")), where this torch has it. The ring's output is compared with the one-GPU output (the largest
difference goes into the JSON), then each is timed: the median of several fwd + bwd calls, every
rank in step (a barrier before each). Prints speed-ups (time of one GPU / time of the ring; the bar is 1.8 at S >= 256K on two)
and writes context_parallel.json to $OUT (or benchmarks/results). NVLink multicast stays off.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashext  # noqa: E402
from flashext import distributed as cp  # noqa: E402

HEADS, HEAD_DIM, REPS = 16, 128, 5


def timed(fn, group_barrier) -> float:
    """Median ms of REPS calls after one warm-up, every rank starting together."""
    fn()
    times = []
    for _ in range(REPS):
        group_barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def fwd_bwd(attend, q, k, v, dout):
    return lambda: torch.autograd.grad(attend(q, k, v), (q, k, v), dout)


def worker(rank: int, world: int, port: int, seqlens: list[int], out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    barrier = lambda: dist.barrier(device_ids=[rank])  # noqa: E731
    rows = []
    for seqlen in seqlens:
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(seqlen)
            full = [torch.randn(1, seqlen, HEADS, HEAD_DIM, device="cuda", generator=g, dtype=torch.bfloat16)
                    for _ in range(4)]  # q, k, v, dout: the same on every rank
            row = {"seqlen": seqlen, "causal": causal, "world": world, "heads": HEADS, "head_dim": HEAD_DIM}
            flops = 3.5 * 4 * seqlen * seqlen * HEADS * HEAD_DIM / (2 if causal else 1)  # fwd + bwd
            # the ring: this rank's shards
            q, k, v = (cp.zigzag_shard(t, rank, world).requires_grad_() for t in full[:3])
            dout = cp.zigzag_shard(full[3], rank, world)
            ring = lambda q, k, v: cp.ring_attention(q, k, v, causal=causal)  # noqa: E731
            out = cp.zigzag_gather(ring(q, k, v).detach())
            try:
                ms = timed(fwd_bwd(ring, q, k, v, dout), barrier)
                row["flashext_ring"] = {"ms": ms, "tflops": flops / ms / 1e9}
            except torch.OutOfMemoryError:
                row["flashext_ring"] = {"error_message": "out of memory"}
            del q, k, v, dout
            torch.cuda.empty_cache()
            # one GPU, whole sequence (rank 0; the others wait)
            if rank == 0:
                try:
                    q1, k1, v1 = (t.detach().clone().requires_grad_() for t in full[:3])
                    one = lambda q, k, v: flashext.flash_attention(q, k, v, causal=causal)  # noqa: E731
                    want = one(q1, k1, v1).detach()
                    err = (out.float() - want.float()).abs().max().item()
                    row["flashext_ring"]["max_difference_to_one_gpu"] = err
                    ms = timed(fwd_bwd(one, q1, k1, v1, full[3]), lambda: None)
                    row["flashext_one_gpu"] = {"ms": ms, "tflops": flops / ms / 1e9}
                    del q1, k1, v1, want
                except torch.OutOfMemoryError:
                    row["flashext_one_gpu"] = {"error_message": "out of memory"}
                torch.cuda.empty_cache()
            barrier()
            # PyTorch's context-parallel SDPA over the same GPUs (its own sharding of the buffers)
            try:
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.tensor.experimental import context_parallel
                from torch.distributed.tensor.experimental._attention import set_rotate_method

                set_rotate_method("alltoall")
                mesh = init_device_mesh("cuda", (world,))
                qt, kt, vt, dt = (t.transpose(1, 2).contiguous() for t in full)
                # (its buffers come back resized after the block, which tensors that need grad refuse)
                with context_parallel(mesh, buffers=[qt, kt, vt, dt], buffer_seq_dims=[2, 2, 2, 2],
                                      no_restore_buffers={qt, kt, vt, dt}):
                    qt.requires_grad_(), kt.requires_grad_(), vt.requires_grad_()
                    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
                    ms = timed(fwd_bwd(sdpa, qt, kt, vt, dt), barrier)
                row["torch_context_parallel"] = {"ms": ms, "tflops": flops / ms / 1e9}
            except Exception as exc:  # an anchor that does not run here: say so, keep going
                row["torch_context_parallel"] = {"error_message": f"{type(exc).__name__}: {str(exc)[:200]}"}
            torch.cuda.empty_cache()
            if rank == 0:
                rows.append(row)
                cells = "  ".join(f"{n} {c['ms']:.1f} ms" if "ms" in c else f"{n} {c['error_message']}"
                                  for n, c in row.items() if isinstance(c, dict))
                print(f"S={seqlen} {'causal' if causal else 'full'}: {cells}", flush=True)
            del full, out
            torch.cuda.empty_cache()
    if rank == 0:
        from benchmarks.common import run_metadata

        payload = {"meta": {**run_metadata(), "world": world}, "rows": rows}
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        path = Path(out_dir) / "context_parallel.json"
        path.write_text(json.dumps(payload, indent=1))
        print(f"wrote {path}")
        for row in rows:
            one, ring = row.get("flashext_one_gpu", {}), row["flashext_ring"]
            if "ms" in one and "ms" in ring:
                print(f"  S={row['seqlen']} {'causal' if row['causal'] else 'full'}: ring over {world} GPUs "
                      f"{one['ms'] / ring['ms']:.2f}x one GPU")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=min(2, torch.cuda.device_count()))
    parser.add_argument("--seqlens", default="65536,262144")
    parser.add_argument("--out", default=os.environ.get("OUT", str(Path(__file__).parent / "results")))
    args = parser.parse_args()
    if args.world < 2 or torch.cuda.device_count() < args.world:
        sys.exit(f"bench_context_parallel: needs {max(args.world, 2)} GPUs, this machine has "
                 f"{torch.cuda.device_count()}")
    for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        os.environ.setdefault(name, "0" if name == "NCCL_NVLS_ENABLE" else "1")  # no NVLink multicast
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seqlens = [int(x) for x in args.seqlens.split(",")]
    mp.spawn(worker, args=(args.world, port, seqlens, args.out), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
