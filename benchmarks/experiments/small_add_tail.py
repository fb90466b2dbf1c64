"""Where the spread of small add + GeLU calls comes from (docs/notes/gelu.md, "Benchmark order").

At n = 2^16 (4-5 us calls) a quarter of flashext's calls once took ~0.5 us more than the seed's
Triton kernel's and a same-bytes copy's. This times, interleaved as bench_gelu does (bench_paired:
L2 flushed before every call, a spin ahead of it), the same call made several ways, and prints
percentiles of each:
  op            flashext's op as bench_gelu calls it (a fresh output per call)
  op_out        the out= op into one preallocated tensor
  graph_op      the out= op captured in a CUDA graph, replayed (no host launch path)
  seed, graph_seed  the seed's Triton kernel, direct and replayed from a graph
  copy          a same-bytes copy
With "mix", bench_gelu's own set instead (flashext's op, the Triton twin, the seed, eager,
torch.compile, the copy), once in a rotated order (each always after the same one) and once in
balanced orders (each after each other equally often): the tail came from the rotated order.

    python benchmarks/experiments/small_add_tail.py [n] [dtype] [iters] [ways|mix]
"""

import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import flashext  # noqa: E402
from benchmarks import seed_triton  # noqa: E402
from benchmarks.common import copy_fn, paired_times  # noqa: E402
from flashext.triton_ref import gelu as twin  # noqa: E402


def graph_of(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 16
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[sys.argv[2] if len(sys.argv) > 2 else "bf16"]
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    x = (torch.randn(n, device="cuda") * 2).to(dtype)
    y = (torch.randn(n, device="cuda") * 2).to(dtype)
    ops = torch.ops.flashext
    op = lambda: ops.add_gelu(x, y, "none")  # noqa: E731
    seed = lambda: seed_triton.fused_add_gelu(x, y)  # noqa: E731
    copy = copy_fn(3 * n * x.element_size(), dtype)[0]
    if len(sys.argv) > 4 and sys.argv[4] == "mix":
        compiled = torch.compile(lambda a, b: F.gelu(a + b))
        fns = {"flashext": op, "twin": lambda: twin.add_gelu(x, y), "seed": seed, "eager": lambda: F.gelu(x + y),
               "compile": lambda: compiled(x, y), "copy": copy}
        for fn in fns.values():
            fn()
        for balanced in (False, True):
            report(n, dtype, iters, paired_times(fns, iters, balanced=balanced), "balanced" if balanced else "rotated")
        return
    out, out_seed = torch.empty_like(x), torch.empty_like(x)

    def seed_into():
        seed_triton.fused_add_gelu_kernel[(triton.cdiv(n, 1024),)](x, y, out_seed, n, BLOCK_SIZE=1024)

    fns = {
        "op": op,
        "op_out": lambda: flashext.fused_add_gelu(x, y, out=out),
        "graph_op": graph_of(lambda: flashext.fused_add_gelu(x, y, out=out)),
        "seed": seed,
        "graph_seed": graph_of(seed_into),
        "copy": copy,
    }
    report(n, dtype, iters, paired_times(fns, iters), "rotated")


def report(n, dtype, iters, times, order):
    print(f"n = {n}, {dtype}, {iters} calls each, {order}; us at percentiles 10 / 25 / 50 / 75 / 90")
    for name, ms in times.items():
        t = sorted(1e3 * v for v in ms[5:])
        q = lambda p: t[min(len(t) - 1, int(p * len(t)))]  # noqa: E731
        print(f"  {name:11s} " + " ".join(f"{q(p):6.2f}" for p in (0.1, 0.25, 0.5, 0.75, 0.9))
              + f"   mean {statistics.fmean(t):.2f}")
    first, seed = (statistics.median(times[k][5:]) for k in (next(iter(times)), "seed"))
    print(f"  seed / {next(iter(times))} (medians): {seed / first:.3f}")


if __name__ == "__main__":
    main()
