"""RoPE over several position axes: M-RoPE for vision-language models and 2-D RoPE for image patches.

A token has one position per axis, positions (A, B or 1, T) int64, and each rotated pair c turns by
``Σ_a p_a · ω_{a,c}``: a frequency table (A, H or 1, F) says how fast pair c turns along each axis.
  - ``MRoPE`` (Qwen2-VL, Wang et al. 2024, arXiv:2409.12191): axes (temporal, height, width); the
    F = Dh/2 frequencies of plain RoPE are dealt out to the axes, in contiguous sections by
    ``mrope_section`` (Qwen2-VL: [16, 24, 24]) or interleaved, pair c to H when c ≡ 1 and to W when
    c ≡ 2 (mod 3) inside their sections (Qwen3-VL). A text token has the same position on every
    axis and then turns exactly as plain RoPE.
  - ``AxialRoPE`` (Qwen2-VL's vision tower): axes (row, column); the first Dh/4 pairs turn with
    the row and the next Dh/4 with the column, at frequencies base^(−4i/Dh). ``mixed=True`` is
    RoPE-Mixed (Heo et al. 2024, arXiv:2403.13298): every pair turns with both axes at learned
    per-head frequencies, initialized as the axial ones rotated by a random angle per head (half
    the pairs at that angle, half at it + π/2).

Layout is ``half`` (pairs (c, c + Dh/2)), as transformers rotates them. ``rotate(q, k, q_pos,
k_pos)`` takes (A, B or 1, T) positions (or (B or 1, T): the same position on every axis);
``attention()`` takes these encodings with ordinary 1-D positions (text), so for images rotate q
and k here and attend with ``posenc.attention(q, k, v)``, which orders by sequence index.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import checks
from ..kernels import rotate_pairs
from .base import PositionalEncoding
from .positioned import PositionedEncoding
from .scaling import rope_frequencies


def axis_angles(positions: Tensor, frequencies: Tensor) -> Tensor:
    """Σ_a p_a · ω_{a,c} in float64. positions (A, B or 1, T) int; frequencies (A, H or 1, F)
    -> (B or 1, H or 1, T, F)."""
    return torch.einsum("abt,ahf->bhtf", positions.to(torch.float64), frequencies.to(torch.float64))


def _rotate_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The rotation written out, for tables that need a gradient (learned frequencies)."""
    pairs = cos.shape[-1]
    x1, x2 = x[..., :pairs].to(cos.dtype), x[..., pairs : 2 * pairs].to(cos.dtype)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., 2 * pairs :].to(cos.dtype)), dim=-1)
    return rotated.to(x.dtype)


class MultiAxisRoPE(PositionalEncoding):
    """Shared machinery: subclasses give ``axes`` and ``axis_frequencies``."""

    has_rotation = True
    axes = 1

    def axis_frequencies(self, device=None) -> Tensor:
        """(A, H or 1, F) radians per unit of position along each axis."""
        raise NotImplementedError

    def axis_positions(self, positions: Tensor) -> Tensor:
        """(A, B or 1, T): positions (T,) or (B or 1, T) repeat on every axis."""
        if positions.dim() == 1:
            positions = positions.unsqueeze(0)
        if positions.dim() == 2:
            return positions.expand(self.axes, *positions.shape)
        if positions.dim() != 3 or positions.shape[0] != self.axes:
            raise ValueError(f"positions must be (T,), (B, T) or ({self.axes}, B, T) for {type(self).__name__}, "
                             f"got {tuple(positions.shape)}")
        return positions

    def tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin (B or 1, H or 1, T, F) in ``dtype``."""
        angles = axis_angles(self.axis_positions(positions), self.axis_frequencies(positions.device))
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _turn(self, x: Tensor, positions: Tensor) -> Tensor:
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = self.tables(positions, compute)
        return _rotate_half(x, cos, sin) if cos.requires_grad else rotate_pairs(x, cos, sin, "half")

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh); positions (A, B or 1, T) or (B or 1, T)."""
        checks.rotated_tensors(q, k, self.head_dim)
        return self._turn(q, q_pos), self._turn(k, k_pos)

    def rotate_positioned(self, at: PositionedEncoding, q: Tensor, k: Tensor, in_place: bool = False
                          ) -> tuple[Tensor, Tensor]:
        return self.rotate(q, k, at.q_pos, at.k_pos)


