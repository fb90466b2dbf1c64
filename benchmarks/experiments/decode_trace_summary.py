"""Reads the per-block CSVs of probe_decode.sh (PROBE_TRACE_DIR) and prints, per file, how the
blocks' finish times spread by SM: per SM its blocks and the mean time its blocks took from start to
keys done, the SMs sorted by that, and the same grouped by TPC (SM id // 2, two SMs a TPC). A
debugging tool for the one-wave tail (docs/notes/decode.md, "Grid balance").

    python benchmarks/experiments/decode_trace_summary.py DIR_OR_CSV [...]
"""

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def summarize(path: Path) -> None:
    rows = list(csv.DictReader(open(path)))
    if not rows:
        print(f"{path.name}: empty")
        return
    per_sm = defaultdict(list)  # smid -> [(start, done) in us]
    for r in rows:
        per_sm[int(r["smid"])].append((int(r["start"]) / 1e3, int(r["done"]) / 1e3))
    span = max(done for blocks in per_sm.values() for _, done in blocks)
    print(f"{path.name}: {len(rows)} blocks on {len(per_sm)} SMs, keys done by {span:.1f} us")
    # the last block's end per SM: where an SM ran out of work early, the grid's tail
    ends = {sm: max(done for _, done in blocks) for sm, blocks in per_sm.items()}
    rates = {sm: statistics.mean(done - start for start, done in blocks) for sm, blocks in per_sm.items()}
    by_count = defaultdict(list)
    for sm, blocks in per_sm.items():
        by_count[len(blocks)].append(rates[sm])
    for count in sorted(by_count):
        v = by_count[count]
        print(f"  SMs with {count} block(s): {len(v):3d}, mean block time {statistics.mean(v):7.1f} us "
              f"(min {min(v):.1f}, max {max(v):.1f})")
    order = sorted(ends, key=ends.get)
    print("  SMs done first:", ", ".join(f"{sm} ({ends[sm]:.1f})" for sm in order[:8]))
    print("  SMs done last: ", ", ".join(f"{sm} ({ends[sm]:.1f})" for sm in order[-8:]))
    tpc = defaultdict(list)
    for sm, rate in rates.items():
        tpc[sm // 2].append(rate)
    tpc_mean = {t: statistics.mean(v) for t, v in tpc.items()}
    line = " ".join(f"{tpc_mean[t]:.0f}" for t in sorted(tpc_mean))
    print(f"  mean block time per TPC (SM id // 2, in order): {line}")


def main(args: list[str]) -> None:
    paths = []
    for arg in args:
        p = Path(arg)
        paths += sorted(p.glob("*.csv")) if p.is_dir() else [p]
    for path in paths:
        summarize(path)


if __name__ == "__main__":
    main(sys.argv[1:])
