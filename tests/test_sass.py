"""The Hopper kernels' machine code in the built extension (no GPU needed: cuobjdump reads the
library): every Hopper forward and backward kernel issues warpgroup MMAs (HGMMA) and touches no
local memory (LDL / STL: register spills). Skips where the build holds no sm_90a code or no
cuobjdump is found (the CUDA toolkit's, else the one Triton ships)."""

import re

import pytest

from benchmarks.sass import cuobjdump, functions
from flashext import _build


@pytest.fixture(scope="module")
def sass() -> dict[str, list[str]]:
    """The extension's sm_90a functions: name -> instructions (a build for other archs too holds the
    same names in their cubins, the Hopper kernels there as stubs: those are left out)."""
    if not _build.extension_loaded():
        pytest.skip("the extension is not built")
    if "sm_90a" not in _build.build_info()["cuda_archs"]:
        pytest.skip("this build holds no sm_90a machine code")
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA toolkit or Triton) to read the machine code with")
    return {name: [instruction for _, instruction in code]
            for name, code in functions(_build._C.__file__, tool, arch="sm_90a").items()}


def test_hopper_kernels_use_wgmma_and_no_local_memory(sass):
    forward = {name: code for name, code in sass.items() if "flash_fwd_sm90_kernel" in name}
    backward = {name: code for name, code in sass.items() if "flash_bwd_sm90_kernel" in name}
    # fp16 and bf16 of each config: the forward's six (D = 64 on 192-row blocks, long and short
    # tiles, and on 128-row blocks, 128, 256 on 64- and 80-key blocks), the backward's four (D = 64
    # and 128, dense and general)
    assert len(forward) == 12 and len(backward) == 8, sorted(sass)
    for name, code in {**forward, **backward}.items():
        assert any(re.search(r"\bHGMMA\b", i) for i in code), f"{name}: no HGMMA"
        local = [i for i in code if re.search(r"\b(LDL|STL)\b", i)]
        assert not local, f"{name}: local memory (spills): {local[:4]}"
