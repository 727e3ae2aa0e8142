"""Attention whose logit for each (query, key) pair comes from one of several rotated copies of the query, chosen
per pair: Dual Chunk Attention's three position maps (``extension.dual_chunk``), one softmax over the merged row.

Queries go in blocks, so at most K·B·H·block·Tk logits exist at once (never B·H·T²); everything is computed in
float32 (float64 for float64 q). This is the general form; ``two_scores`` is the fast one for two sets chosen by
distance.
"""

from __future__ import annotations

import torch
from torch import Tensor


def piecewise_attention(queries: list[Tensor], k: Tensor, v: Tensor, choice: Tensor, *, scale: float,
                        block: int = 512) -> Tensor:
    """Causal attention with pair (i, j)'s logit ``scale · queries[choice[i, j]][i] · k[j]``.

    Args:
        queries: K tensors (B, H, Tq, Dh), the query rotated for each map.
        k: (B, Hkv, Tk, Dh) keys, rotated; v: (B, Hkv, Tk, Dv); H a multiple of Hkv.
        choice: int64 (Tq, Tk) or (B, 1, Tq, Tk): which query copy scores the pair, −1 where it may not attend.
    Returns:
        (B, H, Tq, Dv) in the queries' dtype; a row with no allowed key is 0.
    """
    first = queries[0]  # every copy has its shape and dtype
    batch, heads, length = first.shape[:3]
    compute = torch.float64 if first.dtype == torch.float64 else torch.float32
    keys, values = (t.to(compute).repeat_interleave(heads // k.shape[1], dim=1) for t in (k, v))
    choice = choice.expand(batch, 1, *choice.shape[-2:]) if choice.dim() == 4 else choice[None, None]
    outputs = []
    for start in range(0, length, block):
        rows = slice(start, start + block)
        picked = choice[:, :, rows]  # (B or 1, 1, block, Tk)
        logits = torch.full((), float("-inf"), dtype=compute)
        for index, q in enumerate(queries):
            scores = (q[:, :, rows].to(compute) @ keys.transpose(-1, -2)) * scale  # (B, H, block, Tk)
            logits = torch.where(picked == index, scores, logits)
        weights = torch.softmax(logits, dim=-1).masked_fill((picked < 0).all(-1, keepdim=True), 0.0)
        outputs.append(weights @ values)  # a row with no allowed key: 0
    return torch.cat(outputs, dim=2).to(first.dtype)
