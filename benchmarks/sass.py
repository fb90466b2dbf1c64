"""Reading a binary's machine code (SASS) with cuobjdump: tests/test_sass.py checks the built
extension's Hopper kernels with it, benchmarks/experiments/sass_hot_path.py counts their key loops."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path


def cuobjdump() -> str | None:
    """The CUDA toolkit's cuobjdump (on PATH, or under CUDA_HOME), else the copy Triton ships."""
    found = shutil.which("cuobjdump")
    if found is None and os.environ.get("CUDA_HOME"):
        candidate = Path(os.environ["CUDA_HOME"]) / "bin" / "cuobjdump"
        found = str(candidate) if candidate.exists() else None
    if found is None:
        try:
            import triton
        except ImportError:
            return None
        candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        found = str(candidate) if candidate.exists() else None
    return found


def functions(binary: str, tool: str, arch: str | None = None) -> dict[str, list[tuple[int, str]]]:
    """{function name: [(address, instruction)]} of a cubin or a library's embedded cubins; with
    `arch` (e.g. "sm_90a"), only the functions of that arch's cubins (a library built for several
    archs holds the same names in each)."""
    text = subprocess.run([tool, "-sass", binary], capture_output=True, text=True, check=True).stdout
    out: dict[str, list[tuple[int, str]]] = {}
    current, current_arch = None, None
    for line in text.splitlines():
        header = re.match(r"\s*arch = (\S+)", line)
        if header:
            current_arch, current = header.group(1), None
            continue
        name = re.search(r"Function : (\S+)", line)
        if name:
            current = name.group(1) if arch is None or current_arch == arch else None
            if current is not None:
                out[current] = []
            continue
        instruction = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if instruction and current is not None:
            out[current].append((int(instruction.group(1), 16), instruction.group(2)))
    return out
