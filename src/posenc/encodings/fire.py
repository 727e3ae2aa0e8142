"""FIRE: Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long
Context Transformers" (arXiv:2310.04418).

A learned MLP of the *progressively interpolated* log distance, per head:

    b(i, j) = f_θ( ψ(i − j) / (ψ(max(L, i)) + ε) ),   ψ(x) = log(|c·x| + 1),  ε = 1e-6

Dividing by ψ of the query's own position maps every distance a query can see into [0, 1],
so a longer context never shows the MLP an input it was not trained on; the threshold L keeps
early queries from stretching their few distances over the whole range. f_θ: 1 → width → H
with a ReLU; c (init 0.1) and L (init 512, learned as a multiplier of 512) are learned, as in the
paper's pseudo-code.

The bias depends on the query's position as well as the offset, so this encoding overrides
``score_bias`` (``bias_from_offset = False``); FlexAttention looks its dense bias up per pair. Up to the
threshold the normaliser is ψ(L) for every query, so there the bias is a table of offsets (``offset_table``);
at any position the C++ and the Triton tiles read the MLP as its linear segments per pair (``distance_segments``,
``offset_formula``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import checks
from ..kernels.fire_segments import relu_segments
from .base import PositionalEncoding

INIT_THRESHOLD = 512.0
EPSILON = 1e-6  #: the paper's, added to ψ(max(L, i)): keeps the bias finite at c = 0, which training can reach


class FIRE(PositionalEncoding):
    """FIRE's bias (B or 1, H, Tq, Tk); parameters: the MLP, ``log_scale`` (c), ``threshold`` (L / 512)."""

    has_bias = True
    bias_from_offset = False

    def __init__(self, num_heads: int, width: int = 32, init_c: float = 0.1, init_threshold: float = INIT_THRESHOLD):
        super().__init__()
        self.num_heads = checks.positive_int("num_heads", num_heads)
        checks.positive_int("width", width)
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, num_heads))
        self.log_scale = nn.Parameter(torch.tensor(checks.positive_float("init_c", init_c)))
        threshold = checks.positive_float("init_threshold", init_threshold, minimum=1.0)
        self.threshold = nn.Parameter(torch.tensor(threshold / INIT_THRESHOLD))

    def interpolated_distance(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
        """ψ(i − j) / ψ(max(L, i)) in [0, 1] for the pairs a query can see: (B or 1, Tq, Tk) in ``dtype``."""
        c = self.log_scale.to(dtype).abs()
        query = q_pos.to(dtype)[:, :, None]  # (B or 1, Tq, 1)
        offset = (q_pos[:, :, None] - k_pos[:, None, :]).to(dtype)  # (B or 1, Tq, Tk)
        normalizer = torch.maximum(query, (self.threshold.to(dtype) * INIT_THRESHOLD).abs())
        return torch.log1p(c * offset.abs()) / (torch.log1p(c * normalizer) + EPSILON)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        q_pos, k_pos = checks.batched_positions("q_pos", q_pos), checks.batched_positions("k_pos", k_pos)
        x = self.interpolated_distance(q_pos, k_pos, dtype)
        weights = [(p.to(dtype)) for p in (self.mlp[0].weight, self.mlp[0].bias, self.mlp[2].weight, self.mlp[2].bias)]
        hidden = torch.relu(x.unsqueeze(-1) * weights[0][:, 0] + weights[1])  # (B or 1, Tq, Tk, width)
        bias = hidden @ weights[2].T + weights[3]  # (B or 1, Tq, Tk, H)
        return bias.permute(0, 3, 1, 2)  # (B or 1, H, Tq, Tk)

    def offset_table(self, lowest: int, highest: int, last_query: int, device: torch.device,
                     dtype: torch.dtype = torch.float32) -> Tensor | None:
        """(H, N): queries below the threshold L all divide by ψ(L), so the bias there depends on the offset alone,
        and is a query at position 0 against keys at −offset; None when a query reaches L."""
        if last_query >= float((self.threshold.detach() * INIT_THRESHOLD).abs()):
            return None
        keys = -torch.arange(lowest, highest + 1, device=device)[None, :]
        return self.score_bias(torch.zeros(1, 1, dtype=torch.long, device=device), keys, dtype)[0, :, 0, :]

    def distance_segments(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """(H, 3P + 2) in ``dtype`` (float32 or float64), differentiable: per head [keys (P), slopes (P), intercepts
        (P), c, L], the MLP as its segments (``kernels.fire_segments.relu_segments``, P = next power of two ≥ W + 1,
        keys exact for x of that dtype), which the C++ tiles (``kernels.offset_bias``) and the Triton tiles read per
        pair at any position, the query's included."""
        first, second = self.mlp[0], self.mlp[2]
        weights = (first.weight[:, 0], first.bias, second.weight, second.bias)  # in dtype, as score_bias: never bf16
        keys, slopes, intercepts = relu_segments(*(w.to(dtype) for w in weights), dtype)
        heads, count = slopes.shape  # (H, P)
        scalars = torch.stack([self.log_scale.to(dtype).abs(), (self.threshold.to(dtype) * INIT_THRESHOLD).abs()])
        parts = [keys.expand(heads, count), slopes, intercepts, scalars.expand(heads, 2)]
        return torch.cat([part.to(dtype) for part in parts], 1)

    def offset_formula(self) -> tuple[str, Tensor]:
        """("fire", ``distance_segments()``): the formula ``kernels.tiles_triton`` computes inside its tiles."""
        return "fire", self.distance_segments()

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, width={self.mlp[0].out_features}"
