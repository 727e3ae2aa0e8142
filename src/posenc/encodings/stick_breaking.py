"""Stick-breaking attention (Tan et al., ICLR 2025, arXiv:2410.17980): no position encoding; order enters through
the normalization, which replaces the softmax.

For query i, each earlier key j gets β_ij = σ(z_ij), z_ij = scale · q_i·k_j, and takes that share of the stick
the nearer keys left over:

    A_ij = β_ij · Π_{j < l < i} (1 − β_il),        out_i = Σ_j A_ij v_j

computed in log space as log σ(z_ij) + Σ_{l > j} log σ(−z_il) over the allowed keys l (a reverse cumulative sum
along the keys). Weights sum to at most 1; the rest of the stick goes nowhere (the paper's default). "Between"
is the order of the keys along their axis, the order they arrived in, and only allowed keys (causal, mask)
break the stick, so packed documents under a document mask and KV-cache decoding need nothing more. A query
does not attend to its own key unless ``attend_current`` (the reference code's default is not to).

There is no bidirectional form (the stick is broken from the nearest earlier key backwards): ``attention()``
refuses ``causal=False``. flex does not serve it; sdpa serves it on CPU, where ``kernels.sticks`` runs calls at
the model's own positions with no mask (and eager the others), and ``auto`` picks sdpa there, eager elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import PositionalEncoding


class StickBreaking(PositionalEncoding):
    """Stick-breaking attention weights in place of the softmax; no position doors."""

    replaces_softmax = True
    causal_only = True

    def __init__(self, attend_current: bool = False):
        super().__init__()
        if not isinstance(attend_current, bool):
            raise ValueError(f"attend_current must be True or False, got {attend_current!r}")
        self.attend_current = attend_current
        self.attends_to_itself = attend_current

    def stick_breaking_current(self) -> bool:
        """Whether a query's own key takes a share of its stick, what ``kernels.sticks`` reads."""
        return self.attend_current

    def weights(self, logits: Tensor, allowed: Tensor | None) -> Tensor:
        """(B, H, Tq, Tk) weights from scaled logits of the same shape; ``allowed``: bool, broadcastable, the
        pairs that may attend (causal and mask), None for all. Rows sum to at most 1 (0 where nothing is allowed)."""
        log_rest = F.logsigmoid(-logits)  # log(1 − β)
        if allowed is not None:
            log_rest = log_rest.masked_fill(~allowed, 0.0)
        # Σ over the allowed keys after j, exclusive of j itself: a reverse cumulative sum, shifted by one key
        later = F.pad(log_rest[..., 1:], (0, 1)).flip(-1).cumsum(-1).flip(-1)
        weights = torch.exp(F.logsigmoid(logits) + later)
        return weights if allowed is None else weights.masked_fill(~allowed, 0.0)

    def extra_repr(self) -> str:
        return f"attend_current={self.attend_current}"
