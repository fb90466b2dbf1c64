"""Build flashext._C: hand-written CUDA kernels as a PyTorch extension.

    pip install --no-build-isolation .        # or -e . for development

Environment:
    FLASHEXT_CUDA_ARCHS  archs to compile, ';'-separated (default "90a"; e.g. "90a;80").
                         "90a" is Hopper with wgmma/setmaxnreg; "80" serves sm_80/86/89.
    MAX_JOBS             parallel compile jobs (ninja).
    CUDA_HOME            the CUDA toolkit (set it to /usr/local/cuda when nvcc on PATH is a wrapper).
    FLASHEXT_NVCC_FLAGS  extra nvcc flags, e.g. the tuning knobs of csrc/kernels/attention (experiments).
"""

import os
import re
from pathlib import Path

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

ROOT = Path(__file__).parent.resolve()


def cuda_archs() -> list[str]:
    raw = os.environ.get("FLASHEXT_CUDA_ARCHS", "90a")
    archs = [a.strip().replace(".", "") for a in re.split(r"[;, ]+", raw) if a.strip()]
    for arch in archs:
        if not re.fullmatch(r"\d{2,3}[af]?", arch):
            raise ValueError(f"FLASHEXT_CUDA_ARCHS: cannot parse arch {arch!r} in {raw!r}")
    return archs


def gencode_flags(archs: list[str]) -> list[str]:
    # -gencode (not -arch=sm_90a): the shorthand also runs a plain sm_90 pass that rejects
    # wgmma/setmaxnreg. Machine code only; a GPU outside these archs gets a clear error at run time.
    return [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]


def version() -> str:
    text = (ROOT / "flashext" / "__init__.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


archs = cuda_archs()
arch_define = f'-DFLASHEXT_CUDA_ARCHS="{";".join(archs)}"'
sources = sorted(
    str(p.relative_to(ROOT))
    for pattern in ("csrc/torch/*.cpp", "csrc/kernels/**/*.cu", "csrc/kernels/**/*.cpp")
    for p in ROOT.glob(pattern)
)

setup(
    name="flashext",
    version=version(),
    description="Hand-written CUDA kernels for PyTorch: FlashAttention and fused GeLU epilogues",
    packages=find_packages(include=["flashext", "flashext.*"]),
    python_requires=">=3.10",
    ext_modules=[
        CUDAExtension(
            name="flashext._C",
            sources=sources,
            include_dirs=[str(ROOT / "csrc" / "include")],
            extra_compile_args={
                "cxx": ["-O3", arch_define],
                "nvcc": ["-O3", "-lineinfo", arch_define, *gencode_flags(archs), *os.environ.get("FLASHEXT_NVCC_FLAGS", "").split()],
            },
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    zip_safe=False,
)
