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
