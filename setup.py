"""Build flashext._C: hand-written CUDA kernels as a PyTorch extension (metadata: pyproject.toml).

    pip install --no-build-isolation .        # or -e . for development

Environment:
    FLASHEXT_CUDA_ARCHS  what to compile, entries separated by ';', ',' or spaces (default "90a"):
                           90a, 9.0a, sm_90a   machine code (SASS) for exactly 9.0 (Hopper, wgmma)
                           80, 8.0, sm_80      SASS for 8.0 and later minors of 8 (8.6, 8.9)
                           80+PTX              SASS sm_80 plus compute_80 PTX (JIT-compiled on newer GPUs)
                           compute_80          compute_80 PTX only: the driver compiles it at load on
                                               any GPU >= 8.0 (how the sm_80 kernels are tested on an H200)
    MAX_JOBS             parallel compile jobs (ninja).
    CUDA_HOME            the CUDA toolkit (set it to /usr/local/cuda when nvcc on PATH is a wrapper).
    FLASHEXT_NVCC_FLAGS  extra nvcc flags.
"""

import importlib.util
import os
import re
import sys
from pathlib import Path

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension
except ImportError as exc:  # the build compiles against the installed torch
    raise SystemExit("flashext builds against your torch: install torch first, then "
                     "`pip install --no-build-isolation .` (scripts/setup.sh does both)") from exc

ROOT = Path(__file__).parent.resolve()
MIN_ARCH = 80  # mma.sync bf16, cp.async, ldmatrix


def cuda_targets(raw: str) -> list[str]:
    """FLASHEXT_CUDA_ARCHS -> nvcc targets: 'sm_XY' (machine code) and 'compute_XY' (PTX)."""
    targets = []
    for entry in filter(None, re.split(r"[;, ]+", raw.strip())):
        m = re.fullmatch(r"(sm_|compute_)?(\d+)\.?(\d)([af]?)(\+ptx)?", entry, re.IGNORECASE)
        if not m or ((m[1] or "").lower() == "compute_" and m[5]):
            raise ValueError(f"FLASHEXT_CUDA_ARCHS: cannot parse {entry!r} in {raw!r} "
                             "(expected e.g. 90a, 80, 8.0, 80+PTX or compute_80)")
        arch = f"{m[2]}{m[3]}{m[4].lower()}"
        if int(m[2] + m[3]) < MIN_ARCH:
            raise ValueError(f"FLASHEXT_CUDA_ARCHS: {entry!r}: flashext's kernels need sm_80 or newer")
        ptx_only = (m[1] or "").lower() == "compute_"
        targets += [f"compute_{arch}"] if ptx_only else [f"sm_{arch}"] + ([f"compute_{arch}"] if m[5] else [])
    if not targets:
        raise ValueError("FLASHEXT_CUDA_ARCHS is empty")
    return list(dict.fromkeys(targets))


def gencode_flags(targets: list[str]) -> list[str]:
    # -gencode (not -arch=sm_90a): the shorthand also runs a plain sm_90 pass that rejects
    # wgmma/setmaxnreg. A GPU that none of the targets serves gets a clear error at run time.
    return [f"-gencode=arch=compute_{t.split('_')[1]},code={t}" for t in targets]


def check_wheel_support() -> None:
    """pip builds a wheel (editable or not) through bdist_wheel: setuptools >= 70.1 has it, older
    ones only with the `wheel` package, which --no-build-isolation does not install."""
    building_wheel = any(cmd in sys.argv for cmd in ("bdist_wheel", "dist_info", "editable_wheel"))
    has = importlib.util.find_spec
    if building_wheel and not (has("setuptools.command.bdist_wheel") or has("wheel")):
        import setuptools
        raise SystemExit(f"flashext: setuptools {setuptools.__version__} builds wheels only with the `wheel` "
                         "package: `pip install wheel` (or setuptools>=70.1), then run pip again")


def main() -> None:
    check_wheel_support()
    targets = cuda_targets(os.environ.get("FLASHEXT_CUDA_ARCHS", "90a"))
    arch_define = f'-DFLASHEXT_CUDA_ARCHS="{";".join(targets)}"'  # read back by build_info()
    sources = sorted(
        str(p.relative_to(ROOT))
        for pattern in ("csrc/torch/*.cpp", "csrc/kernels/**/*.cu", "csrc/kernels/**/*.cpp")
        for p in ROOT.glob(pattern)
    )
    setup(
        ext_modules=[
            CUDAExtension(
                name="flashext._C",
                sources=sources,
                include_dirs=[str(ROOT / "csrc" / "include")],
                extra_compile_args={
                    "cxx": ["-O3", arch_define],
                    "nvcc": ["-O3", "-lineinfo", arch_define, *gencode_flags(targets),
                             *os.environ.get("FLASHEXT_NVCC_FLAGS", "").split()],
                },
            )
        ],
        cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    )


if __name__ == "__main__":  # pip's build backend runs this file as __main__; tests import it
    main()
