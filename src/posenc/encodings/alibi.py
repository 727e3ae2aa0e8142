"""ALiBi: Press et al. 2022, "Train Short, Test Long" (arXiv:2108.12409)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import checks
from .base import PositionalEncoding

#: the largest ``max slope × span`` (span: the largest distance of a query or key from
#: the row's last query) for which ALiBi's channels stay within verify's tolerance, per
#: dtype (about 7e-8 × slope × span in float32; tests/kernels/test_channels.py). bfloat16's bound is that of
#: splitting a key offset into two bf16-exact integer channels.
CHANNEL_LIMITS = {torch.float64: 2.0**30, torch.float32: 2.0**9, torch.bfloat16: 2.0**16 - 1}


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

    The causal form is also low-rank: ``−m·(i − j) = m·(j − c) − m·(i − c)`` for any
    origin c, a key-side number times a per-head slope plus a per-query constant, so
    ``score_channels`` carries it as extra q/k channels and attention runs SDPA's
    fused causal path with no bias tensor. The symmetric form ``−m·|i − j|`` is not
    low-rank and keeps the bias.
    """

    has_bias = True
    #: keys from which the channel form is the faster on CPU (measured: benchmarks/history.md)
    cpu_channels_from_keys = 1024

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

    def offset_formula(self) -> tuple[str, Tensor]:
        """−slope·o (−slope·|o| when symmetric): the linear kinds, a_h = −slope_h."""
        slopes = torch.tensor(self.slope_values, dtype=torch.float32)
        params = torch.stack([-slopes, torch.zeros_like(slopes)], dim=1)
        return ("linear_abs" if self.symmetric else "linear"), params

    @property
    def has_score_channels(self) -> bool:
        return not self.symmetric

    def channels_exact(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype, contiguous: bool) -> bool:
        if self.symmetric or dtype not in CHANNEL_LIMITS:
            return False
        if contiguous:  # keys s..s+Tk-1, queries their last Tq: read shapes, not values (torch.compile)
            span = k_pos.shape[-1] - 1
        else:
            origin = q_pos.amax(-1, keepdim=True)
            span = int(torch.maximum((k_pos - origin).abs().amax(), (q_pos - origin).abs().amax()))
        limit = CHANNEL_LIMITS[dtype]
        return max(self.slope_values) * span <= limit and (dtype != torch.bfloat16 or span <= limit)

    def score_channel_parts(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float
                            ) -> tuple[Tensor, Tensor, Tensor]:
        """q' = [q, m/s, −m·(i − c)/s] and k' = [k, j − c, 1], with c the row's last query position
        (so the numbers stay near the queries) and s the logit scale: s·q'·k' = s·q·k − m·(i − j).

        In bfloat16 the key offset is split into two exact integer channels, j − c = 256·a + b,
        against 256·m/s and m/s; any rounding of the query side is a slope error as small as the
        bias form's own, or a per-row constant.
        """
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        origin = q_pos.amax(-1, keepdim=True)  # (B or 1, 1)
        key_offset = (k_pos - origin).to(compute)[:, None, :, None]  # (B or 1, 1, Tk, 1)
        query_offset = (q_pos - origin).to(torch.float64)[:, None, :, None]  # (B or 1, 1, Tq, 1)
        slope = torch.tensor(self.slope_values, dtype=torch.float64, device=q.device)[None, :, None, None] / scale
        per_row = (-slope * query_offset).to(compute)  # (B or 1, H, Tq, 1)
        ones = torch.ones_like(key_offset)
        if q.dtype == torch.bfloat16:
            high = torch.floor(key_offset / 256)
            key_side = torch.cat((high, key_offset - 256 * high, ones), dim=-1)  # (B or 1, 1, Tk, 3)
            query_side = torch.cat(((256 * slope).to(compute).expand_as(per_row), slope.to(compute).expand_as(per_row),
                                    per_row), dim=-1)  # (B or 1, H, Tq, 3)
        else:
            key_side = torch.cat((key_offset, ones), dim=-1)  # (B or 1, 1, Tk, 2)
            query_side = torch.cat((slope.to(compute).expand_as(per_row), per_row), dim=-1)  # (B or 1, H, Tq, 2)
        return q, query_side, key_side

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, symmetric={self.symmetric}"
