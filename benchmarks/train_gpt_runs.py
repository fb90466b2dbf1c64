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


def gather(runs: list[Path], mode: str) -> tuple[dict, Path | None, dict] | None:
    """This mode's entry of train_gpt_runs.json, the run directory to copy the plots from (the
    median run by the ratio to sdpa_default, else to the first other variant) and the first run's
    summary (for the GPU, torch and commit); None when no run has the mode."""
    found = [(i + 1, run, json.loads((run / f"train_gpt_{mode}.json").read_text()))
             for i, run in enumerate(runs) if (run / f"train_gpt_{mode}.json").exists()]
    if not found:
        return None
    entry = {"runs": [{"run": number,
                       "tokens_per_s": {variant: r["tokens_per_s"] for variant, r in summary["results"].items()},
                       "flashext_over": summary.get("flashext_over", {}),
                       "smoothed_loss_gap": summary.get("largest_gap", {}).get("smoothed_loss_gap")}
                      for number, _, summary in found],
             "flashext_over": {}}
    variants = found[0][2]["results"]
    others = [v for v in variants if v != "flashext"] if "flashext" in variants else []
    ratio = lambda summary, other: (summary["results"]["flashext"]["tokens_per_s"]  # noqa: E731
                                    / summary["results"][other]["tokens_per_s"])
    for other in others:
        ratios = [ratio(summary, other) for _, _, summary in found]
        entry["flashext_over"][other] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    source = None
    if others:
        key = "sdpa_default" if "sdpa_default" in others else others[0]
        number, source, _ = sorted(found, key=lambda f: ratio(f[2], key))[(len(found) - 1) // 2]
        entry["committed_run"], entry["committed_run_ranked_by"] = number, key
    return entry, source, found[0][2]


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
        gathered = gather(runs, mode)
        if gathered is None:
            continue
        entry, source, first = gathered
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
