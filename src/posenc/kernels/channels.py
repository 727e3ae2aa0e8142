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

When there are more extra channels than v is wide (Transformer-XL: 128 on a 32-wide head), padding v
would more than double the flash kernel's value-side work; on CPU those run on ``kernels.blockwise``
instead, which takes the channels apart from q and k and meets the key side, shared by every head, in
one product per query block.

Shapes: B batch, H query heads, Hkv key/value heads, Tq/Tk lengths, Dh head width,
C extra channels, Dv value width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import blockwise


def materialized(x: Tensor | blockwise.ChannelBlocks | blockwise.ShiftedQueries) -> Tensor:
    """One tensor of a score-channel part: ``ChannelBlocks`` built for every query at once, ``ShiftedQueries``
    added up."""
    return x if isinstance(x, Tensor) else x.full()


def widen(x: Tensor, channels: Tensor) -> Tensor:
    """x (B, H, T, D) with ``channels`` (broadcastable to (B, H, T, C)) appended: (B, H, T, D + C), x's dtype."""
    return torch.cat((x, channels.to(x.dtype).expand(*x.shape[:-1], channels.shape[-1])), dim=-1)


def flash_width(width: int, *, cuda: bool) -> int:
    """The head width to call the flash kernel with: ``width`` on CPU, rounded up to FlashAttention's multiple of
    8 on CUDA."""
    return -(-width // 8) * 8 if cuda else width


def sdpa_with_channels(q: Tensor, k: Tensor, v: Tensor, *, scale: float, is_causal: bool,
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
    width = flash_width(max(q.shape[-1], value_width), cuda=q.is_cuda)
    if width > q.shape[-1]:
        q, k = F.pad(q, (0, width - q.shape[-1])), F.pad(k, (0, width - k.shape[-1]))
    padded = F.pad(v, (0, q.shape[-1] - value_width)) if q.shape[-1] > value_width else v
    out = F.scaled_dot_product_attention(q, k, padded, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                         enable_gqa=k.shape[1] != q.shape[1])
    return out[..., :value_width]


def attend_with_channels(content: Tensor | blockwise.ShiftedQueries, k: Tensor, v: Tensor,
                         query_side: Tensor | blockwise.ChannelBlocks, key_side: Tensor, *, scale: float,
                         is_causal: bool, allowed: Tensor | None = None) -> Tensor:
    """Attention with score channels (``PositionalEncoding.score_channel_parts``), by the faster route.

    Args:
        content: (B, H, Tq, Dh) q's content side, or ``ShiftedQueries``; k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv).
        query_side: (B or 1, H, Tq, C), or ``ChannelBlocks``; key_side: (B or 1, 1, Tk, C).
        is_causal: keys after their query are masked, Tq = Tk at the same positions; allowed: otherwise a
            bool mask broadcastable to (B, H, Tq, Tk) (True = may attend), or None for all pairs.
    Returns:
        (B, H, Tq, Dv).
    """
    width = query_side.width if isinstance(query_side, blockwise.ChannelBlocks) else query_side.shape[-1]
    q, shift = (content.q, content.shift) if isinstance(content, blockwise.ShiftedQueries) else (content, None)
    if width > v.shape[-1] and blockwise.available(q):
        if torch.compiler.is_compiling():  # rebuilding per block calls autograd.grad, which dynamo does not trace
            query_side = materialized(query_side)
        bias = None if allowed is None else q.new_zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
        return blockwise.blockwise_attention(q, k, v, bias, scale=scale, causal=is_causal, q_channels=query_side,
                                             k_channels=key_side, q_shift=shift)
    return sdpa_with_channels(widen(materialized(content), materialized(query_side)), widen(k, key_side), v,
                              scale=scale, is_causal=is_causal, attn_mask=allowed)
