"""Dual Chunk Attention (An et al. 2024, arXiv:2402.17463, ChunkLlama; what Qwen2.5-1M serves with): a RoPE model
reads any length with distances it was trained on, no training.

The sequence is cut into chunks of ``chunk_len = chunk_size − local`` tokens; every key sits at its place in its
chunk, ``j mod chunk_len``. The query is read at one of three places, by where the key is:
  - same chunk (intra): ``i mod chunk_len``, so distances inside a chunk are exact;
  - the chunk before (successive): ``min(i mod chunk_len + chunk_len, chunk_size)``, exact while
    ``i mod chunk_len <= local`` and clamped after;
  - any earlier chunk (inter): ``chunk_size``.
No distance exceeds ``chunk_size``, which the reference sets to 3/4 of the pretraining length (and ``local`` to
1/16 of it). One softmax runs over the three merged logit sets (the reference merges its per-chunk flash calls by
their log-sum-exps, the same thing). Where keys sit at 0..Tk−1 and the queries are the last Tq of them under a plain
causal mask (a model reading a document, or decoding from its cache), each block of queries inside one chunk reads
three contiguous key spans (``chunked_attention``): only the causal part is computed, and no (Tq, Tk) map exists.
Anything else goes through ``kernels.piecewise`` with the map per pair.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .. import checks
from ..encodings.rotary import RoPE, apply_rope
from ..kernels import cpu_flash
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


def query_places(q_pos: Tensor, chunk_size: int, local: int) -> tuple[Tensor, Tensor, Tensor]:
    """Where each query is read (shape of q_pos): (intra, successive, inter)."""
    chunk_len = chunk_size - local
    place = q_pos % chunk_len
    return place, (place + chunk_len).clamp(max=chunk_size), torch.full_like(q_pos, chunk_size)


def chunk_positions(q_pos: Tensor, k_pos: Tensor, chunk_size: int, local: int
                    ) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor, Tensor]:
    """((q intra, q successive, q inter), k positions, choice): the three query positions (shape of q_pos), the
    keys' positions in their chunks (shape of k_pos), and per pair which of the three reads it, −1 after the query:
    int64 (B or 1, 1, Tq, Tk)."""
    chunk_len = chunk_size - local
    queries = query_places(q_pos, chunk_size, local)
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
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    queries_at, k_place = query_places(q_pos, chunk_size, local), k_pos % (chunk_size - local)
    queries = [rope.rotate(q, k, at, k_place)[0] for at in queries_at]
    _, keys = rope.rotate(q, k, queries_at[0], k_place)
    if torch.equal(q_pos, default_q) and torch.equal(k_pos, default_k):  # (B or 1, T) equal to the defaults
        return chunked_attention(queries, keys, v, chunk_size - local, scale=scale)
    return piecewise_attention(queries, keys, v, chunk_positions(q_pos, k_pos, chunk_size, local)[2], scale=scale)


def chunked_attention(queries: list[Tensor], k: Tensor, v: Tensor, chunk_len: int, *, scale: float,
                      block: int = 512) -> Tensor:
    """Causal DCA for keys at positions 0..Tk−1 and queries at the last Tq of them, by spans: a block of query rows
    inside chunk c reads the keys of chunks before c − 1 with the inter copy, chunk c − 1 with the successive copy
    and chunk c up to each row with the intra copy; one softmax over the three spans. Equal to
    ``piecewise_attention`` with ``chunk_positions``' map (tested). On CPU each span is one fused attention call
    that returns its log-sum-exp, and the three merge exactly by them (as ``kernels.two_scores`` merges two);
    elsewhere the spans' logits are concatenated under one softmax.

    Args:
        queries: (intra, successive, inter), each (B, H, Tq, Dh), rotated to its place in the chunk map.
        k: (B, Hkv, Tk, Dh) keys rotated to their places in their chunks; v: (B, Hkv, Tk, Dv); H a multiple of Hkv.
        chunk_len: tokens per chunk (chunk size − local).
    Returns:
        (B, H, Tq, Dv) in the queries' dtype, computed in float32 (float64 for float64 queries).
    """
    intra, successive, inter = queries
    heads, length, total = intra.shape[1], intra.shape[2], k.shape[2]
    compute = torch.float64 if intra.dtype == torch.float64 else torch.float32
    keys, values = (t.to(compute).repeat_interleave(heads // k.shape[1], dim=1) for t in (k, v))
    fused = cpu_flash.available(intra)
    first = total - length  # the first query's position
    outputs, start = [], 0
    while start < length:
        chunk_start = (first + start) // chunk_len * chunk_len
        stop = min(length, start + block, chunk_start + chunk_len - first)  # rows of one chunk
        end = first + stop  # the keys the block's last row sees: 0..end−1
        before = max(chunk_start - chunk_len, 0)
        later = torch.arange(chunk_start, end, device=k.device)[None, :] > torch.arange(
            first + start, end, device=k.device)[:, None]  # (rows, intra keys): after the row's own position
        spans = [(q[:, :, start:stop].to(compute), a, b)
                 for q, a, b in ((inter, 0, before), (successive, before, chunk_start), (intra, chunk_start, end))]
        if fused:
            outputs.append(_merged_calls(spans, keys, values, later, scale))
        else:
            logits = [(q @ keys[:, :, a:b].transpose(-1, -2)) * scale for q, a, b in spans]
            logits[2] = logits[2].masked_fill(later, float("-inf"))
            outputs.append(torch.softmax(torch.cat(logits, dim=-1), dim=-1) @ values[:, :, :end])
        start = stop
    return torch.cat(outputs, dim=2).to(intra.dtype)


def _merged_calls(spans: list, keys: Tensor, values: Tensor, later: Tensor, scale: float) -> Tensor:
    """One fused CPU attention call per non-empty span (the last, intra, masked by ``later``), merged by their
    log-sum-exps into the softmax over all three: (B, H, rows, Dv)."""
    intra_bias = torch.zeros(later.shape, dtype=keys.dtype, device=keys.device).masked_fill(later, float("-inf"))
    parts = [cpu_flash.forward(q, keys[:, :, a:b], values[:, :, a:b], attn_mask=intra_bias if index == 2 else None,
                               scale=scale)
             for index, (q, a, b) in enumerate(spans) if b > a]
    top = torch.stack([lse for _, lse in parts]).amax(0)
    weights = [(lse - top).exp().unsqueeze(-1) for _, lse in parts]
    return sum(out * weight for (out, _), weight in zip(parts, weights, strict=True)) / sum(weights)


def _plain_causal(allowed: Tensor | None, q_length: int, k_length: int) -> bool:
    """Whether ``allowed`` (None, or bool (B or 1, 1, Tq, Tk)) lets exactly each query see its own and every earlier
    key, the queries being the last ``q_length`` of ``k_length``."""
    if allowed is None:
        return True
    causal = torch.ones(q_length, k_length, dtype=torch.bool, device=allowed.device).tril(k_length - q_length)
    return bool((allowed == causal).all())


def _rotated_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, *,
                       inv_freq: Tensor, chunk_size: int, local: int, scaling: float | None = None,
                       position_ids: Tensor | None = None, **_) -> tuple[Tensor, None]:
    """transformers' attention-function signature, q and k already rotated at 0..Tk−1 (queries the last Tq):
    each is turned once more, to its place in the chunk map. Returns ((B, Tq, H, Dv), None)."""
    q_pos, k_pos = default_positions(query.shape[2], key.shape[2], query.device)
    if position_ids is not None and not bool((position_ids.to(q_pos.device) == q_pos).all()):
        raise ValueError("dual chunk attention in a transformers model needs each row's positions to be 0..T−1 "
                         "(one unpadded sequence per row, keys cached in order)")
    allowed = None
    if attention_mask is not None:  # bool, or additive (0 where allowed); it may span a longer cache than the keys
        attention_mask = attention_mask[..., : key.shape[2]]
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    chunk_len = chunk_size - local
    inv_freq = inv_freq.to(query.device)
    queries = [apply_rope(query, at - q_pos, inv_freq) for at in query_places(q_pos, chunk_size, local)]
    keys = apply_rope(key, k_pos % chunk_len - k_pos, inv_freq)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    if _plain_causal(allowed, query.shape[2], key.shape[2]):
        out = chunked_attention(queries, keys, value, chunk_len, scale=scale)
    else:  # padding: the map per pair, less what the mask forbids
        choice = chunk_positions(q_pos, k_pos, chunk_size, local)[2]
        out = piecewise_attention(queries, keys, value, choice.masked_fill(~allowed, -1), scale=scale)
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
