"""The Triton twins (flashext/triton_ref/gelu.py) against the reference, by the same rule as the
CUDA kernels. Without a GPU they run on CPU tensors under the Triton interpreter
(TRITON_INTERPRET=1, set in conftest.py), so the twins are tested in CI too."""

import pytest
import torch
import torch.nn.functional as F

from flashext import reference as ref
from flashext.testing import GRADIENT_FACTOR, assert_close, assert_gelu_within_one_step
from flashext.triton_ref import gelu as twin
from tests.helpers import HAS_CUDA

DEVICE = "cuda" if HAS_CUDA else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def randn(*shape, dtype, scale=2.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


@pytest.mark.parametrize("n", [1, 7, 1023, 5000] + ([2**20 + 3] if HAS_CUDA else []))
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float16", "bfloat16"])
def test_twin_add_gelu(dtype, approximate, n):
    x, y, g = randn(n, dtype=dtype), randn(n, dtype=dtype), randn(n, dtype=dtype, scale=1.0)
    assert_close("twin add_gelu", twin.add_gelu(x, y, approximate), ref.add_gelu(x, y, approximate),
                 F.gelu(x + y, approximate=approximate))
    assert_close("twin add_gelu grad", twin.add_gelu_backward(g, x, y, approximate),
                 ref.add_gelu_backward(g, x, y, approximate),
                 torch.ops.aten.gelu_backward(g, x + y, approximate=approximate), GRADIENT_FACTOR)


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (37, 300), (3, 5, 64)] + ([(4096, 1000)] if HAS_CUDA else []))
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float16", "bfloat16"])
def test_twin_bias_gelu(dtype, approximate, shape):
    x, g = randn(*shape, dtype=dtype), randn(*shape, dtype=dtype, scale=1.0)
    b = randn(shape[-1], dtype=dtype)
    assert_close("twin bias_gelu", twin.bias_gelu(x, b, approximate), ref.bias_gelu(x, b, approximate),
                 F.gelu(x + b, approximate=approximate))
    grad_x, grad_bias = twin.bias_gelu_backward(g, x, b, approximate)
    want_x, want_bias = ref.bias_gelu_backward(g, x, b, approximate)
    base_x = torch.ops.aten.gelu_backward(g, x + b, approximate=approximate)
    assert_close("twin bias_gelu grad_x", grad_x, want_x, base_x, GRADIENT_FACTOR)
    assert_close("twin bias_gelu grad_bias", grad_bias, want_bias, base_x.reshape(-1, shape[-1]).sum(0), GRADIENT_FACTOR)


@pytest.mark.parametrize("fast_phi", [True, False], ids=["fast_phi", "erf"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_twin_fast_phi(dtype, fast_phi, monkeypatch):
    """Both forms of Φ for 16-bit results (FAST_PHI_16BIT: the erff-free one is the default, like the
    CUDA knob), forward and backward, by the tolerance rule; inputs reach deep into both tails."""
    monkeypatch.setattr(twin, "FAST_PHI_16BIT", fast_phi)
    x, y, g = randn(5000, dtype=dtype, scale=4.0), randn(5000, dtype=dtype, scale=4.0), randn(5000, dtype=dtype, scale=1.0)
    assert_close(f"twin add_gelu fast Φ={fast_phi}", twin.add_gelu(x, y), ref.add_gelu(x, y), F.gelu(x + y))
    assert_close(f"twin add_gelu fast Φ={fast_phi} grad", twin.add_gelu_backward(g, x, y), ref.add_gelu_backward(g, x, y),
                 torch.ops.aten.gelu_backward(g, x + y), GRADIENT_FACTOR)
    if fast_phi:  # the erf form cancels in 1 + erf far in the negative tail: held to the rule alone
        assert_gelu_within_one_step("twin add_gelu", x.double() + y.double(), twin.add_gelu(x, y),
                                    twin.add_gelu_backward(torch.ones_like(x), x, y))
    xb, b, gb = randn(37, 300, dtype=dtype, scale=4.0), randn(300, dtype=dtype), randn(37, 300, dtype=dtype, scale=1.0)
    assert_close("twin bias_gelu fast Φ", twin.bias_gelu(xb, b), ref.bias_gelu(xb, b), F.gelu(xb + b))
    grad_x, _ = twin.bias_gelu_backward(gb, xb, b)
    assert_close("twin bias_gelu fast Φ grad_x", grad_x, ref.bias_gelu_backward(gb, xb, b)[0],
                 torch.ops.aten.gelu_backward(gb, xb + b), GRADIENT_FACTOR)
