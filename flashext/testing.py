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
