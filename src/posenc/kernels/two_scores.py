"""Attention whose logits come from one of two (query, key) pairs, chosen by distance: Self-Extend's merge.

Near pairs (``0 <= i - j < window``) are scored with ``q_near · k_near``, far pairs (``i - j >= window``) with
``q_far · k_far``; one softmax runs over the merged row. Queries go in blocks, so at most
B·H·block·Tk logits exist at once (never B·H·T²); everything is computed in float32 (float64 for float64 q).
"""

from __future__ import annotations

import torch
from torch import Tensor


def two_score_attention(q_near: Tensor, k_near: Tensor, q_far: Tensor, k_far: Tensor, v: Tensor,
                        q_positions: Tensor, k_positions: Tensor, window: int, *, scale: float,
                        mask: Tensor | None = None, block: int = 1024) -> Tensor:
    """Causal attention with near logits inside ``window`` and far logits beyond it.

    Args:
        q_near, q_far: (B, H, Tq, Dh); k_near, k_far: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv), H a multiple of Hkv.
        q_positions: (B or 1, Tq) and k_positions: (B or 1, Tk) integer positions: a key after its query
            (j > i) is masked, and i - j picks the near or far logit.
        window: near distances are 0 .. window - 1.
        scale: multiplies both logit sets.
        mask: bool, broadcastable to (B, H, Tq, Tk); True = may attend.
    Returns:
        (B, H, Tq, Dv) in q's dtype; a row with no allowed key is 0.
    """
    compute = torch.float64 if q_near.dtype == torch.float64 else torch.float32
    repeats = q_near.shape[1] // k_near.shape[1]
    k_near, k_far, values = (t.to(compute).repeat_interleave(repeats, dim=1) for t in (k_near, k_far, v))
    outputs = []
    for start in range(0, q_near.shape[2], block):
        end = min(start + block, q_near.shape[2])
        distance = (q_positions[:, start:end, None] - k_positions[:, None, :]).unsqueeze(1)  # (B|1, 1, b, Tk)
        near = q_near[:, :, start:end].to(compute) @ k_near.transpose(-1, -2)
        far = q_far[:, :, start:end].to(compute) @ k_far.transpose(-1, -2)
        logits = torch.where(distance < window, near, far) * scale
        allowed = distance >= 0
        if mask is not None:
            allowed = allowed & mask[..., start:end, :] if mask.shape[-2] > 1 else allowed & mask
        weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
        outputs.append(weights @ values)
    return torch.cat(outputs, dim=2).to(q_near.dtype)
