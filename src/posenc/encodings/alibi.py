"""ALiBi: Press et al. 2022, "Train Short, Test Long" (arXiv:2108.12409)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import checks
from .base import PositionalEncoding


def alibi_slopes(num_heads: int) -> Tensor:
    """The paper's head slopes: a geometric sequence starting at 2^(-8/n).

    For a power-of-two head count n, slope_h = 2^(-8(h+1)/n). Otherwise take the
    slopes of the largest power of two below n and fill the rest with every other
    slope of the next power of two (the paper's ``get_slopes``).

    Returns:
        (H,) float64 slopes, largest first.
    """
    checks.positive_int("num_heads", num_heads)

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    lower = 2 ** math.floor(math.log2(num_heads))
    slopes = geometric(lower)
    if lower != num_heads:
        slopes += geometric(2 * lower)[0::2][: num_heads - lower]
    return torch.tensor(slopes, dtype=torch.float64)


class ALiBi(PositionalEncoding):
    """Adds -slope_h · (i - j) to the logits (or -slope_h · |i - j| when symmetric).

    The causal form is meant for causal attention: with ``symmetric=False`` a future
    key (i < j) would get a positive bias, so use ``symmetric=True`` for
    bidirectional attention.
    """

    has_bias = True

    def __init__(self, num_heads: int, symmetric: bool = False):
        super().__init__()
        self.num_heads = checks.positive_int("num_heads", num_heads)
        self.symmetric = bool(symmetric)
        # A plain tuple, not a buffer: module.to(bfloat16) must not round the slopes.
        self.slope_values = tuple(alibi_slopes(num_heads).tolist())

    def bias_at(self, offset: Tensor, head: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        slopes = torch.tensor(self.slope_values, dtype=dtype, device=offset.device)  # (H,)
        distance = offset.abs() if self.symmetric else offset
        return -slopes[head] * distance

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, symmetric={self.symmetric}"
