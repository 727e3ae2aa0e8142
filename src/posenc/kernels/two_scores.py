"""Attention whose logits come from one of two (query, key) pairs, chosen by distance: Self-Extend's merge.

Near pairs (``0 <= i - j < window``) are scored with ``q_near · k_near``, far pairs (``i - j >= window``) with
``q_far · k_far``; one softmax runs over the merged row. Queries go in blocks, so at most
B·H·block·Tk logits exist at once (never B·H·T²); everything is computed in float32 (float64 for float64 q).

The fast path (CPU, keys at 0..Tk−1, queries the last Tq, no mask: a prefill or a KV-cache step) runs each
query block as two fused attention calls that return their log-sum-exp — the near keys (its band of the last
``window`` positions) and the far keys (everything before it) — and merges the two softmaxes exactly from the
log-sum-exps. It reads each key about once per block, as causal attention does: 1.5× the cost of one causal SDPA
call at T = 4,096 on this CPU, where the general path (every logit twice, then a T-wide softmax) costs 12×.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import cpu_flash


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
    offset = _contiguous_offset(q_positions, k_positions, q_near.shape[2], k_near.shape[2])
    if mask is None and offset is not None and cpu_flash.available(q_near):
        return _two_fused_calls(q_near, k_near, q_far, k_far, v, offset, window, scale, block, compute)
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


def _contiguous_offset(q_positions: Tensor, k_positions: Tensor, q_len: int, k_len: int) -> int | None:
    """The first query's position when keys sit at 0..Tk−1 and queries at the last Tq of them (one row)."""
    if q_positions.shape[0] != 1 or k_positions.shape[0] != 1 or q_len > k_len:
        return None
    expected = torch.arange(k_len, device=k_positions.device)
    if not torch.equal(k_positions[0], expected) or not torch.equal(q_positions[0], expected[k_len - q_len:]):
        return None
    return k_len - q_len


def _two_fused_calls(q_near, k_near, q_far, k_far, v, offset, window, scale, block, compute) -> Tensor:
    repeats = q_near.shape[1] // k_near.shape[1]
    q_near, q_far = q_near.to(compute), q_far.to(compute)
    k_near, k_far, values = (t.to(compute).repeat_interleave(repeats, dim=1) for t in (k_near, k_far, v))
    outputs = []
    for start in range(0, q_near.shape[2], block):
        end = min(start + block, q_near.shape[2])
        first, last = offset + start, offset + end  # the block's query positions: first .. last − 1
        query = torch.arange(first, last, device=q_near.device)[:, None]
        near_from = max(0, first - window + 1)
        near_keys = torch.arange(near_from, last, device=q_near.device)[None]
        near_allowed = (query - near_keys < window) & (query >= near_keys)
        out, lse = cpu_flash.forward(q_near[:, :, start:end], k_near[:, :, near_from:last],
                                     values[:, :, near_from:last], attn_mask=_bias(near_allowed, compute), scale=scale)
        far_to = max(0, last - window)  # keys before this can be window or more behind some query of the block
        if far_to:
            far_allowed = query - torch.arange(far_to, device=q_near.device)[None] >= window
            far_out, far_lse = cpu_flash.forward(q_far[:, :, start:end], k_far[:, :, :far_to], values[:, :, :far_to],
                                                 attn_mask=_bias(far_allowed, compute), scale=scale)
            far_lse = torch.where(far_allowed.any(-1), far_lse, float("-inf"))  # rows with no far key
            top = torch.maximum(lse, far_lse)
            near_weight, far_weight = (lse - top).exp().unsqueeze(-1), (far_lse - top).exp().unsqueeze(-1)
            out = (out * near_weight + far_out.nan_to_num(0.0) * far_weight) / (near_weight + far_weight)
        outputs.append(out)
    return torch.cat(outputs, dim=2).to(v.dtype)


def _bias(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, float("-inf"))
