"""Forgetting attention (FoX; Lin et al., ICLR 2025, arXiv:2503.02130): no positions; each token carries a forget
gate per head, and a key's logit decays by the gates of every token after it up to the query.

    f_t = σ(w_h·x_t + b_h)  (x_t: the layer's normalized input),   D_ij = Σ_{j < l ≤ i} log f_l,
    logits_ij = scale · q_i·k_j + D_ij

so D is a score bias made from the tokens, not from positions: with c = cumsum_t log f_t (float64), D_ij = c_i −
c_j, query i being the key at the same place in the sequence (queries are the last Tq keys: self-attention,
with or without a KV cache). Each layer has its own gate projection, as in the paper's code (``nn.Linear(dim,
heads)`` on the layer's input, weights N(0, 0.02²), bias 0, so every gate starts at σ(0) = ½).

A caller computes the gates with ``log_forget(x, layer)`` and hands them to attention with
``encoding.at(q_pos, k_pos).with_gates(log_forget)``; the score bias is then built once per layer, and every
backend serves it as a dense bias (the gates' gradient flows through it), except where sdpa on CPU runs causal
attention at the model's own positions: there ``kernels.offset_bias`` takes c itself and forms c_i − c_j per tile
in float64, so no (B, H, Tq, Tk) bias or gradient exists. A KV cache keeps each layer's gates
beside its keys (``KVCache``), so decoding equals the full pass. Positions are not read at all.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import checks
from .base import PositionalEncoding


class ForgettingGates(PositionalEncoding):
    """FoX's data-dependent forget gates as a score bias; one gate projection per layer."""

    has_bias = True
    bias_from_offset = False
    has_token_gates = True
    causal_only = True  # D_ij sums the gates between key and query: after the query there is nothing to forget

    def __init__(self, dim: int, num_heads: int, num_layers: int = 1):
        super().__init__()
        self.num_heads = checks.positive_int("num_heads", num_heads)
        checks.positive_int("dim", dim)
        checks.positive_int("num_layers", num_layers)
        self.gates = nn.ModuleList(nn.Linear(dim, num_heads) for _ in range(num_layers))
        for gate in self.gates:
            nn.init.normal_(gate.weight, std=0.02)
            nn.init.zeros_(gate.bias)

    def log_forget(self, x: Tensor, layer: int = 0) -> Tensor:
        """log f for every token of ``x`` (B, T, dim), the layer's normalized input: (B, H, T) float32 (float64
        for float64 inputs)."""
        if not 0 <= layer < len(self.gates):
            raise ValueError(f"layer must be in [0, {len(self.gates) - 1}] (the encoding was built for "
                             f"num_layers={len(self.gates)}), got {layer}")
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        return F.logsigmoid(self.gates[layer](x).to(compute)).transpose(1, 2)

    def cumulative_gates(self, log_forget: Tensor) -> Tensor:
        """c_t = Σ_{l ≤ t} log f_l, (B, H, Tk) float64 from the keys' log gates, so c_i − c_j keeps its digits."""
        return log_forget.to(torch.float64).cumsum(-1)

    def gate_bias(self, log_forget: Tensor, q_len: int, dtype: torch.dtype) -> Tensor:
        """D (B, H, Tq, Tk) in ``dtype`` from the keys' log gates (B, H, Tk); queries are the last Tq keys."""
        cumulative = self.cumulative_gates(log_forget)
        return (cumulative[..., -q_len:, None] - cumulative[..., None, :]).to(dtype)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        raise ValueError("ForgettingGates's bias comes from its tokens' forget gates, not from positions: attend "
                         "with encoding.at(q_pos, k_pos).with_gates(encoding.log_forget(x, layer))")

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, layers={len(self.gates)}"
