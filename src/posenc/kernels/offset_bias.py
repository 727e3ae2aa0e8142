"""Attention with a score bias that depends on (head, offset) alone, with the bias inside the kernel
(``offset_bias_cpu.cpp``): ALiBi, Sandwich, Kerple and T5 at a model's own positions, on CPU; FoX's gates and
FIRE's bias (which also reads the query's position, ``fire_cpu.h``) per pair inside the same tiles.

SDPA takes a bias as a (B or 1, H, Tq, Tk) mask, read from memory in the forward and, for a learned bias,
materialized again with its gradient; ``kernels.blockwise`` keeps it to query blocks but still builds every
block's bias and its gradient. Here the bias is a per-head table of N offsets, read from cache inside each
query/key tile with an online softmax (the flash-attention scheme), and the backward sums the bias gradient
per offset, which autograd then carries through ``bias_at`` into the encoding's parameters. What autograd
keeps is q, k, v, the output and one log-sum-exp per row, as for NoPE (and the table, FIRE's segments or FoX's
token values: one row per head, token or segment).

Positions: queries at s + Tk − Tq .. s + Tk − 1 and keys at s .. s + Tk − 1 (a training step, a prefill, a
KV-cache step), causal or not. Computed in float32 (float64 for float64 inputs); BLAS does the products.

Shapes: B batch, H heads, Tq/Tk query/key lengths, Dh head width, Dv value width, N offsets in the table.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from . import native

extension = native.loader("offset_bias_cpu.cpp", "the offset-bias attention kernel")


@runtime_checkable
class DistanceSegments(Protocol):
    """An encoding whose bias is, per head, a piecewise-linear function of x = ψ(|i − j|) / (ψ(max(i, L)) + ε),
    ψ(u) = log(1 + c·u), ε = 1e-6, for query position i and key position j (FIRE): this kernel computes it per pair
    at any query position, where a table of offsets serves only while every query divides by ψ(L)."""

    def distance_segments(self, dtype: torch.dtype) -> Tensor:
        """(H, 3P + 2) in ``dtype``, differentiable: per head [keys (P), slopes (P), intercepts (P), c, L], the bias
        slopes[s]·x + intercepts[s] on segment s = #{r : keys[r] < x} for x of that dtype
        (``kernels.fire_segments``)."""


def serves(q: Tensor) -> bool:
    """Whether the kernel runs on q's device here: CPU, eager (not inside a ``torch.compile`` graph), built."""
    return native.runs_here(q, extension)


def offsets(q_len: int, k_len: int, causal: bool) -> tuple[int, int]:
    """(lowest, highest) offset q_pos − k_pos a pair reaches with queries at the last Tq key positions;
    causally, only the pairs a query may see."""
    start = k_len - q_len
    return (0 if causal else start - (k_len - 1)), start + q_len - 1


