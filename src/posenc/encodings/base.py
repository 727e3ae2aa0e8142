"""The encoding protocol: position enters attention at four doors.

| door                   | hook                             | schemes                  |
| ---------------------- | -------------------------------- | ------------------------ |
| input                  | ``embed(x, positions)``          | sinusoidal, learned      |
| q/k transform          | ``rotate(q, k, q_pos, k_pos)``   | RoPE and its scalings    |
| score bias             | ``bias_at(offset, head)``        | ALiBi, T5                |
| content-position terms | ``relative_logits`` / ``relative_values`` | Shaw, Transformer-XL |

The base class is NoPE: every hook is the identity or absent. A scheme overrides
only its own doors and sets the matching ``has_*`` flag, so ``attention()`` and
the model compose whatever a scheme offers without asking which scheme it is.

Shapes: B batch, H heads, Tq/Tk query/key length, Dh head width, D model width.
Positions are int64 (B or 1, T); ``offset = q_position - k_position`` everywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PositionalEncoding(nn.Module):
    """NoPE (no positional encoding); the base of every scheme."""

    has_input = False
    has_rotation = False
    has_bias = False
    has_relative_logits = False
    has_relative_values = False
    #: heads this encoding was built for; None when it works with any count.
    num_heads: int | None = None

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """Input door. x: (B, T, D); positions: (B or 1, T). Returns (B, T, D)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """q/k door. q: (B, H, Tq, Dh), k: (B, H, Tk, Dh). Returns both, same shapes."""
        return q, k

    def bias_at(self, offset: Tensor, head: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Score-bias door, elementwise: offset and head broadcast to the bias shape.

        Returns the bias in ``dtype`` (float32, or float64 for oracles).

        Elementwise so the same function builds a dense (B, H, Tq, Tk) bias for the
        eager/SDPA backends and serves as a FlexAttention ``score_mod``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no score bias")

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Dense bias (B or 1, H, Tq, Tk) in ``dtype``, added to the scaled logits."""
        offset = (q_pos[:, :, None] - k_pos[:, None, :]).unsqueeze(1)  # (B, 1, Tq, Tk)
        head = torch.arange(self.num_heads, device=offset.device).view(1, -1, 1, 1)  # (1, H, 1, 1)
        return self.bias_at(offset, head, dtype)

    def relative_logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Content-position logits (B, H, Tq, Tk), added to q·kᵀ *before* the 1/√Dh scale."""
        raise NotImplementedError(f"{type(self).__name__} has no content-position logits")

    def relative_values(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Content-position values: Σ_j probs_ij a_{i-j}. probs: (B, H, Tq, Tk) -> (B, H, Tq, Dh)."""
        raise NotImplementedError(f"{type(self).__name__} has no content-position values")

    @property
    def doors(self) -> tuple[str, ...]:
        """Names of the doors this encoding uses, for reports and error messages."""
        flags = {
            "input": self.has_input,
            "rotation": self.has_rotation,
            "bias": self.has_bias,
            "relative_logits": self.has_relative_logits,
            "relative_values": self.has_relative_values,
        }
        return tuple(name for name, used in flags.items() if used)


class NoPE(PositionalEncoding):
    """No positional encoding: attention sees a bag of tokens (and, causally, their count)."""
