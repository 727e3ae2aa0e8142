"""CoPE: Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count What's
Important" (arXiv:2405.18719).

Positions are counted, not given: each key j gets a gate g_ij = σ(q_i·k_j / √Dh) and its position
seen from query i is the number of gated keys between them,

    p_ij = Σ_{t = j..i} g_it,     logits_ij += q_i · e[p_ij]

with e a learned table of ``max_positions`` vectors (shared by the heads, zero at init as in the
paper), interpolated linearly between the integers around p_ij and clamped at the last. Only
q·e[p] for the integer p is formed, (B, H, Tq, P), then gathered (the paper's trick).

Counting runs over the keys a query may attend to (``allowed``: causal, documents, padding),
which must be in position order within each query's allowed set, as a model's keys and a KV
cache are. Bidirectionally, a key after its query counts the gates from i up to j. Values
depend on q and k, so this is a content-position term (eager and SDPA; FlexAttention refuses),
and its gates use the encoding's own 1/√Dh, whatever scale attention is given. As in the
paper's code, q·e[p] is added to the logits *after* the attention's scale
(``relative_logits_scaled = False``), so the paper's table loads as it is: its
``pos_emb`` (1, Dh, P) is ``embeddings`` (P, Dh) transposed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import checks
from .base import PositionalEncoding


class CoPE(PositionalEncoding):
    """Contextual positions: gated counts of keys, looked up in a learned table ``embeddings`` (P, Dh)."""

    has_relative_logits = True
    relative_logits_scaled = False

    def __init__(self, head_dim: int, max_positions: int = 64):
        super().__init__()
        self.head_dim = checks.positive_int("head_dim", head_dim)
        self.max_positions = checks.positive_int("max_positions", max_positions, minimum=2)
        self.embeddings = nn.Parameter(torch.zeros(max_positions, head_dim))

    def gated_counts_parts(self) -> tuple[Tensor, float]:
        """(embeddings (P, Dh), gate_scale), what ``kernels.gated_counts`` reads."""
        return self.embeddings, self.gate_scale

    @property
    def gate_scale(self) -> float:
        """The gates' logit scale, 1/√Dh, whatever scale attention is given."""
        return self.head_dim**-0.5

    def contextual_positions(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor,
                             allowed: Tensor | None = None) -> Tensor:
        """p_ij, (B, H, Tq, Tk) in q's dtype: 0 for pairs that may not attend. Outside autocast, which would count
        in bf16 (not an integer past 256) or mix dtypes (CUDA's autocast sums in float32)."""
        with torch.autocast(q.device.type, enabled=False):
            return self._contextual_positions(q, k, q_pos, k_pos, allowed)

    def _contextual_positions(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, allowed: Tensor | None
                              ) -> Tensor:
        gates = torch.sigmoid(q @ k.transpose(-1, -2) * self.gate_scale)  # (B, H, Tq, Tk)
        before = (k_pos[:, None, :] <= q_pos[:, :, None]).unsqueeze(1)  # (B or 1, 1, Tq, Tk)
        after = (k_pos[:, None, :] >= q_pos[:, :, None]).unsqueeze(1)
        if allowed is not None:
            before, after = before & allowed, after & allowed
        up_to_query = (gates * before).flip(-1).cumsum(-1).flip(-1)  # Σ over t ≥ j among keys before i
        from_query = (gates * after).cumsum(-1)  # Σ over t ≤ j among keys after i
        return torch.where(before, up_to_query, torch.where(after, from_query, torch.zeros_like(gates)))

    def relative_logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, allowed: Tensor | None = None
                        ) -> Tensor:
        with torch.autocast(q.device.type, enabled=False):  # as contextual_positions
            return self._relative_logits(q, k, q_pos, k_pos, allowed)

    def _relative_logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, allowed: Tensor | None
                         ) -> Tensor:
        positions = self.contextual_positions(q, k, q_pos, k_pos, allowed).clamp(max=self.max_positions - 1)
        per_integer = q @ self.embeddings.to(q.dtype).T  # (B, H, Tq, P)
        lower = positions.floor()
        below = per_integer.gather(-1, lower.long())
        above = per_integer.gather(-1, positions.ceil().long())
        return torch.lerp(below, above, positions - lower)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_positions={self.max_positions}"
