"""Where a training step of flashext.examples.train_gpt spends its time, per variant: host time to
issue a step, wall time per step, GPU time per step (sum of kernel times), and the kernels and host
ops that take the most, from torch.profiler. Says whether the example is host- or GPU-bound and
which kernels differ between flashext and SDPA.

    python benchmarks/profile_train_gpt.py [--compile] [--variants flashext,sdpa_flash] [--steps 5]

Same model, weights and batches as the example (batch 32 × 1024 tokens). Prints tables; writes
nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashext.examples import train_gpt as example  # noqa: E402


def step_fn(model, optimizer, forward):
    def step(tokens):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, example.VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--variants", default="flashext,sdpa_flash")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (after 30 untimed and 20 timed)")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    start = {name: t.clone() for name, t in example.GPT("flashext").state_dict().items()}
    data = example.markov_batches(50 + args.steps, args.batch, 0, "cuda")
    for variant in args.variants.split(","):
        model = example.GPT(variant).cuda()
        model.load_state_dict(start)
        model.set_variant(variant)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step = step_fn(model, optimizer, torch.compile(model) if args.compile else model)
        for i in range(30):
            step(data[i])
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for i in range(30, 50):
            step(data[i])
        issued = (time.perf_counter() - begin) / 20 * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - begin) / 20 * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(50, 50 + args.steps):
                step(data[i])
            torch.cuda.synchronize()
        events = prof.key_averages()
        gpu = sum(e.self_device_time_total for e in events) / args.steps / 1e3
        mode = "compiled" if args.compile else "eager"
        print(f"== {variant} ({mode}): issue {issued:.2f} ms/step, wall {wall:.2f} ms/step, "
              f"GPU kernels {gpu:.2f} ms/step")
        print(events.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=70))
        print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=70))


if __name__ == "__main__":
    main()
