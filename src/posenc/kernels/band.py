"""Causal attention whose logits and values carry learned terms for the nearest offsets only: Shaw's relative
attention, rewritten so that no (Tq, Tk) tensor of offsets, logits or probabilities is ever built.

Shaw adds ``q_i·a^K_{clip(j−i)}`` to each logit and ``Σ_j p_ij a^V_{clip(j−i)}`` to each output, clip to
[−K, K]. Causally every key at distance d = i − j ≥ K reads row −K, so

    q_i·a^K_{clip(j−i)} = q_i·a^K_{−K} + [d < K]·q_i·(a^K_{−d} − a^K_{−K}),

whose first term is the same for every key of row i (the softmax ignores it), and since Σ_j p_ij = 1,

    Σ_j p_ij a^V_{clip(j−i)} = a^V_{−K} + Σ_{d<K} p_{i,i−d}·(a^V_{−d} − a^V_{−K}).

What remains is attention plus a band of K diagonals: ``key_band[d]`` and ``value_band[d]`` (the differences
above, ``Shaw.band_parts``) meet each query block in two (b × K) products, skewed into (and read back from)
the block's diagonals. Queries go in blocks as in ``kernels.blockwise`` (forward, and a backward that recomputes
the probabilities from the log-sum-exp), each reading only the keys up to its last query.

Where the C++ or Triton lookup tiles serve (``offset_lookup``, ``lookups_triton``), ``forms`` gives them the same
K rows as a table of offsets instead: this module is the form inside a ``torch.compile`` graph, without a C++
toolchain, and on a GPU whose Triton lookups are not yet checked.

Shapes: B batch, H heads, T length (queries and keys at positions 0..T−1), Dh head width, Dv value width,
K band width (Shaw's max_distance).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import checks

from .blockwise import compute_dtype, query_blocks, token_major_zeros


@runtime_checkable
class Banded(Protocol):
    """An encoding whose content-position terms this kernel computes (Shaw): learned key and value terms for the
    nearest offsets, as a band of K diagonals, where ``has_band_form`` (its offsets are integers)."""

    has_band_form: bool

    def band_parts(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """(key_band (K, Dh), value_band (K, Dv), value_floor (Dv,)): ``band_attention``'s three arguments."""


def band_attention(q: Tensor, k: Tensor, v: Tensor, key_band: Tensor, value_band: Tensor,
                   value_floor: Tensor | None = None, *, scale: float, block: int = 64) -> Tensor:
    """Causal ``softmax(scale·(q·kᵀ + band))·v`` plus the value band and floor, at positions 0..T−1.

    Args:
        q, k: (B, H, T, Dh); v: (B, H, T, Dv).
        key_band: (K, Dh), added to the logit of the key d = i − j < K behind the query as ``q_i·key_band[d]``.
        value_band: (K, Dv), added to the output as ``Σ_{d<K} p_{i,i−d}·value_band[d]``.
        value_floor: (Dv,), added to every output (Shaw's a^V_{−K}); None for zeros.
        scale: logit scale.
        block: queries per block.
    Returns:
        (B, H, T, Dv) in q's dtype, laid out as (B, T, H, Dv) like SDPA's output; gradients reach q, k, v,
        both bands and the floor.
    """
    checks.positive_int("block", block)
    if q.shape[2] != k.shape[2] or key_band.dim() != 2 or key_band.shape != (value_band.shape[0], q.shape[-1]) \
            or value_band.shape[-1] != v.shape[-1] or value_floor is not None and value_floor.shape != v.shape[-1:]:
        raise ValueError(f"band_attention needs Tq = Tk, key_band (K, Dh), value_band (K, Dv) and value_floor "
                         f"(Dv,): got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, key_band "
                         f"{tuple(key_band.shape)}, value_band {tuple(value_band.shape)}, value_floor "
                         f"{None if value_floor is None else tuple(value_floor.shape)}")
    value_floor = value_band.new_zeros(v.shape[-1]) if value_floor is None else value_floor
    return _BandAttention.apply(q, k, v, key_band, value_band, value_floor, scale, block)


