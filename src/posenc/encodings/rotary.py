"""RoPE: Su et al. 2021, RoFormer (arXiv:2104.09864).

Channel pairs of queries and keys are rotated by ``position · inv_freq``; the
logit q_i·k_j then depends on positions only through i - j. Two layouts pair the
channels differently and are a fixed permutation of each other:
  - ``half`` (Llama, GPT-NeoX, transformers' ``rotate_half``): pairs (c, c + F);
  - ``interleaved`` (RoFormer, GPT-J): pairs (2c, 2c + 1).
With partial rotary only the first 2F channels rotate; the rest pass through. With
``rotary_heads=n`` only the first n query heads (and the key heads they read under GQA)
rotate and the others are NoPE heads: the third kind of "partial rotary" (see ``scaling``).
This rotates by +angle, the textbook direction: (x1, x2) -> (x1 cos − x2 sin, x2 cos + x1 sin).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from .. import checks
from ..kernels import (rope_angles, rope_cos_sin, rope_qk_triton, rope_qk_triton_, rotate_pairs, rotate_pairs_,
                       triton_available)
from .base import PositionalEncoding
from .positioned import PositionedEncoding
from .scaling import SCALINGS, normalize_scaling, rope_frequencies

LAYOUTS = ("half", "interleaved")


def apply_rope(
    x: Tensor, positions: Tensor, inv_freq: Tensor, attention_factor: float = 1.0, layout: str = "half"
) -> Tensor:
    """Rotate the first 2F channels of x by its positions.

    Angles come from int64 positions in float64; the rotation runs in float32
    (float64 for float64 x) and the result is cast back to x's dtype, so bf16
    activations at position 2^20 still rotate by the right angle. The rotation is
    ``kernels.rotate_pairs``: fused, with a backward pass that saves only cos/sin.

    Args:
        x: (B, H, T, Dh) queries or keys, Dh >= 2F.
        positions: (T,) or (B or 1, T) integer positions; a negative one rotates backwards (a difference of two
            positions, as Self-Extend and DCA rotate by).
        inv_freq: (F,) from rope_frequencies().
        attention_factor: multiplies cos and sin (YaRN, LongRoPE).
        layout: "half" or "interleaved".
    Returns:
        (B, H, T, Dh), same dtype as x.
    """
    positions = _checked_rope_inputs(x, positions, inv_freq, layout)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = rope_cos_sin(positions, inv_freq, attention_factor, compute)  # (B or 1, 1, T, F)
    return rotate_pairs(x, cos, sin, layout)


def _checked_rope_inputs(x: Tensor, positions: Tensor, inv_freq: Tensor, layout: str) -> Tensor:
    """``apply_rope``'s arguments checked by shape and dtype alone (no value is read: it runs inside compiled
    graphs); returns the positions as (B or 1, T)."""
    if not isinstance(x, Tensor) or x.dim() != 4:
        raise ValueError(f"x must be a 4-D tensor (B, H, T, Dh), got {tuple(getattr(x, 'shape', ())) or type(x)}")
    batch, _, length, width = x.shape
    given = tuple(getattr(positions, "shape", ()))
    positions = checks.batched_positions("positions", positions)
    if (positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.shape[-1] != length
            or positions.shape[0] not in (1, batch)):
        raise ValueError(f"positions must be an integer tensor of shape ({length},) or ({batch}, {length}) to match "
                         f"x, got {positions.dtype} {given or tuple(positions.shape)}")
    if not isinstance(inv_freq, Tensor) or inv_freq.dim() != 1 or 2 * inv_freq.shape[0] > width:
        raise ValueError(f"inv_freq must be a (F,) tensor with 2F <= Dh = {width}, got "
                         f"{tuple(getattr(inv_freq, 'shape', ())) or type(inv_freq)}")
    checks.choice("layout", layout, LAYOUTS)
    return positions


class RoPE(PositionalEncoding):
    """Rotary position embedding, with any frequency scaling from ``scaling.SCALINGS``.

    ``scaling`` is a Hugging Face ``rope_parameters`` dict; its ``rope_theta``, when
    present, is the base (default 10,000); a ``base`` given beside a different one is an error. Frequencies are computed on demand from the config
    (never stored as a buffer, so ``module.to(torch.bfloat16)`` cannot round them;
    cf. transformers issue #29496). For length-dependent scalings (``dynamic``,
    ``longrope``) the length is the largest position seen in the call plus one,
    shared by queries and keys so their rotations stay consistent.
    """

    has_rotation = True

    def __init__(self, head_dim: int, base: float | None = None, layout: str = "half", scaling: dict | None = None,
                 rotary_heads: int | None = None):
        super().__init__()
        theta = scaling.get("rope_theta") if isinstance(scaling, Mapping) else None  # else normalize_scaling refuses
        if base is not None and theta is not None and float(theta) != float(base):
            raise ValueError(f"base={base} and scaling['rope_theta']={theta} disagree; give the base once")
        self.rotary_heads = None if rotary_heads is None else checks.positive_int("rotary_heads", rotary_heads)
        self.head_dim = checks.even_int("head_dim", head_dim)
        self.layout = checks.choice("layout", layout, LAYOUTS)
        base = 10000.0 if base is None else checks.positive_float("base", base, minimum=1.0)
        self.scaling = normalize_scaling(scaling, base=base)
        self.length_dependent = SCALINGS[self.scaling["rope_type"]].length_dependent
        checked = rope_frequencies(head_dim, self.scaling, seq_len=1)  # a bad dict refused now, not at a long input
        self._fixed = None if self.length_dependent else checked

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        """(inv_freq (F,) float32, attention_factor) for a context of seq_len tokens."""
        if self._fixed is not None:
            return self._fixed
        return rope_frequencies(self.head_dim, self.scaling, seq_len=seq_len)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        checks.rotated_tensors(q, k, self.head_dim)
        q_pos = checks.integer_positions("q_pos", q_pos, q.shape[2], q.shape[0], "q")
        k_pos = checks.integer_positions("k_pos", k_pos, k.shape[2], k.shape[0], "k")
        return self.rotate_positioned(self.at(q_pos, k_pos), q, k)

    def rotate_positioned(self, at: PositionedEncoding, q: Tensor, k: Tensor, in_place: bool = False
                          ) -> tuple[Tensor, Tensor]:
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        q_cos, q_sin, k_cos, k_sin = at.memo(("rope", compute), lambda: self._cos_sin(at, compute))
        if self.rotary_heads is not None:
            return self._rotate_some_heads(q, k, q_cos, q_sin, k_cos, k_sin)
        if q.is_cuda and not torch.compiler.is_compiling() and triton_available():  # q and k in one launch
            kernel = rope_qk_triton_ if in_place else rope_qk_triton
            return kernel(q, k, q_cos, q_sin, k_cos, k_sin, self.layout)
        rotate = rotate_pairs_ if in_place else rotate_pairs
        return rotate(q, q_cos, q_sin, self.layout), rotate(k, k_cos, k_sin, self.layout)

    def _rotate_some_heads(self, q: Tensor, k: Tensor, *tables: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate the first ``rotary_heads`` query heads and the key heads they read; the rest pass."""
        heads, kv_heads = q.shape[1], k.shape[1]
        if self.rotary_heads > heads or (self.rotary_heads * kv_heads) % heads:
            raise ValueError(f"rotary_heads={self.rotary_heads} must be at most the {heads} query heads and a "
                             f"multiple of the query heads per key head ({heads // kv_heads}) under GQA")
        q_cos, q_sin, k_cos, k_sin = tables
        n_q, n_k = self.rotary_heads, self.rotary_heads * kv_heads // heads
        q = torch.cat((rotate_pairs(q[:, :n_q], q_cos, q_sin, self.layout), q[:, n_q:]), dim=1)
        k = torch.cat((rotate_pairs(k[:, :n_k], k_cos, k_sin, self.layout), k[:, n_k:]), dim=1)
        return q, k

    def _cos_sin(self, at: PositionedEncoding, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """cos, sin for queries then keys, each (B or 1, 1, T, F); one set when they share positions."""
        inv_freq, factor = self.frequencies(at.context_length() if self.length_dependent else None)
        q_cos, q_sin = rope_cos_sin(at.q_pos, inv_freq, factor, dtype)
        if at.k_pos is at.q_pos:
            return q_cos, q_sin, q_cos, q_sin
        k_cos, k_sin = rope_cos_sin(at.k_pos, inv_freq, factor, dtype)
        return q_cos, q_sin, k_cos, k_sin

    def extra_repr(self) -> str:
        heads = "" if self.rotary_heads is None else f", rotary_heads={self.rotary_heads}"
        return f"head_dim={self.head_dim}, layout={self.layout!r}, scaling={self.scaling}{heads}"
