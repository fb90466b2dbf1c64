"""Gathers several runs of benchmarks/bench_attention.py (one section: train or fwd) or
benchmarks/bench_decode.py (section decode) into the per-point medians a bar inside run-to-run
noise is judged on: for every point, flashext's ratio time(anchor) / time(flashext) in each run and
its median over the runs, and flashext's own rate (TFLOP/s, or GB/s for decode) as the median over
the runs; then the worst and median of those medians over the bar's points (attention: S >= 1024,
both dtypes, causal and not, D = 64 and 128 unless --head-dims says otherwise; decode: every
point). The dense matmul rows of forward runs are kept as each dtype's median TFLOP/s.

    python benchmarks/attention_runs.py OUT.json RUN.json RUN.json RUN.json [--anchor sdpa_cudnn] [--section train]
                                        [--head-dims 64,128,256]

Runs of different commits may be gathered (the bar is judged on the code each ran); each run's
commit and date are kept in the output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.compare_ab import key, point_fields  # noqa: E402

# what a section times, per row: the train section both passes, the forward section one
METRICS = {"train": ("fwd_bwd_ms", "bwd_ms"), "fwd": ("ms",), "decode": ("ms",)}
# flashext's own rate per row, beside the times (the README's TFLOP/s and GB/s)
RATES = {"train": ("fwd_bwd_tflops", "bwd_tflops"), "fwd": ("tflops",), "decode": ("gbps",)}


def in_bar(section: str, entry: dict, head_dims, min_seqlen) -> bool:
    return section == "decode" or (entry["head_dim"] in head_dims and entry["seqlen"] >= min_seqlen)


def gather(runs: list[dict], anchor: str, section: str | None = None, head_dims=(64, 128), min_seqlen=1024) -> dict:
    """The per-point ratios of each run and their medians, and the bar's summary per metric, for
    `section` (default: the one section of METRICS the runs hold). A point counts where every run
    timed it validly for both flashext and the anchor (a cell that failed holds no time)."""
    if section is None:
        sections = {row["section"] for run in runs for row in run["rows"]} & set(METRICS)
        if len(sections) != 1:
            raise ValueError(f"attention_runs: the runs must hold exactly one of the sections {sorted(METRICS)} "
                             f"(or name one: --section), found {sorted(sections)}")
        section = sections.pop()
    elif section not in METRICS:
        raise ValueError(f"attention_runs: section must be one of {sorted(METRICS)}, got {section!r}")
    tables = [{key(r): r for r in run["rows"] if r["section"] == section} for run in runs]
    out = {"section": section, "anchor": anchor,
           "runs": [{k: run["meta"].get(k) for k in ("commit", "commit_note", "date", "gpu", "torch")}
                    for run in runs],
           "points": [], "bar": {}}
    for point in sorted(set.intersection(*(set(t) for t in tables))):
        cells = [(t[point].get("flashext"), t[point].get(anchor)) for t in tables]
        if not all(ours and theirs and ours.get("valid", True) and theirs.get("valid", True) and
                   all(metric in ours and metric in theirs for metric in METRICS[section])
                   for ours, theirs in cells):
            continue
        entry = dict(zip(point_fields(tables[0][point]), point))
        for metric in METRICS[section]:
            ratios = [theirs[metric] / ours[metric] for ours, theirs in cells]
            entry[metric] = {"runs": ratios, "median": statistics.median(ratios)}
        rates = {rate: statistics.median(ours[rate] for ours, _ in cells)
                 for rate in RATES[section] if all(rate in ours for ours, _ in cells)}
        if rates:
            entry["flashext"] = rates
        out["points"].append(entry)
    matmul: dict[str, list[float]] = {}
    for run in runs:
        for row in run["rows"]:
            if row["section"] == "matmul" and "tflops" in row:
                matmul.setdefault(row["dtype"], []).append(row["tflops"])
    if matmul:
        out["matmul_tflops"] = {dtype: statistics.median(values) for dtype, values in sorted(matmul.items())}
    bar_points = [p for p in out["points"] if in_bar(section, p, head_dims, min_seqlen)]
    for metric in METRICS[section]:
        medians = [p[metric]["median"] for p in bar_points]
        if medians:
            worst = min(bar_points, key=lambda p: p[metric]["median"])
            out["bar"][metric] = {"points": len(medians), "median": statistics.median(medians),
                                  "worst": worst[metric]["median"],
                                  "worst_point": {k: worst[k] for k in point_fields(worst)}}
            if section != "decode":
                out["bar"][metric].update(head_dims=list(head_dims), min_seqlen=min_seqlen)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--anchor", default="sdpa_cudnn")
    parser.add_argument("--section", choices=sorted(METRICS), help="default: the one section the runs hold")
    parser.add_argument("--head-dims", default="64,128", help="the bar's head dims (issue 18's forward: 64,128,256)")
    args = parser.parse_args()
    head_dims = tuple(int(d) for d in args.head_dims.split(","))
    result = gather([json.loads(path.read_text()) for path in args.runs], args.anchor, args.section, head_dims)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for metric, bar in result["bar"].items():
        where = "" if result["section"] == "decode" else f" (D {bar['head_dims']}, S >= {bar['min_seqlen']})"
        print(f"{result['section']} {metric}: over {bar['points']} points{where}, medians of {len(args.runs)} runs: "
              f"median {bar['median']:.3f}x, worst {bar['worst']:.3f}x {args.anchor} at {bar['worst_point']}")
    if result["section"] == "decode":
        for p in result["points"]:
            print(f"  {p['dtype']} {p['batch']} x {p['seqlen']}: median {p['ms']['median']:.3f}x "
                  f"(runs {', '.join(f'{r:.3f}' for r in p['ms']['runs'])})")


if __name__ == "__main__":
    main()