class MRoPE(MultiAxisRoPE):
    """Multimodal RoPE over (temporal, height, width), sections as Qwen2-VL or interleaved as Qwen3-VL."""

    axes = 3

    def __init__(self, head_dim: int, mrope_section: tuple[int, int, int] | None = None, base: float = 10000.0,
                 interleaved: bool = False):
        super().__init__()
        self.head_dim = checks.even_int("head_dim", head_dim)
        if mrope_section is None:  # Qwen2-VL's proportions, [16, 24, 24] of 64 pairs: 1/4, 3/8, 3/8
            spatial = round(3 * head_dim / 16)
            mrope_section = (head_dim // 2 - 2 * spatial, spatial, spatial)
        self.mrope_section = tuple(checks.positive_int("mrope_section", s, minimum=0) for s in mrope_section)
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != head_dim // 2:
            raise ValueError(f"mrope_section must be 3 counts summing to head_dim/2 = {head_dim // 2}, "
                             f"got {list(mrope_section)}")
        self.base = checks.positive_float("base", base, minimum=1.0)
        self.interleaved = bool(interleaved)

    def axis_of_pair(self) -> Tensor:
        """Which axis (0 T, 1 H, 2 W) each of the Dh/2 pairs follows, (F,) int64."""
        pairs = torch.arange(self.head_dim // 2)
        temporal, height, width = self.mrope_section
        if not self.interleaved:
            return (pairs >= temporal).long() + (pairs >= temporal + height).long()
        axis = torch.zeros_like(pairs)
        axis[(pairs % 3 == 1) & (pairs < 3 * height)] = 1
        axis[(pairs % 3 == 2) & (pairs < 3 * width)] = 2
        return axis

    def axis_frequencies(self, device=None) -> Tensor:
        inv_freq, _ = rope_frequencies(self.head_dim, {"rope_theta": self.base})  # transformers' float32 values
        chosen = self.axis_of_pair()[None, :] == torch.arange(3)[:, None]  # (3, F)
        return (inv_freq.double() * chosen)[:, None, :].to(device)  # (3, 1, F)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, mrope_section={list(self.mrope_section)}, base={self.base}, "
                f"interleaved={self.interleaved}")


class AxialRoPE(MultiAxisRoPE):
    """2-D RoPE for patches at (row, column); ``mixed=True``: RoPE-Mixed's learned per-head frequencies."""

    axes = 2

    def __init__(self, head_dim: int, base: float = 10000.0, mixed: bool = False, num_heads: int | None = None):
        super().__init__()
        if checks.positive_int("head_dim", head_dim) % 4:
            raise ValueError(f"head_dim must be a multiple of 4 for 2-D RoPE (a quarter per axis and side), got {head_dim}")
        self.head_dim, self.base, self.mixed = head_dim, checks.positive_float("base", base, minimum=1.0), bool(mixed)
        if mixed:
            self.num_heads = checks.positive_int("num_heads", num_heads)
            self.mixed_frequencies = nn.Parameter(self._mixed_init(self.num_heads))  # (2, H, Dh/2)

    def axial_inv_freq(self) -> Tensor:
        """base^(−2i/(Dh/2)) for i < Dh/4, float32, computed as transformers' vision tower does. (Dh/4,)"""
        spatial = self.head_dim // 2
        return 1.0 / (self.base ** (torch.arange(0, spatial, 2, dtype=torch.float) / spatial))

    def _mixed_init(self, heads: int) -> Tensor:
        magnitude = self.axial_inv_freq().double()  # (Dh/4,)
        angle = torch.rand(heads, 1, dtype=torch.float64) * 2 * math.pi  # (H, 1)
        directions = torch.cat((angle.expand(-1, magnitude.numel()), (angle + math.pi / 2).expand(-1, magnitude.numel())), 1)
        both = torch.cat((magnitude, magnitude))  # (Dh/2,)
        return torch.stack((both * directions.cos(), both * directions.sin())).float()  # (2, H, Dh/2)

    def axis_frequencies(self, device=None) -> Tensor:
        if self.mixed:
            return self.mixed_frequencies.to(device)
        inv_freq = self.axial_inv_freq().double()
        zeros = torch.zeros_like(inv_freq)
        return torch.stack((torch.cat((inv_freq, zeros)), torch.cat((zeros, inv_freq))))[:, None, :].to(device)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, mixed={self.mixed}"
