"""CoPE's attention with its counts inside the kernel (``gated_counts_cpu.cpp``), causal, on CPU.

CoPE's content-position term needs, per query, a gate for every key, their running count from the query
back, and a lookup of the query's table logits at each count: in PyTorch that is a dozen passes over
(B, H, Tq, Tk) tensors (sigmoid, flip, cumsum, flip, where, clamp, floor, ceil, two gathers, lerp), each kept
for the backward. Past the cache (B·H·T² floats of a few tens of MB at 512 keys) every pass runs at memory
speed, which is where the training step fell off a cliff between 64 and 512 keys. Here one query tile at a
time holds its gates, counts and logits in a buffer of tile × Tk, the softmax is exact per row, and the
backward recomputes them from q, k and the saved log-sum-exp: what autograd keeps is q, k, v, the table, the
output and one number per row, as for NoPE.

Positions: queries at Tk − Tq .. Tk − 1 and keys at 0 .. Tk − 1 (a training step, a prefill, a KV-cache step).
Computed in float32 (float64 for float64 inputs); BLAS does the products.

Shapes: B batch, H heads, Tq/Tk query/key lengths, Dh head width, Dv value width, P table rows.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from . import native

extension = native.loader("gated_counts_cpu.cpp", "CoPE's attention kernel")


@runtime_checkable
class GatedCounts(Protocol):
    """An encoding whose content-position term this kernel computes (CoPE). A method, not attributes: from Python
    3.12 ``isinstance`` reads members statically, and a module's parameters are not."""

    def gated_counts_parts(self) -> tuple[Tensor, float]:
        """(table (P, Dh), gate scale): each key's gate is ``sigmoid(gate scale · q·k)``, and the gates counted back
        from the query look up the table's rows at the count."""


def serves(q: Tensor) -> bool:
    """Whether the kernel runs on q's device here: CPU, eager (not inside a ``torch.compile`` graph), built."""
    return native.runs_here(q, extension)


def gated_counts_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, *, scale: float, gate_scale: float
                           ) -> Tensor:
    """Causal ``softmax(scale·q·kᵀ + lerp(q·e[⌊p⌋], q·e[⌈p⌉]))·v`` with CoPE's counts
    ``p_ij = min(Σ_{t=j..i} σ(gate_scale·q_i·k_t), P − 1)``.

    Args:
        q: (B, H, Tq, Dh); k: (B, H, Tk, Dh); v: (B, H, Tk, Dv), Tq ≤ Tk (queries at the last Tq positions).
        table: (P, Dh) float, CoPE's ``embeddings``, P ≥ 2; its gradient flows back.
    Returns:
        (B, H, Tq, Dv) in q's dtype, laid out token-major as SDPA returns it.
    """
    if q.shape[2] > k.shape[2] or k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"q, k and v need equal heads and Tq ≤ Tk, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if table.dim() != 2 or table.shape[1] != q.shape[-1] or table.shape[0] < 2:
        raise ValueError(f"table must be (P ≥ 2, Dh = {q.shape[-1]}), got {tuple(table.shape)}")
    return _GatedCountsAttention.apply(q, k, v, table, scale, gate_scale)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _unit_stride(x: Tensor, dtype: torch.dtype) -> Tensor:
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


class _GatedCountsAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, scale, gate_scale):
        compute = _compute_dtype(q.dtype)
        q_, k_, v_ = (_unit_stride(x, compute) for x in (q, k, v))
        table_ = table.to(compute).contiguous()
        out, lse = extension().gated_counts_forward(q_, k_, v_, table_, scale, gate_scale)
        ctx.save_for_backward(q_, k_, v_, table_, out, lse)
        ctx.scales = (scale, gate_scale)
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, table.dtype)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, out, lse = ctx.saved_tensors
        grad_out = _unit_stride(grad_out, q.dtype)
        row_terms = (grad_out * out).sum(-1).contiguous()  # (B, H, Tq): Σ_d dout·out
        grads = extension().gated_counts_backward(grad_out, q, k, v, table, lse, row_terms, *ctx.scales)
        return (*(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes)), None, None)
