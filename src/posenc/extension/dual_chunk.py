"""Dual Chunk Attention (An et al. 2024, arXiv:2402.17463, ChunkLlama; what Qwen2.5-1M serves with): a RoPE model
reads any length with distances it was trained on, no training.

The sequence is cut into chunks of ``chunk_len = chunk_size − local`` tokens; every key sits at its place in its
chunk, ``j mod chunk_len``. The query is read at one of three places, by where the key is:
  - same chunk (intra): ``i mod chunk_len``, so distances inside a chunk are exact;
  - the chunk before (successive): ``min(i mod chunk_len + chunk_len, chunk_size)``, exact while
    ``i mod chunk_len <= local`` and clamped after;
  - any earlier chunk (inter): ``chunk_size``.
No distance exceeds ``chunk_size``, which the reference sets to 3/4 of the pretraining length (and ``local`` to
1/16 of it). One softmax runs over the three merged logit sets (``kernels.piecewise``; the reference merges its
per-chunk flash calls by their log-sum-exps, the same thing).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .. import checks
from ..encodings.rotary import RoPE, apply_rope
from ..kernels.piecewise import piecewise_attention
from ..positions import default_positions
from .self_extend import use_attention

INTRA, SUCCESSIVE, INTER = 0, 1, 2


def default_sizes(original: int) -> tuple[int, int]:
    """The reference's (chunk_size, local) for a model pretrained at ``original`` tokens: 3/4 and 1/16 of it."""
    return original * 3 // 4, original // 16


def check_dual_chunk(chunk_size: int, local: int) -> None:
    checks.positive_int("dca chunk size", chunk_size, minimum=2)
    checks.positive_int("dca local window", local, minimum=0)
    if 2 * local >= chunk_size:
        raise ValueError(f"dca local window ({local}) must be under half the chunk size ({chunk_size}): a chunk "
                         "holds chunk size − local tokens")


def chunk_positions(q_pos: Tensor, k_pos: Tensor, chunk_size: int, local: int
                    ) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor, Tensor]:
    """((q intra, q successive, q inter), k positions, choice): the three query positions (shape of q_pos), the
    keys' positions in their chunks (shape of k_pos), and per pair which of the three reads it, −1 after the query:
    int64 (B or 1, 1, Tq, Tk)."""
    chunk_len = chunk_size - local
    place = q_pos % chunk_len
    queries = (place, (place + chunk_len).clamp(max=chunk_size), torch.full_like(q_pos, chunk_size))
    gap = (q_pos // chunk_len)[..., :, None] - (k_pos // chunk_len)[..., None, :]  # (B or 1, Tq, Tk)
    choice = torch.where(gap == 0, INTRA, torch.where(gap == 1, SUCCESSIVE, INTER))
    choice = choice.masked_fill(k_pos[..., None, :] > q_pos[..., :, None], -1)
    return queries, k_pos % chunk_len, choice[:, None]


def dual_chunk_attention(q: Tensor, k: Tensor, v: Tensor, rope: RoPE, chunk_size: int, local: int, *,
                         q_positions: Tensor | None = None, k_positions: Tensor | None = None,
                         scale: float | None = None) -> Tensor:
    """Causal DCA with posenc's RoPE. q: (B, H, Tq, Dh), k: (B, Hkv, Tk, Dh), v: (B, Hkv, Tk, Dv), unrotated;
    positions as in ``posenc.attention``. Returns (B, H, Tq, Dv)."""
    check_dual_chunk(chunk_size, local)
    default_q, default_k = default_positions(q.shape[2], k.shape[2], q.device)
    q_pos = default_q if q_positions is None else checks.positions("q_positions", q_positions, q.shape[2], q.shape[0])
    k_pos = default_k if k_positions is None else checks.positions("k_positions", k_positions, k.shape[2], k.shape[0])
    queries_at, k_place, choice = chunk_positions(q_pos, k_pos, chunk_size, local)
    queries = [rope.rotate(q, k, at, k_place)[0] for at in queries_at]
    _, keys = rope.rotate(q, k, queries_at[0], k_place)
    return piecewise_attention(queries, keys, v, choice, scale=q.shape[-1] ** -0.5 if scale is None else scale)


def _rotated_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, *,
                       inv_freq: Tensor, chunk_size: int, local: int, scaling: float | None = None,
                       position_ids: Tensor | None = None, **_) -> tuple[Tensor, None]:
    """transformers' attention-function signature, q and k already rotated at 0..Tk−1 (queries the last Tq):
    each is turned once more, to its place in the chunk map. Returns ((B, Tq, H, Dv), None)."""
    q_pos, k_pos = default_positions(query.shape[2], key.shape[2], query.device)
    if position_ids is not None and not bool((position_ids.to(q_pos.device) == q_pos).all()):
        raise ValueError("dual chunk attention in a transformers model needs each row's positions to be 0..T−1 "
                         "(one unpadded sequence per row, keys cached in order)")
    queries_at, k_place, choice = chunk_positions(q_pos, k_pos, chunk_size, local)
    if attention_mask is not None:  # bool, or additive: 0 where allowed, very negative where not
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        choice = choice.masked_fill(~allowed, -1)
    inv_freq = inv_freq.to(query.device)
    queries = [apply_rope(query, at - q_pos, inv_freq) for at in queries_at]
    keys = apply_rope(key, k_place - k_pos, inv_freq)
    out = piecewise_attention(queries, keys, value, choice,
                              scale=query.shape[-1] ** -0.5 if scaling is None else scaling)
    return out.transpose(1, 2).contiguous(), None


def use_dual_chunk(model, chunk_size: int, local: int) -> str:
    """Switch a transformers RoPE model's attention to DCA; ``self_extend.use_attention(model, "sdpa")`` switches
    back. The extra rotations use the model's own frequencies, so they compose with its scaling."""
    from transformers import AttentionInterface

    check_dual_chunk(chunk_size, local)
    name = f"posenc_dual_chunk_c{chunk_size}_l{local}"
    inv_freq = model.model.rotary_emb.inv_freq.detach().float().cpu()
    AttentionInterface.register(name, functools.partial(_rotated_attention, inv_freq=inv_freq, chunk_size=chunk_size,
                                                        local=local))
    use_attention(model, name)
    return name
