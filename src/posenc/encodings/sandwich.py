"""Sandwich: Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of
Receptive Field Analysis" (arXiv:2212.10356).

The bias is the dot product of two sinusoidal position embeddings, shifted to 0 at distance 0
and divided by a per-head temperature, as in the authors' implementation (NeMo):

    b_h(i − j) = (Σ_{k=1..d/2} cos((i − j)·ω_k) − d/2) / (8h/H),   ω_k = 10000^(−2k/d),  h = 1..H

No parameters. Every term is an angle-addition product, cos(iω)cos(jω) + sin(iω)sin(jω), so the
sum rides along q and k as d extra channels (``score_channels``) and SDPA's fused causal path
runs it with no bias tensor.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .. import checks
from .base import PositionalEncoding


class Sandwich(PositionalEncoding):
    """Sandwich's parameter-free bias; ``sinusoid_dim`` is d, the width of the sinusoids (even)."""

    has_bias = True
    has_score_channels = True
    #: never on CPU: d = 128 extra channels on a 32-wide head measured 3.4-4.4x NoPE against the bias
    #: form's 1.0-1.9x from 256 to 2,048 keys (``posenc bench --tables forms``, AMD EPYC); on CUDA they serve
    cpu_channels_from_keys = math.inf

    def __init__(self, num_heads: int, sinusoid_dim: int = 128, base: float = 10000.0):
        super().__init__()
        self.num_heads = checks.positive_int("num_heads", num_heads)
        self.dim = checks.even_int("sinusoid_dim", sinusoid_dim)
        self.base = checks.positive_float("base", base, minimum=1.0)

    def frequencies(self, device=None) -> Tensor:
        """ω_k for k = 1..d/2, float64, (d/2,)."""
        k = torch.arange(1, self.dim // 2 + 1, dtype=torch.float64, device=device)
        return self.base ** (-2 * k / self.dim)

    def temperatures(self, device=None) -> Tensor:
        """8h/H for h = 1..H, float64, (H,)."""
        return torch.arange(1, self.num_heads + 1, dtype=torch.float64, device=device) * 8 / self.num_heads

    def bias_at(self, offset: Tensor, head: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        angles = offset.to(torch.float64).unsqueeze(-1) * self.frequencies(offset.device)  # (..., d/2)
        total = angles.cos().sum(-1) - self.dim / 2
        return (total / self.temperatures(offset.device)[head]).to(dtype)

    def features(self, positions: Tensor, origin: Tensor) -> Tensor:
        """[cos((p−c)ω), sin((p−c)ω)] in float64, (B or 1, 1, T, d): angles formed about the origin c
        (B or 1, 1), so they stay exact at any absolute position."""
        angles = (positions - origin).to(torch.float64)[:, None, :, None] * self.frequencies(positions.device)
        return torch.cat((angles.cos(), angles.sin()), dim=-1)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """The dense bias (B or 1, H, Tq, Tk) by angle addition, in float64: no (Tq, Tk, d) tensor."""
        q_pos, k_pos = checks.batched_positions("q_pos", q_pos), checks.batched_positions("k_pos", k_pos)
        origin = q_pos.amax(-1, keepdim=True)
        total = self.features(q_pos, origin) @ self.features(k_pos, origin).transpose(-1, -2)  # (B or 1, 1, Tq, Tk)
        return ((total - self.dim / 2) / self.temperatures(q_pos.device)[None, :, None, None]).to(dtype)

    def channels_exact(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype, contiguous: bool) -> bool:
        """float32 and float64: the channels' cos and sin are formed in float64 about the row's last
        query, so they are rounded once; bf16 and fp16 would round d products of size 1 (keep the bias)."""
        return dtype in (torch.float32, torch.float64)

    def score_channel_parts(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float
                            ) -> tuple[Tensor, Tensor, Tensor]:
        """q' = [q, cos((i−c)ω)/(s·t_h), sin((i−c)ω)/(s·t_h)] and k' = [k, cos((j−c)ω), sin((j−c)ω)],
        c the row's last query position, t_h the head's temperature and s the logit scale."""
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        origin = q_pos.amax(-1, keepdim=True)  # (B or 1, 1)
        per_head = (1.0 / (scale * self.temperatures(q.device)))[None, :, None, None]  # (1, H, 1, 1)
        query_side = (self.features(q_pos, origin) * per_head).to(compute)
        return q, query_side, self.features(k_pos, origin).to(compute)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, sinusoid_dim={self.dim}, base={self.base}"
