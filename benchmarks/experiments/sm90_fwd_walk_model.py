"""A model of how long the Hopper forward's causal tile walks take on the benchmark grid
(csrc/kernels/attention/sm90_tile_walk.h, and the counted walk, timed and rejected at 2f7cd3e:
`git show 2f7cd3e:benchmarks/experiments/sm90_fwd_counted_walk.patch`;
docs/notes/attention_sm90_fwd.md), to weigh a walk before a GPU times it.

    python3 benchmarks/experiments/sm90_fwd_walk_model.py [--sms 132] [--fixed 1.5] [--l2-mib 50]

Time is counted in key blocks of 128 keys (64 at D = 256): a causal tile costs its key blocks plus
`--fixed` blocks (its prologue and epilogue: about 1.5 blocks in the fit of
docs/notes/attention_sm90_fwd.md, "Where the time per tile goes"). Tiles as the kernels take causal
calls: 128 query rows, at D = 64 from 4K keys 192. Printed per head dim and length (B · S = 16384,
H · D = 2048, one query head per KV head): the walks' finishing times against the units' (two
tiles of equal work, strided over the CTAs) as (units' time / the walk's time − 1):
  ideal    every CTA the same share of the work (the bound no walk beats);
  global   a counter hands out the tiles longest first over all heads;
  l2       the same within sections of the heads whose K and V fit half the L2 (sizes a head
           apart);
  counted  within sections of those heads, or of eight rounds of tiles where that is more, as
           the patch walks them where it does: where a section's K and V fit the L2 or four of a
           head's tiles run at once ("units" where not, the launch's walk before the patch: there
           a head's tiles would be rounds apart, each reading its K and V from DRAM again).
A CTA asks for its next tile as it starts one (the producer asks ahead), so the model gives a
tile out a tile early. It leaves out DRAM: at S = 512 every causal call here is near the DRAM's
bound (Q, K, V and O are 268 MB), where a walk that spreads a head's tiles apart re-reads its K
and V from DRAM (global does, over 1024 heads at D = 64).
"""
from __future__ import annotations

import argparse
import heapq


def tile_blocks(seqlen: int, block_m: int, block_n: int) -> list[int]:
    """Key blocks of each query block under a causal mask (square, top-left aligned)."""
    num_m = (seqlen + block_m - 1) // block_m
    return [(min((m + 1) * block_m, seqlen) + block_n - 1) // block_n for m in range(num_m)]


def paired(blocks: list[int], heads: int, grid: int, fixed: float) -> float:
    num_m = len(blocks)
    units = []
    for _ in range(heads):
        for j in range((num_m + 1) // 2):
            first, second = num_m - 1 - j, j
            units.append(blocks[first] + fixed + (blocks[second] + fixed if second != first else 0))
    load = [0.0] * grid
    for i, cost in enumerate(units):
        load[i % grid] += cost
    return max(load)


def counted(costs: list[float], grid: int) -> float:
    """CTA b takes costs[b] first; whoever starts a tile claims the next index then."""
    queue = iter(costs[grid:])
    events = [(costs[b], b, next(queue, None)) for b in range(min(grid, len(costs)))]
    heapq.heapify(events)
    end = 0.0
    while events:
        t, b, claimed = heapq.heappop(events)
        end = max(end, t)
        if claimed is not None:
            heapq.heappush(events, (t + claimed, b, next(queue, None)))
    return end


def longest_first(blocks: list[int], heads: int, most: int, fixed: float) -> list[float]:
    """Tile costs in the counted walk's order: sections of at most `most` heads, a head apart."""
    num_m, sections = len(blocks), -(-heads // most)
    sizes = [heads // sections + (i < heads % sections) for i in range(sections)]
    return [blocks[num_m - 1 - from_last] + fixed for size in sizes for from_last in range(num_m) for _ in range(size)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--fixed", type=float, default=1.5)
    parser.add_argument("--l2-mib", type=int, default=50)
    args = parser.parse_args()
    grid, l2 = args.sms, args.l2_mib * 2 ** 20
    print(f"{'point':16} {'ideal':>7} {'global':>7} {'l2':>7} {'counted':>8}")
    for head_dim, block_n in ((64, 128), (128, 128), (256, 64)):
        for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
            heads = 2048 // head_dim * (16384 // seqlen)  # heads · sequences
            blocks = tile_blocks(seqlen, 192 if head_dim == 64 and seqlen >= 4096 else 128, block_n)
            base = paired(blocks, heads, grid, args.fixed)
            ideal = sum(b + args.fixed for b in blocks) * heads / grid
            kv_head_bytes = 4 * seqlen * head_dim
            l2_heads = min(heads, max(1, l2 // 2 // kv_head_bytes))
            most = min(heads, max(l2_heads, -(-8 * grid // len(blocks))))
            walks = [counted(longest_first(blocks, heads, n, args.fixed), grid) for n in (heads, l2_heads, most)]
            taken = most * kv_head_bytes <= l2 or 4 * most <= grid
            print(f"D {head_dim:3} S {seqlen:5}  {base / ideal - 1:+7.1%} "
                  + " ".join(f"{base / w - 1:+7.1%}" for w in walks[:2])
                  + f" {base / walks[2] - 1:+8.1%}" + ("" if taken else "  (units)"))


if __name__ == "__main__":
    main()
