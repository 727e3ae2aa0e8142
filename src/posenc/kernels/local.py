"""Causal attention restricted to a sliding window or to chunks, at O(T · span) cost: no (T, T) mask.

A sliding window of ``w`` lets a query at position i attend keys j with 0 <= i − j < w (Gemma 3's and
Cohere2's local layers, Mistral); chunks of ``c`` let it attend keys of its own chunk, i // c == j // c (Llama 4's
chunked layers). Both are served here for self-attention at positions 0..T−1 (the model's training and
evaluation pass); every other call (a KV-cache step, explicit positions, a mask) joins ``span_mask`` to the mask.

- chunks: the sequence is cut into T/c independent causal attentions, one batch of shape (B, H, T/c, c, Dh).
- window: queries in blocks of w; block i needs only the keys of blocks i − 1 and i, so each block attends
  2w keys under one (w, 2w) pattern (block 0's first w keys lie before position 0 and are masked).
The sequence is padded at its end to a whole number of blocks; a padded key comes after every real query, so
causality hides it, and padded queries are dropped.

Shapes: B batch, H heads, T tokens, Dh head width, Dv value width; n blocks of ``span`` tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import checks


def check_span(window: int | None, chunk: int | None) -> None:
    """A ValueError naming ``window`` or ``chunk`` unless each is None or an integer >= 1."""
    if window is not None:
        checks.positive_int("window", window)
    if chunk is not None:
        checks.positive_int("chunk", chunk)


def joined_mask(mask: Tensor | None, q_pos: Tensor, k_pos: Tensor, window: int | None, chunk: int | None
                ) -> Tensor | None:
    """The caller's bool mask and ``span_mask``'s pairs as one (None when there is neither)."""
    if window is None and chunk is None:
        return mask
    spans = span_mask(q_pos, k_pos, window, chunk)
    return spans if mask is None else mask & spans


def span_mask(q_pos: Tensor, k_pos: Tensor, window: int | None, chunk: int | None) -> Tensor:
    """Bool (B or 1, 1, Tq, Tk): True where a key is inside the query's window (0 <= i − j < window; a later
    key is left to the causal mask) and chunk. q_pos: (B or 1, Tq), k_pos: (B or 1, Tk)."""
    i, j = q_pos[:, None, :, None], k_pos[:, None, None, :]
    allowed = torch.ones(torch.broadcast_shapes(i.shape, j.shape), dtype=torch.bool, device=q_pos.device)
    if window is not None:
        allowed = allowed & (i - j < window)
    if chunk is not None:
        allowed = allowed & (torch.div(i, chunk, rounding_mode="floor") == torch.div(j, chunk, rounding_mode="floor"))
    return allowed


def local_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int | None = None, chunk: int | None = None,
                    scale: float) -> Tensor:
    """Causal self-attention at positions 0..T−1 within a sliding window and/or chunks.

    Args:
        q: (B, H, T, Dh); k: (B, H, T, Dh); v: (B, H, T, Dv), already rotated; same heads (repeat GQA's first).
        window: keys with 0 <= i − j < window; chunk: keys with i // chunk == j // chunk (one of them, or both).
    Returns:
        (B, H, T, Dv), equal to softmax attention under ``span_mask`` and the causal mask.
    """
    length = q.shape[2]
    if window is not None and chunk is not None:  # both: whichever is narrower decides the blocks, the other masks
        if chunk <= window:
            return _chunked(q, k, v, chunk, scale, window=window)
        return _windowed(q, k, v, window, scale, chunk=chunk)
    if chunk is not None:
        return _chunked(q, k, v, chunk, scale) if chunk < length else _causal(q, k, v, scale)
    return _windowed(q, k, v, window, scale) if window < length else _causal(q, k, v, scale)


def _causal(q, k, v, scale) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def _blocks(x: Tensor, span: int) -> Tensor:
    """(B, H, T, D) -> (B, H, n, span, D), zero-padded at the end to n·span tokens."""
    padding = -x.shape[2] % span
    return F.pad(x, (0, 0, 0, padding)).unflatten(2, (-1, span))


def _chunked(q, k, v, chunk: int, scale: float, window: int | None = None) -> Tensor:
    length = q.shape[2]
    if window is None:
        out = F.scaled_dot_product_attention(_blocks(q, chunk), _blocks(k, chunk), _blocks(v, chunk), is_causal=True,
                                             scale=scale)  # (B, H, n, chunk, Dv)
    else:  # a window inside each chunk: one (chunk, chunk) pattern for every chunk
        i = torch.arange(chunk, device=q.device)
        allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)  # (chunk, chunk)
        out = F.scaled_dot_product_attention(_blocks(q, chunk), _blocks(k, chunk), _blocks(v, chunk),
                                             attn_mask=allowed, scale=scale)
    return out.flatten(2, 3)[:, :, :length]


def _windowed(q, k, v, window: int, scale: float, chunk: int | None = None) -> Tensor:
    length = q.shape[2]
    queries = _blocks(q, window)  # (B, H, n, w, Dh)
    count = queries.shape[2]

    def two_blocks(x: Tensor) -> Tensor:  # (B, H, T, D) -> (B, H, n, 2w, D): blocks i − 1 and i for each block i
        padded = F.pad(x, (0, 0, window, count * window - length))  # a block of zeros before position 0
        return padded.unfold(2, 2 * window, window).transpose(-1, -2)

    r = torch.arange(window, device=q.device)[:, None]  # the query's place in its block
    j = torch.arange(2 * window, device=q.device)[None, :]  # the key's place in blocks i − 1, i
    allowed = ((j > r) & (j <= r + window)).expand(count, window, 2 * window).clone()  # (n, w, 2w)
    allowed[0, :, :window] = False  # block 0's previous block is padding
    if chunk is not None:
        block = torch.arange(count, device=q.device)[:, None, None]
        query_position, key_position = block * window + r, (block - 1) * window + j
        allowed &= torch.div(query_position, chunk, rounding_mode="floor") == torch.div(
            key_position, chunk, rounding_mode="floor")
    out = F.scaled_dot_product_attention(queries, two_blocks(k), two_blocks(v), attn_mask=allowed, scale=scale)
    return out.flatten(2, 3)[:, :, :length]
