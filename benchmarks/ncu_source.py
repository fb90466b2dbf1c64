"""Summarise Nsight Compute's per-instruction stall sampling (the SASS CSV that
`scripts/gpu.sh profile` writes with FLASHEXT_PROFILE_SOURCE=1) for each profiled kernel.

    python benchmarks/ncu_source.py attention_source.csv [--top 20]

Per kernel: instructions and warp samples by execution count (an instruction executed once per warp
is prologue or epilogue; N times per warp, a loop body), the executed instructions and samples by
opcode (the mix to set beside another kernel's: where one kernel issues more than the other), the
instructions with the most samples and their main stall reasons, and the samples around each run of
cp.async (LDGSTS) instructions.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io

SAMPLES = "Warp Stall Sampling (All Samples)"
REASONS = ("stall_long_sb", "stall_short_sb", "stall_wait", "stall_mio", "stall_barrier", "stall_math",
           "stall_dispatch", "stall_no_inst")


def kernels(text: str):
    """(kernel name, rows) for each kernel of the export (each starts with a "Kernel Name" line)."""
    for block in text.split('"Kernel Name"')[1:]:
        lines = block.split("\n")
        name = lines[0].strip(',"')
        yield name, list(csv.DictReader(io.StringIO("\n".join(lines[1:]))))


def number(row, key) -> float:
    try:
        return float(row.get(key) or 0)
    except ValueError:
        return 0.0


def opcode(source: str) -> str:
    """The opcode of a SASS line with its first modifier ("@!P0 MUFU.EX2 R1, R2 ;" -> "MUFU.EX2")."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return ".".join(words[0].rstrip(";").split(".")[:2]) if words else ""


def opcode_mix(rows: list) -> list:
    """(opcode, executed instructions, samples) over the kernel's lines, most executed first."""
    mix = collections.defaultdict(lambda: [0.0, 0.0])
    for row in rows:
        entry = mix[opcode(row.get("Source", ""))]
        entry[0] += number(row, "Instructions Executed")
        entry[1] += number(row, SAMPLES)
    return sorted(((op, executed, samples) for op, (executed, samples) in mix.items() if executed),
                  key=lambda item: -item[1])


def summarise(name: str, rows: list, top: int) -> None:
    print(f"== {name[:150]}")
    print(f"   {len(rows)} instructions, {number_sum(rows, SAMPLES):.0f} samples")
    by_count = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for row in rows:
        count = int(number(row, "Instructions Executed"))
        entry = by_count[count]
        entry[0] += 1
        entry[1] += count
        entry[2] += number(row, SAMPLES)
    print("   executed per instruction   static   dynamic      samples")
    for count in sorted(by_count):
        if count:
            static, dynamic, samples = by_count[count]
            print(f"   {count:24d} {static:8d} {dynamic:9.0f} {samples:12.0f}")
    mix = opcode_mix(rows)
    executed = sum(item[1] for item in mix) or 1.0
    print(f"   executed instructions by opcode (top {top}): opcode, share, executed, samples")
    for op, count, samples in mix[:top]:
        print(f"   {op:24s} {count / executed:6.1%} {count:14.0f} {samples:10.0f}")
    print(f"   top {top} instructions by samples (index: source; samples; main reasons)")
    order = sorted(range(len(rows)), key=lambda i: -number(rows[i], SAMPLES))[:top]
    for i in sorted(order):
        row = rows[i]
        reasons = sorted(((number(row, r), r[6:]) for r in REASONS), reverse=True)[:2]
        print(f"   {i:5d}: {row['Source'].strip()[:56]:56s} {number(row, SAMPLES):6.0f}  "
              + " ".join(f"{r}={v:.0f}" for v, r in reasons if v)
              + f"  (x{int(number(row, 'Instructions Executed'))})")
    runs = []
    for i, row in enumerate(rows):
        if "LDGSTS" in row["Source"]:
            if runs and i - runs[-1][-1] <= 4:
                runs[-1].append(i)
            else:
                runs.append([i])
    print("   cp.async runs executed at run time (first-last index, copies, samples within +-3)")
    for run in runs:
        if number(rows[run[0]], "Instructions Executed"):
            samples = sum(number(rows[k], SAMPLES) for k in range(max(0, run[0] - 3), min(len(rows), run[-1] + 4)))
            print(f"   {run[0]:5d}-{run[-1]:5d} {len(run):3d} {samples:8.0f}  (x{int(number(rows[run[0]], 'Instructions Executed'))})")


def number_sum(rows, key) -> float:
    return sum(number(row, key) for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    with open(args.csv) as f:
        text = f.read()
    for name, rows in kernels(text):
        summarise(name, rows, args.top)


if __name__ == "__main__":
    main()
