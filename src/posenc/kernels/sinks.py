"""Attention sinks as a learned logit: every query may also attend to a virtual key whose value is
zero, with a per-head logit s_h (the form recent open-weight models use, e.g. gpt-oss). The softmax's
denominator gains exp(s_h), so a head can put weight on "nothing" instead of on the first tokens.

Shapes: B batch, H heads, Hkv key/value heads, Tq/Tk lengths, Dh head width, Dv value width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def softmax_with_sink(logits: Tensor, sink: Tensor) -> Tensor:
    """Softmax over each row's logits plus the head's sink logit, sink column dropped: (B, H, Tq, Tk)
    probabilities that sum to 1 − p(sink). sink: (H,)."""
    column = sink.to(logits.dtype).view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
    return torch.softmax(torch.cat((logits, column), dim=-1), dim=-1)[..., :-1]


def sdpa_with_sink(q: Tensor, k: Tensor, v: Tensor, additive: Tensor, sink: Tensor, scale: float) -> Tensor:
    """SDPA with a zero key and zero value put first, whose logit is the head's sink.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv).
        additive: float (B or 1, H or 1, Tq, Tk): every score term and −inf where a pair may not attend.
        sink: (H,) logits.
    Returns:
        (B, H, Tq, Dv).
    """
    batch, heads, q_len, _ = q.shape
    first_key, first_value = k.new_zeros(*k.shape[:2], 1, k.shape[-1]), v.new_zeros(*v.shape[:2], 1, v.shape[-1])
    column = sink.to(additive.dtype).view(1, heads, 1, 1)
    mask_batch = additive.shape[0]
    mask = torch.cat((column.expand(mask_batch, heads, q_len, 1), additive.expand(mask_batch, heads, q_len, -1)), -1)
    return F.scaled_dot_product_attention(q, torch.cat((first_key, k), 2), torch.cat((first_value, v), 2),
                                          attn_mask=mask.to(q.dtype), scale=scale, enable_gqa=k.shape[1] != heads)
