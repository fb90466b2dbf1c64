"""Warp stall reasons per profiled kernel, side by side, from `scripts/gpu.sh profile`'s CSV.

    python benchmarks/ncu_stalls.py attention_stalls.csv

Each column is one kernel launch in profile order (flashext, then SDPA flash, per shape); each row
a stall reason in cycles per issued instruction (Nsight Compute's
smsp__average_warps_issue_stalled_*_per_issue_active), reasons under 0.05 everywhere left out.
"""

from __future__ import annotations

import csv
import re
import sys


def short_name(kernel: str) -> str:
    for config in ("FlashFwdConfig<", "FlashBwdConfig<"):
        if config in kernel:
            return "ours D" + kernel.split(config)[1].split(">")[0].split(",")[0]
    match = re.search(r"traits<(\d+), (\d+), (\d+), (\d+)", kernel)
    return f"FA2 D{match.group(1)} {match.group(2)}x{match.group(3)}" if match else kernel[:16]


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    header, data = rows[0], [r for r in rows[2:] if r]  # row 1 holds the units
    kernel = header.index("Kernel Name")
    names = [short_name(r[kernel]) for r in data]
    print(f"{'stall reason':28}" + "".join(f"{n:>16}" for n in names))
    for i, metric in enumerate(header):
        if "issue_stalled" not in metric:
            continue
        values = [float(r[i] or 0) for r in data]
        if max(values) < 0.05:
            continue
        reason = re.sub(r"smsp__average_warps?_issue_stalled_|_per_issue_active\.ratio", "", metric)
        print(f"{reason:28}" + "".join(f"{v:16.2f}" for v in values))


if __name__ == "__main__":
    main()
