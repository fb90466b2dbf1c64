"""Packaging on the CPU: build_info()'s keys, flashext without its built extension (from a source
tree and as an installed copy), and setup.py's reading of FLASHEXT_CUDA_ARCHS."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flashext

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"version", "built", "import_error", "torch", "cuda_archs", "ptx", "cuda_runtime", "kernels",
        "device", "device_capability", "device_supported", "hopper_kernels"}


def test_build_info_has_the_same_keys_everywhere():
    info = flashext.build_info()
    assert set(info) == KEYS
    assert info["built"] == (info["import_error"] is None)
    if info["built"]:
        assert info["cuda_archs"] and all(a.startswith(("sm_", "compute_")) for a in info["cuda_archs"])
        assert info["ptx"] == any(a.startswith("compute_") for a in info["cuda_archs"])
        assert "flash_fwd" in info["kernels"]


# Imports flashext from the current directory, as a user's script would, and reports what it saw.
# An editable install's finder would resolve the copy's `from . import _C` to the checkout's
# build: drop it, so the copy stands alone.
_PROBE = r"""
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
import torch
import flashext, flashext.reference
from flashext.triton_ref import attention, gelu
info = flashext.build_info()
try:
    flashext.fused_add_gelu(torch.randn(4), torch.randn(4))
    raised = None
except ImportError as exc:
    raised = str(exc)
x = torch.randn(8)
print(json.dumps({"info": info, "raised": raised, "file": flashext.__file__,
                  "ops_has_dunder": hasattr(flashext.gelu._ops, "__wrapped__"),
                  "reference_ok": bool(torch.isfinite(flashext.reference.add_gelu(x, x)).all())}))
"""


def _import_unbuilt_copy(tmp_path: Path, source_tree: bool, stale_build: str | None = None) -> dict:
    shutil.copytree(ROOT / "flashext", tmp_path / "flashext", ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    if source_tree:  # what a checkout looks like next to the package
        shutil.copy(ROOT / "setup.py", tmp_path)
        (tmp_path / "csrc").mkdir()
    if stale_build:  # a file where the extension would be, that cannot be loaded
        (tmp_path / "flashext" / stale_build).write_bytes(b"not an ELF file")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert Path(seen["file"]).resolve() == (tmp_path / "flashext" / "__init__.py").resolve()
    return seen


@pytest.mark.parametrize("source_tree", [True, False], ids=["source-tree", "installed-copy"])
def test_import_without_the_extension(tmp_path, source_tree):
    seen = _import_unbuilt_copy(tmp_path, source_tree)
    info = seen["info"]
    assert set(info) == KEYS
    assert not info["built"] and info["cuda_archs"] == [] and not info["device_supported"]
    assert seen["raised"] == info["import_error"]  # ops raise ImportError saying why
    assert seen["reference_ok"] and not seen["ops_has_dunder"]
    if source_tree:
        assert "source tree" in info["import_error"] and "is not built" in info["import_error"]
        assert "pip install --no-build-isolation -e ." in info["import_error"]
        assert "run from another directory" in info["import_error"]  # the probe runs from the tree's root
    else:
        assert "is missing from" in info["import_error"] and "reinstall" in info["import_error"]


@pytest.mark.parametrize("stale_build, says", [
    (f"_C{importlib.machinery.EXTENSION_SUFFIXES[0]}", "does not load ("),
    ("_C.cpython-39-x86_64-linux-gnu.so", "is built for another Python (_C.cpython-39-x86_64-linux-gnu.so)"),
])
def test_import_with_a_build_that_does_not_load(tmp_path, stale_build, says):
    info = _import_unbuilt_copy(tmp_path, source_tree=True, stale_build=stale_build)["info"]
    assert not info["built"] and says in info["import_error"]


def _setup_module():
    spec = importlib.util.spec_from_file_location("flashext_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the helpers; setup() runs only as __main__
    return module


@pytest.mark.parametrize("spec, targets", [
    ("90a", ["sm_90a"]),
    ("80", ["sm_80"]),
    ("8.0", ["sm_80"]),
    ("sm_86", ["sm_86"]),
    ("9.0a;80", ["sm_90a", "sm_80"]),
    ("80+PTX", ["sm_80", "compute_80"]),
    ("compute_80", ["compute_80"]),
    ("90a, compute_80", ["sm_90a", "compute_80"]),
    ("100a 80 80", ["sm_100a", "sm_80"]),
])
def test_cuda_archs_spec(spec, targets):
    setup = _setup_module()
    assert setup.cuda_targets(spec) == targets
    flags = setup.gencode_flags(targets)
    assert len(flags) == len(targets) and all(f.startswith("-gencode=arch=compute_") for f in flags)


def test_cuda_archs_spec_gencode():
    setup = _setup_module()
    assert setup.gencode_flags(setup.cuda_targets("90a;80+PTX;compute_86")) == [
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_80,code=compute_80",
        "-gencode=arch=compute_86,code=compute_86",
    ]


@pytest.mark.parametrize("spec, message", [
    ("75", "sm_80 or newer"),
    ("sm90", "cannot parse"),
    ("compute_80+PTX", "cannot parse"),
    ("9", "cannot parse"),
    (" ; ", "empty"),
])
def test_cuda_archs_spec_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        _setup_module().cuda_targets(spec)


def test_main_summary_reads_like_a_sentence():
    from flashext import __main__ as cli

    info = dict(flashext.build_info(), built=True, import_error=None, cuda_archs=["sm_90a", "compute_80"],
                ptx=True, cuda_runtime="13.0", device="NVIDIA H200", device_capability="9.0", device_supported=True,
                hopper_kernels=False)
    text = cli._summary(info)
    assert "built for sm_90a, compute_80 (with PTX), CUDA 13.0" in text
    assert "NVIDIA H200, compute capability 9.0: this build runs on it" in text
    assert "Hopper" in cli._summary(dict(info, hopper_kernels=True)) and "Hopper" not in text
    unbuilt = dict(info, built=False, import_error="The CUDA extension flashext._C is missing", device=None)
    assert "(torch " in cli._summary(unbuilt)
    assert "): The CUDA extension flashext._C is missing" in cli._summary(unbuilt)
    assert "no CUDA device is visible" in cli._summary(unbuilt)


@pytest.mark.parametrize("capability, hint", [
    ("8.6", 'FLASHEXT_CUDA_ARCHS="86"'),
    ("9.0", 'FLASHEXT_CUDA_ARCHS="90a"'),
    ("12.0", 'FLASHEXT_CUDA_ARCHS="120"'),
    ("7.5", "need compute capability 8.0 or newer"),
])
def test_main_rebuild_hint(capability, hint):
    from flashext import __main__ as cli

    assert hint in cli._rebuild_hint(capability)
