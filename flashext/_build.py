"""What this build of flashext holds, and whether it can run on the current device."""

from __future__ import annotations

from pathlib import Path

import torch

_PACKAGE_DIR = Path(__file__).resolve().parent

try:
    from . import _C  # loads the kernels and registers torch.ops.flashext.*
except ImportError as exc:  # not built: the reference and the Triton twins still work
    _C = None
    if not any(_PACKAGE_DIR.glob("_C*.so")) and (_PACKAGE_DIR.parent / "setup.py").is_file():
        _IMPORT_ERROR = (f"flashext is imported from its source tree ({_PACKAGE_DIR}), where the extension "
                         "flashext._C is not built: build it in place with `pip install --no-build-isolation -e .` "
                         "(or `bash scripts/setup.sh`), or run from outside the source tree to use an installed flashext")
    else:
        _IMPORT_ERROR = (f"flashext._C failed to load ({exc}); reinstall with `pip install --no-build-isolation .` "
                         "against the torch you run")
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
        require_extension()


def ops():
    """torch.ops.flashext when the extension is loaded, else a stand-in whose ops raise ImportError."""
    return torch.ops.flashext if _C is not None else _MissingOps()


def build_info() -> dict:
    """The build's CUDA archs, CUDA runtime version and kernels, and the current device's fit.

    The same keys everywhere: values the build or the machine cannot say are None (or empty)."""
    info: dict = {"version": __import__("flashext").__version__, "built": _C is not None,
                  "import_error": _IMPORT_ERROR, "torch": torch.__version__,
                  "cuda_archs": [], "cuda_runtime": None, "kernels": [],
                  "device": None, "device_capability": None, "device_supported": False}
    if _C is not None:
        cuda = _C.cuda_runtime_version
        info.update(cuda_archs=[a for a in _C.cuda_archs.split(";") if a],
                    cuda_runtime=f"{cuda // 1000}.{cuda % 1000 // 10}",
                    kernels=[k for k in _C.kernels.splitlines() if k])
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        info["device"] = torch.cuda.get_device_name()
        info["device_capability"] = f"{major}.{minor}"
        info["device_supported"] = _C is not None and bool(_C.arch_supported(major, minor))
    return info
