"""The encoding protocol: position enters attention at six doors.

| door                   | hook                             | schemes                  |
| ---------------------- | -------------------------------- | ------------------------ |
| input                  | ``embed(x, positions)``          | sinusoidal, learned      |
| q/k transform          | ``rotate(q, k, q_pos, k_pos)``   | RoPE and its scalings    |
| score bias             | ``bias_at(offset, head)``        | ALiBi, T5                |
| content-position terms | ``relative_logits`` / ``relative_values`` | Shaw, Transformer-XL |
| normalization          | ``weights(logits, allowed)``     | stick-breaking           |
| token gates            | ``log_forget(x)`` → score bias   | FoX                      |

A score term that factors into query-side times key-side numbers may also offer ``score_channels``: q and k widened
by extra channels whose dot product *is* the term, so a fused kernel that takes no bias (SDPA's causal path) runs it
exactly (ALiBi, Transformer-XL). The bias or content-position door stays the reference it must equal.

The base class is NoPE: every hook is the identity or absent. A scheme overrides only its own doors and sets the
matching ``has_*`` flag, so ``attention()`` and the model compose whatever a scheme offers without asking which
scheme it is.

``encoding.at(q_pos, k_pos)`` fixes the positions of one forward pass (``positioned.PositionedEncoding``): what
depends on positions alone (RoPE's cos/sin, a dense score bias) is then built once, on first use, and shared by every
layer that attends with it.

Shapes: B batch, H heads, Tq/Tk query/key length, Dh head width, D model width.
Positions are int64 (B or 1, T); ``offset = q_position - k_position`` everywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import checks
from ..kernels.channels import materialized, widen
from .positioned import PositionedEncoding

class PositionalEncoding(nn.Module):
    """NoPE (no positional encoding); the base of every scheme."""

    has_input = False
    has_rotation = False
    has_bias = False
    has_relative_logits = False
    relative_logits_scaled = True  # False: the content-position term is added after the logit scale (CoPE)
    has_relative_values = False
    #: the score terms can also ride along q and k as extra channels (``score_channels``)
    has_score_channels = False
    #: the score bias is a function of (offset, head) alone (``bias_at``); False when it also reads
    #: the query's position (FIRE), which then overrides ``score_bias``
    bias_from_offset = True
    #: keys from which ``score_channels`` is the faster form on CPU (see ``channels_from_keys``);
    #: ``math.inf`` where it never measured faster
    cpu_channels_from_keys: float = 0
    #: heads this encoding was built for; None when it works with any count.
    num_heads: int | None = None
    #: the attention weights are not a softmax of the logits but the encoding's ``weights(logits, allowed)``
    #: (stick-breaking); eager serves it, and sdpa where a kernel does (``kernels.forms.WHOLE_FORMS``)
    replaces_softmax = False
    #: no bidirectional form (stick-breaking, FoX): ``attention()`` refuses causal=False
    causal_only = False
    #: a query may attend to the key at its own position under a causal mask (stick-breaking's default: not)
    attends_to_itself = True
    #: the score bias is made from per-token forget gates the caller passes (``with_gates``; FoX), not positions
    has_token_gates = False
    #: queries scaled by a function of their position (``temperature.QueryTemperature``; ``build(...,
    #: temperature={...})``), after the rotation
    temperature = None
    #: the q/k rotation depends on the context length (dynamic NTK, LongRoPE), so a key
    #: rotated at one step is wrong at the next: caches must keep keys unrotated.
    length_dependent = False

    @property
    def only_rotates(self) -> bool:
        """Whether softmax(q·kᵀ)·v of the rotated q and k is the whole of this encoding's attention (NoPE, RoPE,
        an input-door encoding): what ``kernels.local`` and the fused causal paths serve."""
        return not (self.has_bias or self.has_relative_logits or self.has_relative_values or self.replaces_softmax
                    or self.has_token_gates or not self.attends_to_itself)

    def embed(self, x: Tensor, positions: Tensor, seq_len: int | None = None) -> Tensor:
        """Input door. x: (B, T, D); positions: (B or 1, T). Returns (B, T, D).

        ``seq_len``: largest position + 1 when the caller knows it (a model does for its
        own positions); an encoding that needs it then never reads the positions' values,
        which a ``torch.compile`` graph cannot do.
        """
        return x

    def at(self, q_pos: Tensor, k_pos: Tensor, seq_len: int | None = None, contiguous: bool = False
           ) -> PositionedEncoding:
        """This encoding at fixed positions (see ``PositionedEncoding``); (Tq,) or (B or 1, Tq), and likewise k."""
        return PositionedEncoding(self, checks.batched_positions("q_pos", q_pos),
                                  checks.batched_positions("k_pos", k_pos), seq_len, contiguous)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """q/k door. q: (B, H, Tq, Dh), k: (B, H, Tk, Dh); positions (T,) or (B or 1, T). Returns both, same
        shapes."""
        return q, k

    def rotate_positioned(self, at: PositionedEncoding, q: Tensor, k: Tensor, in_place: bool = False
                          ) -> tuple[Tensor, Tensor]:
        """The q/k door with the positions' tables memoized in ``at``; same result as ``rotate``.
        ``in_place``: q and k may be overwritten (use the returned tensors either way)."""
        return self.rotate(q, k, at.q_pos, at.k_pos)

    def bias_at(self, offset: Tensor, head: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Score-bias door, elementwise: offset and head broadcast to the bias shape.

        Returns the bias in ``dtype`` (float32, or float64 for oracles).

        Elementwise so the same function builds a dense (B, H, Tq, Tk) bias for the
        eager/SDPA backends and serves as a FlexAttention ``score_mod``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no score bias")

    def offset_table(self, lowest: int, highest: int, last_query: int, device: torch.device,
                     dtype: torch.dtype = torch.float32) -> Tensor | None:
        """The bias of offsets lowest..highest as an (H, N) table, for queries at positions up to ``last_query``;
        None where the bias is not a function of (offset, head) there (token gates, FIRE past its threshold)."""
        if not self.has_bias or not self.bias_from_offset or self.has_token_gates:
            return None
        offset = torch.arange(lowest, highest + 1, device=device)[None, :]
        return self.bias_at(offset, torch.arange(self.num_heads, device=device)[:, None], dtype)

    def offset_formula(self) -> tuple[str, Tensor] | None:
        """The bias as (kind, params (H, P) float32, differentiable) that ``kernels.tiles_triton`` computes in its
        tiles (kind and P: its ``Formula``); None: it reads ``offset_table``."""
        return None

    def flat_offsets(self, lowest: int, highest: int) -> tuple[int, int] | None:
        """(low, high): of offsets lowest..highest, those ≤ low share one bias and one parameter, and so do those
        ≥ high (lowest − 1, highest + 1: none); None: no such runs."""
        return None

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """Dense bias (B or 1, H, Tq, Tk) in ``dtype``, added to the scaled logits; positions (T,) or (B or 1, T)."""
        q_pos, k_pos = checks.batched_positions("q_pos", q_pos), checks.batched_positions("k_pos", k_pos)
        offset = (q_pos[:, :, None] - k_pos[:, None, :]).unsqueeze(1)  # (B, 1, Tq, Tk)
        head = torch.arange(self.num_heads, device=offset.device).view(1, -1, 1, 1)  # (1, H, 1, 1)
        return self.bias_at(offset, head, dtype)

    def relative_logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, allowed: Tensor | None = None
                        ) -> Tensor:
        """Content-position logits (B, H, Tq, Tk), added to q·kᵀ *before* the logit scale, or after it where
        ``relative_logits_scaled`` is False.

        ``allowed``: bool (B or 1, 1 or H, Tq, Tk), the pairs that may attend (None: all), for
        terms that count over the keys a query sees (CoPE); the others ignore it."""
        raise NotImplementedError(f"{type(self).__name__} has no content-position logits")

    def relative_values(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Content-position values: Σ_j probs_ij a_{i-j}. probs: (B, H, Tq, Tk) -> (B, H, Tq, Dh)."""
        raise NotImplementedError(f"{type(self).__name__} has no content-position values")

    def score_channels(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float
                       ) -> tuple[Tensor, Tensor]:
        """q (B, H, Tq, Dh) and k (B, Hkv, Tk, Dh), already rotated, widened to (…, Dh + C) so that
        ``scale · q'·k'ᵀ`` equals ``scale · (q·kᵀ + relative_logits) + score_bias`` up to a constant per
        query row (which the softmax ignores)."""
        content, query_side, key_side = self.score_channel_parts(q, k, q_pos, k_pos, scale)
        return widen(materialized(content), materialized(query_side)), widen(k, key_side)

    def score_channel_parts(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float
                            ) -> tuple[Tensor, Tensor, Tensor]:
        """``score_channels`` before widening: (q's content side (B, H, Tq, Dh), or ``ShiftedQueries``, the query side of the extra
        channels (B or 1, H, Tq, C), or ``ChannelBlocks`` building it per query block, and their key side
        (B or 1, 1, Tk, C), shared by every head)."""
        raise NotImplementedError(f"{type(self).__name__} has no score channels")

    def channels_exact(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype, contiguous: bool) -> bool:
        """Whether ``score_channels`` at these positions, in ``dtype``, stays within ``posenc verify``'s
        tolerance of the reference door. ``contiguous``: as for ``PositionedEncoding``."""
        return False

    @property
    def doors(self) -> tuple[str, ...]:
        """Names of the doors this encoding uses, for reports and error messages."""
        flags = {"input": self.has_input, "rotation": self.has_rotation, "bias": self.has_bias,
                 "relative_logits": self.has_relative_logits, "relative_values": self.has_relative_values,
                 "normalization": self.replaces_softmax, "token_gates": self.has_token_gates}
        return tuple(name for name, used in flags.items() if used)


class NoPE(PositionalEncoding):
    """No positional encoding: attention sees a bag of tokens (and, causally, their count)."""