def offset_bias_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, lowest: int, *, scale: float,
                          causal: bool, token_values: Tensor | None = None, segments: Tensor | None = None,
                          first_position: int = 0) -> Tensor:
    """``softmax(scale·q·kᵀ + bias)·v`` with ``bias[b, h, i, j] = table[h, (Tk − Tq + i − j) − lowest]``, plus
    ``c[b, h, Tk − Tq + i] − c[b, h, j]`` with token values c (FoX's cumulative log forget gates), plus FIRE's
    bias from its segments (``DistanceSegments``) with keys at positions first_position .. first_position + Tk − 1.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv), H a multiple of Hkv.
        table: (H, N) float, the bias of offsets lowest .. lowest + N − 1; its gradient flows back.
        lowest: the offset of the table's first entry; the table must cover ``offsets(Tq, Tk, causal)``.
        causal: mask every key after its query.
        token_values: (B or 1, H, Tk), float64 in the kernel (the difference is formed in double, so c may grow
            to thousands without losing the digits of c_i − c_j); its gradient flows back.
        segments: (H, 3P + 2) float, P a power of two ≥ 2 (``DistanceSegments.distance_segments``); its gradient
            flows back (none to the keys).
        first_position: the position of key 0, which FIRE's bias reads (max(i, L)).
    Returns:
        (B, H, Tq, Dv) in q's dtype, laid out token-major as SDPA returns it.
    """
    low, high = offsets(q.shape[2], k.shape[2], causal)
    if table.dim() != 2 or table.shape[0] != q.shape[1] or low < lowest or high >= lowest + table.shape[1]:
        raise ValueError(f"table must be (H, N) = ({q.shape[1]}, N) covering offsets {low}..{high} from "
                         f"lowest={lowest}, got {tuple(table.shape)}")
    if token_values is not None and (token_values.dim() != 3 or token_values.shape[0] not in (1, q.shape[0])
                                     or token_values.shape[1:] != (q.shape[1], k.shape[2])):
        raise ValueError(f"token_values must be (B or 1, H, Tk) = ({q.shape[0]}, {q.shape[1]}, {k.shape[2]}), "
                         f"got {tuple(token_values.shape)}")
    if segments is not None:
        count = (segments.shape[-1] - 2) // 3
        if segments.dim() != 2 or segments.shape[0] != q.shape[1] or segments.shape[1] != 3 * count + 2 or (
                count < 2 or count & (count - 1)):
            raise ValueError(f"segments must be (H, 3P + 2) = ({q.shape[1]}, 3P + 2), P a power of two >= 2, "
                             f"got {tuple(segments.shape)}")
    if isinstance(first_position, bool) or not isinstance(first_position, int):
        raise ValueError(f"first_position must be an integer, got {first_position!r}")
    if k.shape[1] != q.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    tokens = (None, None)
    if token_values is not None:
        values = token_values.to(torch.float64).expand(q.shape[0], -1, -1)
        tokens = (values[..., k.shape[2] - q.shape[2]:], values)
    return _OffsetBiasAttention.apply(q, k, v, table, lowest, scale, causal, *tokens, segments, first_position)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _unit_stride(x: Tensor, dtype: torch.dtype) -> Tensor:
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


class _OffsetBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, lowest, scale, causal, query_values, key_values, segments, first_position):
        compute = _compute_dtype(q.dtype)
        q_, k_, v_ = (_unit_stride(x, compute) for x in (q, k, v))
        table_ = table.to(compute).contiguous()
        segments_ = None if segments is None else segments.detach().to(compute).contiguous()
        start = k.shape[2] - q.shape[2]
        tokens = (None, None) if query_values is None else (query_values.contiguous(), key_values.contiguous())
        out, lse = extension().offset_bias_forward(q_, k_, v_, table_, start, -lowest, causal, scale, *tokens,
                                                   segments_, first_position)
        ctx.save_for_backward(q_, k_, v_, table_, out, lse, *tokens, segments_)
        ctx.geometry = (start, -lowest, causal, scale)
        ctx.first_position = first_position
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, table.dtype, None if segments is None else segments.dtype)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, out, lse, query_values, key_values, segments = ctx.saved_tensors
        grad_out = _unit_stride(grad_out, q.dtype)
        row_terms = (grad_out * out).sum(-1).contiguous()  # (B, H, Tq): Σ_d dout·out
        want_table = ctx.needs_input_grad[3]
        grad_q, grad_k, grad_v, grad_table, grad_queries, grad_keys, grad_segments = extension().offset_bias_backward(
            grad_out, q, k, v, lse, row_terms, table, *ctx.geometry, want_table, query_values, key_values, segments,
            ctx.first_position)
        grads = [g.to(dtype) for g, dtype in zip((grad_q, grad_k, grad_v), ctx.dtypes)]
        grad_table = grad_table.sum(0).to(ctx.dtypes[3]) if want_table else None
        token_grads = (grad_queries, grad_keys) if query_values is not None else (None, None)
        grad_segments = None if segments is None else grad_segments.to(ctx.dtypes[4])
        return (*grads, grad_table, None, None, None, *token_grads, grad_segments, None)
