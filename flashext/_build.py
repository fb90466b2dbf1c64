"""What this build of flashext holds, and whether it can run on the current device."""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import torch

_PACKAGE_DIR = Path(__file__).resolve().parent


def _why_not_loaded(exc: ImportError) -> str:
    found = sorted(p.name for p in _PACKAGE_DIR.glob("_C.*"))
    if any(name == "_C" + suffix for name in found for suffix in EXTENSION_SUFFIXES):
        state = f"does not load ({exc})"
    elif found:
        state = f"is built for another Python ({', '.join(found)})"
    else:
        state = None
    still_works = "flashext.reference and the Triton twins (flashext.triton_ref) work without it"
    root = _PACKAGE_DIR.parent
    if (root / "setup.py").is_file() and (root / "csrc").is_dir():  # a source checkout
        shadows = Path.cwd().resolve() == root  # run from the checkout's root, it hides an installed flashext
        elsewhere = ", or run from another directory to use an installed flashext" if shadows else ""
        return (f"flashext is imported from its source tree ({_PACKAGE_DIR}), where the CUDA extension "
                f"flashext._C {state or 'is not built'}: build it in place with "
                f"`pip install --no-build-isolation -e .` (or `bash scripts/setup.sh`){elsewhere}; {still_works}")
    return (f"The CUDA extension flashext._C {state or f'is missing from {_PACKAGE_DIR}'}: reinstall flashext "
            f"with `pip install --no-build-isolation .` against the torch you run; {still_works}")


try:
    from . import _C  # loads the kernels and registers torch.ops.flashext.*
except ImportError as exc:  # not built: the reference and the Triton twins still work
    _C = None
    _IMPORT_ERROR = _why_not_loaded(exc)
else:
    _IMPORT_ERROR = None


def extension_loaded() -> bool:
    """Whether the CUDA extension flashext._C is built and loaded (torch.ops.flashext exists)."""
    return _C is not None


def require_extension() -> None:
    """Raise a clear ImportError when flashext._C was not built."""
    if _C is None:
        raise ImportError(_IMPORT_ERROR)


class _MissingOps:
    """Stands in for torch.ops.flashext when the extension is not built: any op raises why."""

    def __getattr__(self, name: str):
        if name.startswith("__"):  # copy, pickle, inspect and hasattr probe these: not an op
            raise AttributeError(name)
        require_extension()


def ops():
    """torch.ops.flashext when the extension is loaded, else a stand-in whose ops raise ImportError."""
    return torch.ops.flashext if _C is not None else _MissingOps()


def build_info() -> dict:
    """What this build holds and whether the current device can run it.

    cuda_archs lists the compiled targets as nvcc names them: "sm_90a" is machine code for exactly
    compute capability 9.0, "sm_80" for 8.x, "compute_80" PTX that the driver JIT-compiles on any
    GPU >= 8.0 (ptx says whether there is any). hopper_kernels: whether the Hopper (sm_90a)
    kernels serve this device now (an sm_90 GPU, sm_90a code, flashext.use_hopper_kernels not
    turned off). The same keys everywhere: what the build or the machine cannot say is None, empty
    or False."""
    info: dict = {"version": __import__("flashext").__version__, "built": _C is not None,
                  "import_error": _IMPORT_ERROR, "torch": torch.__version__,
                  "cuda_archs": [], "ptx": False, "cuda_runtime": None, "kernels": [],
                  "device": None, "device_capability": None, "device_supported": False, "hopper_kernels": False}
    if _C is not None:
        archs = [a for a in _C.cuda_archs.split(";") if a]
        cuda = _C.cuda_runtime_version
        info.update(cuda_archs=archs, ptx=any(a.startswith("compute_") for a in archs),
                    cuda_runtime=f"{cuda // 1000}.{cuda % 1000 // 10}",
                    kernels=[k for k in _C.kernels.splitlines() if k])
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        info["device"] = torch.cuda.get_device_name()
        info["device_capability"] = f"{major}.{minor}"
        info["device_supported"] = _C is not None and bool(_C.arch_supported(major, minor))
        info["hopper_kernels"] = ((major, minor) == (9, 0) and any("90a" in a for a in info["cuda_archs"])
                                  and bool(_C.hopper_kernels()))
    return info