class _BandAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_band, value_band, value_floor, scale, block):
        compute = compute_dtype(q.dtype)
        q_, k_, v_, key_band_, value_band_, value_floor_ = (
            t.to(compute) for t in (q, k, v, key_band, value_band, value_floor))
        out = token_major_zeros(q.shape[:3] + v.shape[-1:], v_)
        lse = v_.new_zeros(q.shape[:3])
        for start, end, keys in query_blocks(q.shape[2], k.shape[2], block, causal=True):
            logits = _logits(q_, k_, key_band_, start, end, keys, scale)
            lse[:, :, start:end] = row_lse = torch.logsumexp(logits, dim=-1)
            probs = logits.sub_(row_lse[..., None]).exp_()
            near = _read_band(probs, start, len(key_band))
            out[:, :, start:end] = (probs @ v_[:, :, :keys]).add_(near @ value_band_).add_(value_floor_)
        ctx.save_for_backward(q, k, v, key_band, value_band, value_floor, out, lse)
        ctx.scale, ctx.block = scale, block
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        compute = compute_dtype(saved[0].dtype)
        q, k, v, key_band, value_band, value_floor, out, grad_out = (t.to(compute) for t in (*saved[:7], grad_out))
        lse, scale, width = saved[7], ctx.scale, len(key_band)
        row_terms = (grad_out * (out - value_floor)).sum(-1, keepdim=True)  # (B, H, T, 1): Σ_j p_ij dp_ij
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        grad_key_band, grad_value_band = torch.zeros_like(key_band), torch.zeros_like(value_band)
        for start, end, keys in query_blocks(q.shape[2], k.shape[2], ctx.block, causal=True):
            q_block, dout_block = q[:, :, start:end], grad_out[:, :, start:end]
            probs = _logits(q, k, key_band, start, end, keys, scale).sub_(lse[:, :, start:end, None]).exp_()
            near = _read_band(probs, start, width)  # (B, H, b, K)
            grad_v[:, :, :keys] += probs.transpose(-1, -2) @ dout_block
            grad_value_band += near.flatten(0, 2).transpose(0, 1) @ dout_block.flatten(0, 2)
            grad_probs = dout_block @ v[:, :, :keys].transpose(-1, -2)
            _add_band(grad_probs, dout_block @ value_band.transpose(0, 1), start)
            grad_scores = probs.mul_(grad_probs.sub_(row_terms[:, :, start:end]))
            grad_near = _read_band(grad_scores, start, width)  # (B, H, b, K)
            grad_q[:, :, start:end] = (grad_scores @ k[:, :, :keys] + grad_near @ key_band).mul_(scale)
            grad_k[:, :, :keys] += (grad_scores.transpose(-1, -2) @ q_block).mul_(scale)
            grad_key_band += (grad_near.flatten(0, 2).transpose(0, 1) @ q_block.flatten(0, 2)).mul_(scale)
        grads = (grad_q, grad_k, grad_v, grad_key_band, grad_value_band, grad_out.sum((0, 1, 2)))
        return (*(g.to(t.dtype) for g, t in zip(grads, saved)), None, None)


def _logits(q, k, key_band, start, end, keys, scale) -> Tensor:
    """(B, H, b, keys): scale·(q·kᵀ + band) for queries start..end−1, −inf after the query."""
    q_block = q[:, :, start:end]
    logits = q_block @ k[:, :, :keys].transpose(-1, -2)
    _add_band(logits, q_block @ key_band.transpose(0, 1), start)
    logits.mul_(scale)
    after = torch.ones(end - start, end - start, dtype=torch.bool, device=q.device).triu_(1)
    logits[..., start:end].masked_fill_(after, float("-inf"))
    return logits


def _add_band(scores: Tensor, band: Tensor, start: int) -> None:
    """scores[..., i, i − d] += band[..., i, d] for d < K (B, H, b, keys), in place: the band, skewed so row i
    shifts right by i, is the (b, b + K − 1) window of keys start − K + 1 .. start + b − 1."""
    rows, width = band.shape[-2:]
    skewed = F.pad(band.flip(-1), (0, rows)).flatten(-2)[..., :rows * (width + rows - 1)]
    skewed = skewed.unflatten(-1, (rows, width + rows - 1))
    first = start - width + 1  # the window's first key; before position 0 only what lies past it is kept
    scores[..., max(first, 0):start + rows].add_(skewed[..., max(-first, 0):])


def _read_band(scores: Tensor, start: int, width: int) -> Tensor:
    """(B, H, b, K): scores[..., i, i − d] for d < K, zero where the key would be before position 0."""
    rows = scores.shape[-2]
    first = start - width + 1
    window = F.pad(scores[..., max(first, 0):start + rows], (max(-first, 0), 0))  # (B, H, b, b + K − 1)
    unskewed = F.pad(window.flatten(-2), (0, rows)).unflatten(-1, (rows, width + rows))
    return unskewed[..., :width].flip(-1)
