"""Train train_gpt's GPT with each sequence split over W GPUs (ring attention), beside the same model
on one GPU, from the same start and batches: the loss curves should agree within noise.

    python -m flashext.examples.train_gpt_cp [--world 2] [--steps 100] [--out DIR]

Each rank holds the zigzag shard (flashext.distributed.zigzag_shard) of every sequence: its tokens,
their positions and their targets. Attention is flashext.distributed.ring_attention (causal);
everything else works per token. The loss is the mean over all ranks' tokens and the gradients are
summed over the ranks (all_reduce) before AdamW, so every rank keeps the same weights: the same
training as on one GPU, with O(S / W) activation memory for attention. Rank 0 then trains the
one-GPU model (flashext.flash_attention) on the same batches and prints the largest gap between
the two loss curves (10-step means) and both speeds. A process per GPU under NCCL (NVLink
multicast off).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from flashext import distributed as cp
from flashext.examples import git_commit, train_gpt as base


def ring_attention(q, k, v):  # replaces Block.attention: this rank's rows over the whole sequence
    return cp.ring_attention(q, k, v, causal=True)


def worker(rank: int, world: int, port: int, steps: int, batch: int, out_dir: str | None) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    torch.manual_seed(0)
    start = base.GPT("flashext").state_dict()  # the same start on every rank (same seed)
    data = base.markov_batches(steps, batch, seed=1, device="cuda")
    model = base.GPT("flashext").cuda()
    model.load_state_dict(start)
    for block in model.blocks:
        block.attention = ring_attention
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 30) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))  # as train_gpt
    shard = lambda t, dim=1: cp.zigzag_shard(t, rank, world, dim)  # noqa: E731
    losses, warmup, started = [], min(10, steps // 2), None
    for step in range(steps):
        if step == warmup:
            torch.cuda.synchronize()
            started = time.perf_counter()
        tokens = data[step]
        inputs, targets = shard(tokens[:, :-1]), shard(tokens[:, 1:])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = model.embed(inputs) + shard(model.pos[: base.SEQLEN], 0)
            for block in model.blocks:
                x = block(x)
            logits = model.head(model.norm(x))
        # the mean over every rank's tokens: this rank's sum over all ranks' count
        loss = F.cross_entropy(logits.float().reshape(-1, base.VOCAB), targets.reshape(-1), reduction="sum")
        loss = loss / (batch * base.SEQLEN)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total)
    torch.cuda.synchronize()
    tokens_per_s = (steps - warmup) * batch * base.SEQLEN / (time.perf_counter() - started)
    if rank == 0:
        ring = {"losses": torch.stack(losses).tolist(), "tokens_per_s": tokens_per_s}
        one = base.train("flashext", start, data, compile_model=False, warmup=warmup)
        gap = max(abs(a - b) for a, b in zip(base.smooth(ring["losses"]), base.smooth(one["losses"])))
        print(f"ring over {world} GPUs: {tokens_per_s:.0f} tokens/s; one GPU: {one['tokens_per_s']:.0f} tokens/s; "
              f"final loss {base.smooth(ring['losses'])[-1]:.4f} against {base.smooth(one['losses'])[-1]:.4f}; "
              f"largest gap of the 10-step means {gap:.4f}")
        if out_dir is not None:
            path = Path(out_dir) / f"train_gpt_cp{world}.json"
            path.write_text(json.dumps({"world": world, "steps": steps, "batch": batch, "ring": ring, "one_gpu": one,
                                        "largest_gap": gap, "gpu": torch.cuda.get_device_name(),
                                        "torch": torch.__version__, "commit": git_commit()}, indent=1))
            print(f"wrote {path}")
    dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if torch.cuda.device_count() < args.world or args.world < 2:
        raise SystemExit(f"train_gpt_cp: needs {max(args.world, 2)} GPUs, this machine has {torch.cuda.device_count()}")
    for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        os.environ.setdefault(name, "0" if name == "NCCL_NVLS_ENABLE" else "1")  # no NVLink multicast
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args.steps, args.batch, args.out), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
