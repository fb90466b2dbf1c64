"""The definition of correct for every flashext op: plain PyTorch in float64, readable.

Each function takes tensors of any float dtype on any device and returns float64 results.
The kernels are judged against these (tolerance rule: tests and flashext.testing).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715


def _f64(t: Tensor) -> Tensor:
    return t.to(torch.float64)


def _check_approximate(approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


def gelu(z: Tensor, approximate: str = "none") -> Tensor:
    """gelu(z) = z·Φ(z) = ½z(1 + erf(z/√2));  tanh form: ½z(1 + tanh(√(2/π)(z + 0.044715z³)))."""
    _check_approximate(approximate)
    z = _f64(z)
    if approximate == "tanh":
        u = SQRT_2_OVER_PI * (z + GELU_TANH_CUBIC * z**3)
        return 0.5 * z * (1.0 + torch.tanh(u))
    return 0.5 * z * (1.0 + torch.erf(z / math.sqrt(2.0)))


def gelu_grad(z: Tensor, approximate: str = "none") -> Tensor:
    """gelu'(z) = Φ(z) + z·φ(z);  tanh form: ½(1 + t) + ½z(1 − t²)·√(2/π)(1 + 3·0.044715z²)."""
    _check_approximate(approximate)
    z = _f64(z)
    if approximate == "tanh":
        u = SQRT_2_OVER_PI * (z + GELU_TANH_CUBIC * z**3)
        t = torch.tanh(u)
        du_dz = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_CUBIC * z**2)
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * du_dz
    cdf = 0.5 * (1.0 + torch.erf(z / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return cdf + z * pdf


def add_gelu(x: Tensor, y: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x + y), the sum taken in float64 (no rounding between the add and the GeLU)."""
    return gelu(_f64(x) + _f64(y), approximate)


def add_gelu_backward(grad_out: Tensor, x: Tensor, y: Tensor, approximate: str = "none") -> Tensor:
    """d/dx = d/dy = grad_out · gelu'(x + y)."""
    return _f64(grad_out) * gelu_grad(_f64(x) + _f64(y), approximate)


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x + bias), bias broadcast over the last dimension."""
    return gelu(_f64(x) + _f64(bias), approximate)


def bias_gelu_backward(
    grad_out: Tensor, x: Tensor, bias: Tensor, approximate: str = "none"
) -> tuple[Tensor, Tensor]:
    """(grad_x, grad_bias): grad_x = grad_out · gelu'(x + bias), grad_bias = Σ_rows grad_x."""
    grad_x = _f64(grad_out) * gelu_grad(_f64(x) + _f64(bias), approximate)
    grad_bias = grad_x.reshape(-1, x.shape[-1]).sum(dim=0)
    return grad_x, grad_bias
