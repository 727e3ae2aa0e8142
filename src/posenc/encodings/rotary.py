"""RoPE: Su et al. 2021, RoFormer (arXiv:2104.09864).

Channel pairs of queries and keys are rotated by ``position · inv_freq``; the
logit q_i·k_j then depends on positions only through i - j. Two layouts pair the
channels differently and are a fixed permutation of each other:
  - ``half`` (Llama, GPT-NeoX, transformers' ``rotate_half``): pairs (c, c + F);
  - ``interleaved`` (RoFormer, GPT-J): pairs (2c, 2c + 1).
With partial rotary only the first 2F channels rotate; the rest pass through.
This rotates by +angle, the textbook direction: (x1, x2) -> (x1 cos − x2 sin, x2 cos + x1 sin).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import checks
from .base import PositionalEncoding
from .scaling import SCALINGS, normalize_scaling, rope_frequencies

LAYOUTS = ("half", "interleaved")


def rope_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Angles position · inv_freq in float64, exact for positions far beyond 2^20.

    Args:
        positions: (..., T) integer positions.
        inv_freq: (F,) inverse frequencies.
    Returns:
        (..., T, F) float64.
    """
    return positions.to(torch.float64)[..., None] * inv_freq.to(device=positions.device, dtype=torch.float64)


def apply_rope(
    x: Tensor, positions: Tensor, inv_freq: Tensor, attention_factor: float = 1.0, layout: str = "half"
) -> Tensor:
    """Rotate the first 2F channels of x by its positions.

    Angles come from int64 positions in float64; the rotation runs in float32
    (float64 for float64 x) and the result is cast back to x's dtype, so bf16
    activations at position 2^20 still rotate by the right angle.

    Args:
        x: (B, H, T, Dh) queries or keys, Dh >= 2F.
        positions: (B or 1, T) integer positions.
        inv_freq: (F,) from rope_frequencies().
        attention_factor: multiplies cos and sin (YaRN, LongRoPE).
        layout: "half" or "interleaved".
    Returns:
        (B, H, T, Dh), same dtype as x.
    """
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    pairs = inv_freq.shape[0]
    angles = rope_angles(positions, inv_freq).unsqueeze(1)  # (B or 1, 1, T, F)
    cos = (angles.cos() * attention_factor).to(compute)
    sin = (angles.sin() * attention_factor).to(compute)
    rotated, passed = x[..., : 2 * pairs].to(compute), x[..., 2 * pairs :]
    if layout == "half":
        x1, x2 = rotated[..., :pairs], rotated[..., pairs:]  # (B, H, T, F) each
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]  # (B, H, T, F) each
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((out.to(x.dtype), passed), dim=-1)


class RoPE(PositionalEncoding):
    """Rotary position embedding, with any frequency scaling from ``scaling.SCALINGS``.

    ``scaling`` is a Hugging Face ``rope_parameters`` dict; its ``rope_theta``, when
    present, overrides ``base``. Frequencies are computed on demand from the config
    (never stored as a buffer, so ``module.to(torch.bfloat16)`` cannot round them;
    cf. transformers issue #29496). For length-dependent scalings (``dynamic``,
    ``longrope``) the length is the largest position seen in the call plus one,
    shared by queries and keys so their rotations stay consistent.
    """

    has_rotation = True

    def __init__(self, head_dim: int, base: float = 10000.0, layout: str = "half", scaling: dict | None = None):
        super().__init__()
        self.head_dim = checks.even_int("head_dim", head_dim)
        self.layout = checks.choice("layout", layout, LAYOUTS)
        self.scaling = normalize_scaling(scaling, base=checks.positive_float("base", base, minimum=1.0))
        self.length_dependent = SCALINGS[self.scaling["rope_type"]].length_dependent
        self._fixed = None if self.length_dependent else rope_frequencies(head_dim, self.scaling)

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        """(inv_freq (F,) float32, attention_factor) for a context of seq_len tokens."""
        if self._fixed is not None:
            return self._fixed
        return rope_frequencies(self.head_dim, self.scaling, seq_len=seq_len)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        seq_len = None
        if self.length_dependent:
            seq_len = int(max(q_pos.max(), k_pos.max())) + 1
        inv_freq, factor = self.frequencies(seq_len)
        return (
            apply_rope(q, q_pos, inv_freq, factor, self.layout),
            apply_rope(k, k_pos, inv_freq, factor, self.layout),
        )

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, layout={self.layout!r}, scaling={self.scaling}"
