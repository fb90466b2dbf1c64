import os
import zlib

import pytest
import torch

# Without a GPU the Triton twins run on CPU tensors under the interpreter; the variable must be
# set before triton.jit decorates them (i.e. before flashext.triton_ref is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed(request):
    # A fresh, reproducible seed per test: different data for every test, same data on rerun.
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _attention_kernel_paths() -> list[str]:
    from flashext import attention

    return ["hopper", "portable"] if attention._hopper_forward_available() else ["default"]


@pytest.fixture(params=_attention_kernel_paths())
def kernel_path(request):
    """Runs a test on every attention kernel path this machine has: on an H100/H200 (with sm_90a
    code) the Hopper kernels wherever they can take the call (use_hopper_kernels("always"): also the
    short D = 64 calls the default leaves to the portable kernels) and the portable ones
    (use_hopper_kernels(False)), the same tests against both; elsewhere the one path there is."""
    if request.param == "default":
        yield request.param
        return
    import flashext

    previous = flashext.use_hopper_kernels("always" if request.param == "hopper" else False)
    try:
        yield request.param
    finally:
        flashext.use_hopper_kernels(previous)
