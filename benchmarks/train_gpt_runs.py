"""Gathers several runs of flashext.examples.train_gpt into one file: per mode, each run's tokens/s
and loss gap, and flashext's ratio to each other variant as the median and range over the runs.
Copies the run whose ratio to sdpa_default is the median to OUT (train_gpt_<mode>.json / .png),
so that the committed plot is a typical run, not the best one.

    python benchmarks/train_gpt_runs.py OUT RUN_DIR [RUN_DIR ...]   # writes OUT/train_gpt_runs.json

`scripts/gpu.sh train_gpt` with TRAIN_GPT_RUNS > 1 calls it.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path


def gather(runs: list[Path], mode: str) -> dict | None:
    found = [(i + 1, run, json.loads((run / f"train_gpt_{mode}.json").read_text()))
             for i, run in enumerate(runs) if (run / f"train_gpt_{mode}.json").exists()]
    if not found:
        return None
    entry = {"runs": [], "flashext_over": {}}
    for number, _, summary in found:
        entry["runs"].append({
            "run": number,
            "tokens_per_s": {variant: r["tokens_per_s"] for variant, r in summary["results"].items()},
            "flashext_over": summary.get("flashext_over", {}),
            "smoothed_loss_gap": summary.get("largest_gap", {}).get("smoothed_loss_gap"),
        })
    others = [v for v in found[0][2]["results"] if v != "flashext"]
    if "flashext" not in found[0][2]["results"]:
        others = []
    for variant in others:
        ratios = [s["results"]["flashext"]["tokens_per_s"] / s["results"][variant]["tokens_per_s"]
                  for _, _, s in found]
        entry["flashext_over"][variant] = {"median": statistics.median(ratios), "min": min(ratios),
                                           "max": max(ratios)}
    key = "sdpa_default" if "sdpa_default" in others else (others[0] if others else None)
    if key is not None:
        ranked = sorted(found, key=lambda f: f[2]["results"]["flashext"]["tokens_per_s"]
                        / f[2]["results"][key]["tokens_per_s"])
        number, run, _ = ranked[(len(ranked) - 1) // 2]
        entry["committed_run"] = number
        entry["committed_run_ranked_by"] = key
        entry["source"] = run
    return entry


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    out, runs = Path(argv[0]), [Path(a) for a in argv[1:]]
    result = {"what": "flashext.examples.train_gpt, several runs of each mode (scripts/gpu.sh train_gpt, "
                      "TRAIN_GPT_RUNS); train_gpt_<mode>.json/.png are the run whose flashext/sdpa_default "
                      "ratio is the median",
              "modes": {}}
    out.mkdir(parents=True, exist_ok=True)
    for mode in ("eager", "compiled"):
        entry = gather(runs, mode)
        if entry is None:
            continue
        source = entry.pop("source", None)
        first = json.loads((runs[entry["runs"][0]["run"] - 1] / f"train_gpt_{mode}.json").read_text())
        for key in ("gpu", "torch", "commit", "steps", "batch"):
            result.setdefault(key, first.get(key))
        result["modes"][mode] = entry
        if source is not None and source.resolve() != out.resolve():
            for suffix in (".json", ".png"):
                if (source / f"train_gpt_{mode}{suffix}").exists():
                    shutil.copy(source / f"train_gpt_{mode}{suffix}", out / f"train_gpt_{mode}{suffix}")
        for variant, r in entry["flashext_over"].items():
            print(f"train_gpt {mode}: flashext / {variant} over {len(entry['runs'])} runs: median "
                  f"{r['median']:.3f}x ({r['min']:.3f}-{r['max']:.3f})")
    (out / "train_gpt_runs.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
