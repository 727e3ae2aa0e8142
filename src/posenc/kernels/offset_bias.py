"""Attention with a score bias that depends on (head, offset) alone, with the bias inside the kernel
(``offset_bias_cpu.cpp``): ALiBi, Sandwich, Kerple and T5 at a model's own positions, on CPU.

SDPA takes a bias as a (B or 1, H, Tq, Tk) mask, read from memory in the forward and, for a learned bias,
materialized again with its gradient; ``kernels.blockwise`` keeps it to query blocks but still builds every
block's bias and its gradient. Here the bias is a per-head table of N offsets, read from cache inside each
query/key tile with an online softmax (the flash-attention scheme), and the backward sums the bias gradient
per offset, which autograd then carries through ``bias_at`` into the encoding's parameters. What autograd
keeps is q, k, v, the output and one log-sum-exp per row, as for NoPE.

Positions: queries at s + Tk − Tq .. s + Tk − 1 and keys at s .. s + Tk − 1 (a training step, a prefill, a
KV-cache step), causal or not. Computed in float32 (float64 for float64 inputs); BLAS does the products.

Shapes: B batch, H heads, Tq/Tk query/key lengths, Dh head width, Dv value width, N offsets in the table.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import native

extension = native.loader("offset_bias_cpu.cpp", "the offset-bias attention kernel")


def serves(q: Tensor) -> bool:
    """Whether the kernel runs on q's device here: CPU, eager (not inside a ``torch.compile`` graph), built."""
    return native.runs_here(q, extension)


def offsets(q_len: int, k_len: int, causal: bool) -> tuple[int, int]:
    """(lowest, highest) offset q_pos − k_pos a pair reaches with queries at the last Tq key positions;
    causally, only the pairs a query may see."""
    start = k_len - q_len
    return (0 if causal else start - (k_len - 1)), start + q_len - 1


def offset_bias_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, lowest: int, *, scale: float,
                          causal: bool, token_values: Tensor | None = None) -> Tensor:
    """``softmax(scale·q·kᵀ + bias)·v`` with ``bias[b, h, i, j] = table[h, (Tk − Tq + i − j) − lowest]``, plus
    ``c[b, h, Tk − Tq + i] − c[b, h, j]`` with token values c (FoX's cumulative log forget gates).

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv), H a multiple of Hkv.
        table: (H, N) float, the bias of offsets lowest .. lowest + N − 1; its gradient flows back.
        lowest: the offset of the table's first entry; the table must cover ``offsets(Tq, Tk, causal)``.
        causal: mask every key after its query.
        token_values: (B or 1, H, Tk), float64 in the kernel (the difference is formed in double, so c may grow
            to thousands without losing the digits of c_i − c_j); its gradient flows back.
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
    if k.shape[1] != q.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    if token_values is None:
        return _OffsetBiasAttention.apply(q, k, v, table, lowest, scale, causal, None, None)
    values = token_values.to(torch.float64).expand(q.shape[0], -1, -1)
    return _OffsetBiasAttention.apply(q, k, v, table, lowest, scale, causal, values[..., k.shape[2] - q.shape[2]:],
                                      values)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _unit_stride(x: Tensor, dtype: torch.dtype) -> Tensor:
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


class _OffsetBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, lowest, scale, causal, query_values, key_values):
        compute = _compute_dtype(q.dtype)
        q_, k_, v_ = (_unit_stride(x, compute) for x in (q, k, v))
        table_ = table.to(compute).contiguous()
        start = k.shape[2] - q.shape[2]
        tokens = () if query_values is None else (query_values.contiguous(), key_values.contiguous())
        out, lse = extension().offset_bias_forward(q_, k_, v_, table_, start, -lowest, causal, scale,
                                                   *(tokens or (None, None)))
        ctx.save_for_backward(q_, k_, v_, table_, out, lse, *tokens)
        ctx.geometry = (start, -lowest, causal, scale)
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, table.dtype)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, out, lse, *tokens = ctx.saved_tensors
        grad_out = _unit_stride(grad_out, q.dtype)
        row_terms = (grad_out * out).sum(-1).contiguous()  # (B, H, Tq): Σ_d dout·out
        want_table = ctx.needs_input_grad[3]
        grad_q, grad_k, grad_v, grad_table, grad_queries, grad_keys = extension().offset_bias_backward(
            grad_out, q, k, v, lse, row_terms, table, *ctx.geometry, want_table, *(tokens or (None, None)))
        grads = [g.to(dtype) for g, dtype in zip((grad_q, grad_k, grad_v), ctx.dtypes)]
        grad_table = grad_table.sum(0).to(ctx.dtypes[3]) if want_table else None
        token_grads = (grad_queries, grad_keys) if tokens else (None, None)
        return (*grads, grad_table, None, None, None, *token_grads)
