"""Score terms as extra q/k channels, so a fused kernel that takes no bias runs them.

A score term that is a sum of products ``a_i · b_j`` (query side times key side) is a
dot product: appending ``a`` to every query and ``b`` to every key adds exactly that
term to ``q·kᵀ``, and a plain (causal) SDPA call then computes the encoding's
attention, its gradient flowing through the appended channels into whatever built
them. ALiBi and Transformer-XL are such terms (see their ``score_channels``).

The CPU flash kernel serves only q, k and v of one head width: q and k are widened by
the extra channels, v is zero-padded to the same width, and the padding is dropped
from the output (on CUDA every width is rounded up to FlashAttention's multiple of 8;
on CPU the unpadded width measured fastest: 34 channels beat 40 and 48).

Shapes: B batch, H query heads, Hkv key/value heads, Tq/Tk lengths, Dh head width,
C extra channels, Dv value width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def widen(x: Tensor, channels: Tensor) -> Tensor:
    """x (B, H, T, D) with ``channels`` (broadcastable to (B, H, T, C)) appended: (B, H, T, D + C), x's dtype."""
    return torch.cat((x, channels.to(x.dtype).expand(*x.shape[:-1], channels.shape[-1])), dim=-1)


def sdpa_with_channels(q: Tensor, k: Tensor, v: Tensor, *, scale: float, is_causal: bool = False,
                       attn_mask: Tensor | None = None) -> Tensor:
    """``scaled_dot_product_attention`` on widened q and k (width W = Dh + C) and v of width Dv <= W.

    Args:
        q: (B, H, Tq, W); k: (B, Hkv, Tk, W); v: (B, Hkv, Tk, Dv).
        scale: the logit scale of the *content* channels (1/√Dh, not 1/√W); the
            extra channels were built for it.
        is_causal, attn_mask: as for SDPA (a bool mask here: True = may attend).
    Returns:
        (B, H, Tq, Dv).
    """
    value_width = v.shape[-1]
    width = max(q.shape[-1], value_width)
    if q.is_cuda:  # FlashAttention takes head widths in multiples of 8
        width = -(-width // 8) * 8
    if width > q.shape[-1]:
        q, k = F.pad(q, (0, width - q.shape[-1])), F.pad(k, (0, width - k.shape[-1]))
    padded = F.pad(v, (0, q.shape[-1] - value_width)) if q.shape[-1] > value_width else v
    out = F.scaled_dot_product_attention(q, k, padded, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                         enable_gqa=k.shape[1] != q.shape[1])
    return out[..., :value_width]
