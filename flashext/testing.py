"""The correctness rule every flashext kernel is held to, shared by the tests, `python -m flashext`
and the benchmarks' validation step.

A low-precision result passes when its max error against the float64 reference is at most
`factor` × the max error of plain PyTorch doing the same computation in the input's dtype, plus
`atol` (flash-attn's rule): factor 2 for forward outputs, 3 for gradients, atol 1e-5.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

FORWARD_FACTOR = 2.0
GRADIENT_FACTOR = 3.0
ATOL = 1e-5


@dataclass
class Verdict:
    name: str
    error: float  # max |out − ref|
    baseline_error: float  # max |PyTorch in the same dtype − ref|
    allowed: float
    ok: bool

    def __str__(self) -> str:
        mark = "ok" if self.ok else "FAIL"
        return (f"{self.name}: max error {self.error:.3e}, PyTorch's {self.baseline_error:.3e}, "
                f"allowed {self.allowed:.3e} [{mark}]")


def judge(name: str, out: Tensor, ref: Tensor, baseline: Tensor, factor: float = FORWARD_FACTOR,
          atol: float = ATOL) -> Verdict:
    """Compare `out` with the float64 `ref`, relative to PyTorch's own `baseline` error.

    NaN or inf anywhere in `out` where `ref` is finite fails (poisoned outputs must be overwritten).
    """
    if out.shape != ref.shape:
        return Verdict(name, float("inf"), 0.0, 0.0, False)
    if out.numel() == 0:
        return Verdict(name, 0.0, 0.0, atol, True)
    out64, ref64, base64 = out.double(), ref.double(), baseline.double()
    finite_ref = torch.isfinite(ref64)
    if not torch.isfinite(out64[finite_ref]).all():
        return Verdict(name, float("nan"), 0.0, 0.0, False)
    error = (out64 - ref64)[finite_ref].abs().max().item() if finite_ref.any() else 0.0
    baseline_error = (base64 - ref64)[finite_ref].abs().max().item() if finite_ref.any() else 0.0
    allowed = factor * baseline_error + atol
    return Verdict(name, error, baseline_error, allowed, error <= allowed)


def assert_close(name: str, out: Tensor, ref: Tensor, baseline: Tensor, factor: float = FORWARD_FACTOR,
                 atol: float = ATOL) -> Verdict:
    verdict = judge(name, out, ref, baseline, factor, atol)
    assert verdict.ok, str(verdict)
    return verdict


def poison_cache(*like: Tensor) -> None:
    """Fill the caching allocator's free blocks that the next allocations will reuse with NaN,
    so an output element a kernel forgets to write shows up as NaN rather than stale data."""
    blocks = [torch.full(t.shape, float("nan"), dtype=t.dtype, device=t.device) for t in like]
    del blocks


def assert_gelu_within_one_step(name: str, z: Tensor, forward: Tensor, gradient: Tensor) -> None:
    """Stricter than the rule, for the erff-free 16-bit GeLU: gelu(z) and gelu'(z) (16-bit results;
    `z` exact, e.g. x.double() + y.double()) lie within one rounding step of the exact values, element by element, where
    Φ(z) is a normal fp32 number (Φ is the smallest intermediate; below 2^-126 the device's ex2 and
    multiplies flush to zero, an absolute error under 1e-37). Near the gradient's zero (z ≈ −0.7518)
    gelu'(z) = Φ(z) + z·φ(z) cancels two terms of about 0.226, so the gradient is allowed, beside the
    step, the fp32 rounding of those terms: 2^-22 · (Φ + |z|·φ), four units in their last place.
    (That only matters for a z between 16-bit values, such as x + y.)"""
    z64 = z.double()
    cdf = 0.5 * torch.special.erfc(-z64 / 2**0.5)
    density = torch.exp(-0.5 * z64 * z64) / (2 * torch.pi) ** 0.5
    mantissa, min_exponent = (10, -14) if forward.dtype == torch.float16 else (7, -126)
    considered = cdf >= 2.0**-126
    cancellation = 2.0**-22 * (cdf + z64.abs() * density)
    for what, got, exact, fp32 in (("forward", forward, z64 * cdf, 0.0),
                                   ("gradient", gradient, cdf + z64 * density, cancellation)):
        step = torch.exp2(torch.floor(torch.log2(exact.abs().clamp_min(2.0**min_exponent))) - mantissa)
        bad = ((got.double() - exact).abs() > step + fp32) & considered
        assert not bad.any(), (f"{name} {what}: {int(bad.sum())} of {z.numel()} values off by more than one "
                               f"rounding step, first at z = {z64[bad][0].item()!r}: got "
                               f"{got.double()[bad][0].item()!r}, exact {exact[bad][0].item()!r}")
