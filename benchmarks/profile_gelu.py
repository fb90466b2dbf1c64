"""One call of each bias + GeLU kernel (forward, backward) at the benchmark's shapes, for Nsight
Compute to time kernel by kernel (the backward is one launch up to 1024 rows, else two: the rows
pass and the bias-gradient reduction).

    ncu --clock-control none -k regex:gelu --section SpeedOfLight python benchmarks/profile_gelu.py

Shapes: FLASHEXT_PROFILE_GELU="dtype:rows:cols,..." (default: the 256 × 16384 rows of bench_gelu).
Each call runs twice; the first warms up (ncu reports both: take the second).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import flashext  # noqa: E402

DEFAULT = "fp32:256:16384,fp16:256:16384,bf16:256:16384"


def main():
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    ops = torch.ops.flashext
    for spec in os.environ.get("FLASHEXT_PROFILE_GELU", DEFAULT).split(","):
        dname, rows, cols = spec.split(":")
        dtype, rows, cols = dtypes[dname], int(rows), int(cols)
        x = torch.randn(rows, cols, device="cuda").to(dtype)
        b = torch.randn(cols, device="cuda").to(dtype)
        g = torch.randn(rows, cols, device="cuda").to(dtype)
        print(f"bias_gelu {dname} {rows}x{cols}: forward twice, backward twice", flush=True)
        for _ in range(2):
            flashext.bias_gelu(x, b)
        for _ in range(2):
            ops.bias_gelu_backward(g, x, b, "none")
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
