"""Compare two bench_attention (or bench_decode) runs point by point (an A/B from `scripts/gpu.sh ab`).

    python benchmarks/compare_ab.py A.json B.json [--anchor sdpa_flash] [--metric bwd_tflops]
                                    [--ours flashext_sm90]

For every grid point in both files (the forward grid, or the training grid of a run without it,
or the decode shapes): each run's flashext / anchor ratio (the anchor timed in the same run), and
B's flashext against A's (how much the change itself moved, with the anchor's own drift between
the runs beside it as the noise to judge it by). Medians last. The metric: forward TFLOP/s, for
the training grid the backward alone's (bwd_tflops; fwd_bwd_tflops for forward + backward), for
decode GB/s (gbps; `--section paged` for the paged caches, e.g. --ours flashext_page16 --anchor
flashext).
"""

from __future__ import annotations

import argparse
import json
import statistics


def load(path: str, metric: str | None, ours: str = "flashext", section: str | None = None):
    payload = json.load(open(path))
    present = {r["section"] for r in payload["rows"]}
    section = section or next(s for s in ("fwd", "train", "decode", "paged") if s in present)
    metric = metric or {"fwd": "tflops", "train": "bwd_tflops"}.get(section, "gbps")
    rows = {key(r): r for r in payload["rows"] if r["section"] == section and metric in r.get(ours, {})}
    return payload["meta"], rows, metric


def point_fields(row: dict) -> tuple:
    """What names a grid point: an attention row's dtype, head dim, mask and length, or a decode
    row's dtype, batch and KV length."""
    return ("dtype", "head_dim", "causal", "seqlen") if "head_dim" in row else ("dtype", "batch", "seqlen")


def key(row) -> tuple:
    return tuple(row[f] for f in point_fields(row))


def label(point: tuple) -> str:
    if len(point) == 3:
        dtype, batch, seqlen = point
        return f"{dtype} {batch:3d} x {seqlen:6d}"
    dtype, head_dim, causal, seqlen = point
    return f"{dtype} D={head_dim:3d} {'causal' if causal else 'full  '} S={seqlen:5d}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--anchor", default="sdpa_flash")
    parser.add_argument("--metric", default=None, help="tflops (forward), bwd_tflops or fwd_bwd_tflops (training)")
    parser.add_argument("--ours", default="flashext", help="the column that A and B differ in (flashext_sm90: the Hopper kernel)")
    parser.add_argument("--section", default=None, help="which rows (default: fwd, train or decode, the first present)")
    args = parser.parse_args()
    meta_a, rows_a, metric = load(args.a, args.metric, args.ours, args.section)
    meta_b, rows_b, _ = load(args.b, metric, args.ours, args.section)
    for name, meta in (("A", meta_a), ("B", meta_b)):
        print(f"{name}: commit {meta.get('commit', '?')}, variant {meta.get('variant', 'default')}")
    print(f"\n{'point':28} {'A/' + args.anchor:>14} {'B/' + args.anchor:>14} {'B/A ours':>9} {'B/A anchor':>11}")
    ratio_a, ratio_b, moved, drift = [], [], [], []
    for point in sorted(set(rows_a) & set(rows_b)):
        a, b = rows_a[point], rows_b[point]
        if metric not in a.get(args.anchor, {}) or metric not in b.get(args.anchor, {}):
            continue
        ratio_a.append(a[args.ours][metric] / a[args.anchor][metric])
        ratio_b.append(b[args.ours][metric] / b[args.anchor][metric])
        moved.append(b[args.ours][metric] / a[args.ours][metric])
        drift.append(b[args.anchor][metric] / a[args.anchor][metric])
        print(f"{label(point):28} {ratio_a[-1]:14.3f} {ratio_b[-1]:14.3f} {moved[-1]:9.3f} {drift[-1]:11.3f}")
    if not moved:
        print("no common grid points")
        return
    print(f"\n{len(moved)} points. vs {args.anchor}: A worst {min(ratio_a):.3f} median {statistics.median(ratio_a):.3f}; "
          f"B worst {min(ratio_b):.3f} median {statistics.median(ratio_b):.3f}")
    print(f"B over A (ours): median {statistics.median(moved):.3f}, range {min(moved):.3f}-{max(moved):.3f}; "
          f"the anchor's drift: median {statistics.median(drift):.3f}, range {min(drift):.3f}-{max(drift):.3f}")


if __name__ == "__main__":
    main()
