"""xPos: Sun et al. 2022, "A Length-Extrapolatable Transformer" (arXiv:2212.10554).

RoPE whose every channel pair c also decays with distance: queries are scaled by ζ_c^(i/γ) and
keys by ζ_c^(−j/γ), so pair c of the logit q_i·k_j carries ζ_c^((i−j)/γ) on top of the rotation:

    ζ_c = (2c/Dh + 0.4) / 1.4 ∈ [0.29, 1),   γ = ``scale_base`` (512)

Fast pairs (small c) decay fastest. A scale multiplies both cos and sin of the pair, so xPos is
RoPE with scaled tables and runs on every RoPE kernel.

Positions are counted from the row's last query, not from 0: the two scales grow and shrink
exponentially and only their product is bounded, so at position 2^20 ζ^(±i/γ) would overflow
float32 while ζ^((i−c)/γ) stays near 1. float32 stays finite while one call's queries span under
~36,000 positions (0.29^(−span/512) < 3e38). Because the origin moves with the queries, a key
scaled for one call is wrong for the next: caches keep keys unrotated (``length_dependent``).
Causal only: for a key after its query (j > i) the product grows with distance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import checks
from ..kernels import rope_cos_sin
from .positioned import PositionedEncoding
from .rotary import RoPE

#: ζ_c = (2c/Dh + GAMMA) / (1 + GAMMA), the paper's 0.4
GAMMA = 0.4


class XPos(RoPE):
    """xPos: RoPE (any layout, base) with the per-pair decay ζ_c^((i−j)/scale_base)."""

    length_dependent = True

    def __init__(self, head_dim: int, base: float = 10000.0, layout: str = "half", scale_base: float = 512.0):
        super().__init__(head_dim, base=base, layout=layout)
        self.scale_base = checks.positive_float("scale_base", scale_base)
        self.length_dependent = True  # RoPE.__init__ sets it from the scaling; the origin moves per call

    def decay(self, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
        """ζ_c for each pair, (F,)."""
        pairs = torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device) / self.head_dim
        return ((pairs + GAMMA) / (1 + GAMMA)).to(dtype)

    def _cos_sin(self, at: PositionedEncoding, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        inv_freq, factor = self.frequencies()
        origin = at.q_pos.amax(-1, keepdim=True)  # (B or 1, 1)
        log_decay = self.decay(device=at.q_pos.device).log() / self.scale_base  # (F,) float64

        def tables(positions: Tensor, sign: float) -> tuple[Tensor, Tensor]:
            cos, sin = rope_cos_sin(positions, inv_freq, factor, torch.float64)  # (B or 1, 1, T, F)
            scale = torch.exp(sign * (positions - origin).to(torch.float64)[:, None, :, None] * log_decay)
            return (cos * scale).to(dtype), (sin * scale).to(dtype)

        return (*tables(at.q_pos, 1.0), *tables(at.k_pos, -1.0))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, layout={self.layout!r}, base={self.scaling['rope_theta']}, " \
               f"scale_base={self.scale_base}"
