"""Kerple: Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation" (arXiv:2205.09921).

A learned bias from a conditionally positive definite kernel of the distance |i − j|, per head:
  - ``log``:   −r1 · log(1 + r2 · |i − j|)
  - ``power``: −r1 · |i − j|^r2,  0 < r2 ≤ 2
with r1, r2 > 0 learned per head. As in the paper's code, the constraints are kept by clamping
in the forward pass (r ≥ 0.01, and r2 ≤ 2 for ``power``), and both start as uniform draws, one
per head, in the code's ranges: the multiplier r1 ∈ (0, 2) and r2 ∈ (0, 1) for ``log``; r1 ∈
(0, 1) and the exponent r2 ∈ (0, 2) for ``power``. ALiBi is ``power`` with r2 = 1 and r1 its slope.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import checks
from .base import PositionalEncoding

VARIANTS = ("log", "power")
#: the paper's clamp: keeps both parameters strictly positive
SMALLEST = 1e-2
#: the upper ends of the uniform draws (r1, r2) start from, per variant, as in the paper's code
INITIAL_RANGES = {"log": (2.0, 1.0), "power": (1.0, 2.0)}


class Kerple(PositionalEncoding):
    """Kerple's log or power kernel as a score bias; parameters ``scale`` (r1) and ``shape`` (r2), (H,) each."""

    has_bias = True

    def __init__(self, num_heads: int, variant: str = "log"):
        super().__init__()
        self.num_heads = checks.positive_int("num_heads", num_heads)
        self.variant = checks.choice("variant", variant, VARIANTS)
        scale_range, shape_range = INITIAL_RANGES[self.variant]
        self.scale = nn.Parameter(torch.rand(num_heads) * scale_range)  # r1
        self.shape = nn.Parameter(torch.rand(num_heads) * shape_range)  # r2

    def kernel_parameters(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(r1, r2) as the forward pass uses them, clamped into the paper's ranges; (H,) each."""
        r1 = self.scale.to(dtype).clamp(min=SMALLEST)
        r2 = self.shape.to(dtype).clamp(min=SMALLEST, max=2.0 if self.variant == "power" else None)
        return r1, r2

    def bias_at(self, offset: Tensor, head: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        r1, r2 = self.kernel_parameters(dtype)
        distance = offset.abs().to(dtype)
        if self.variant == "log":
            return -r1[head] * torch.log1p(r2[head] * distance)
        return -r1[head] * distance.pow(r2[head])

    def offset_formula(self) -> tuple[str, Tensor]:
        """(r1, r2) as the forward pass clamps them, differentiable: ``kerple_log`` or ``kerple_power``."""
        return f"kerple_{self.variant}", torch.stack(self.kernel_parameters(torch.float32), dim=1)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, variant={self.variant!r}"
