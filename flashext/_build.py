"""What this build of flashext holds, and whether it can run on the current device."""

from __future__ import annotations

import torch

try:
    from . import _C  # loads the kernels and registers torch.ops.flashext.*
except ImportError as exc:  # not built: the reference and the Triton twins still work
    _C = None
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


def require_extension() -> None:
    """Raise a clear ImportError when flashext._C was not built."""
    if _C is None:
        raise ImportError(
            "flashext._C is not built; install with `pip install --no-build-isolation .` "
            f"(import failed with: {_IMPORT_ERROR})"
        )


def build_info() -> dict:
    """The build's CUDA archs, CUDA runtime version and kernels, and the current device's fit."""
    info: dict = {"version": __import__("flashext").__version__, "built": _C is not None}
    if _C is None:
        info["import_error"] = str(_IMPORT_ERROR)
        return info
    archs = [a for a in _C.cuda_archs.split(";") if a]
    cuda = _C.cuda_runtime_version
    info.update(
        cuda_archs=archs,
        cuda_runtime=f"{cuda // 1000}.{cuda % 1000 // 10}",
        kernels=[k for k in _C.kernels.splitlines() if k],
        torch=torch.__version__,
    )
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        info["device"] = torch.cuda.get_device_name()
        info["device_capability"] = f"{major}.{minor}"
        info["device_supported"] = bool(_C.arch_supported(major, minor))
    else:
        info["device"] = None
    return info
