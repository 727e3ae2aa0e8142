"""Stick-breaking attention with its weights inside the kernel (``sticks_cpu.cpp``), causal, on CPU.

Stick-breaking's weights ``A_ij = σ(z_ij)·Π_{j<l<i}(1 − σ(z_il))`` replace the softmax; in PyTorch they are a
reverse cumulative sum of log-sigmoids over (B, H, Tq, Tk) tensors, several of them kept for the backward (6.6×
NoPE's activation bytes at 512 keys, 24× at 2,048). Here one query tile at a time holds its logits, log-sigmoids
and weights in a buffer of tile × Tk, and the backward recomputes them from q and k: what autograd keeps is q,
k, v and the output, as for NoPE.

Positions: queries at Tk − Tq .. Tk − 1 and keys at 0 .. Tk − 1 (a training step, a prefill, a KV-cache step).
Computed in float32 (float64 for float64 inputs); BLAS does the products.

Shapes: B batch, H heads, Tq/Tk query/key lengths, Dh head width, Dv value width.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from . import native

extension = native.loader("sticks_cpu.cpp", "the stick-breaking attention kernel")


@runtime_checkable
class BreaksSticks(Protocol):
    """An encoding whose weights this kernel computes: stick-breaking's, in place of the softmax (``weights`` is
    every such encoding's; this method is stick-breaking's own)."""

    def stick_breaking_current(self) -> bool:
        """Whether a query's own key takes a share of its stick (``attend_current``)."""


def serves(q: Tensor) -> bool:
    """Whether the kernel runs on q's device here: CPU, eager (not inside a ``torch.compile`` graph), built."""
    return native.runs_here(q, extension)


def stick_breaking_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, attend_current: bool) -> Tensor:
    """Causal ``Σ_j A_ij v_j`` with ``log A_ij = log σ(z_ij) + Σ_{j<l} log σ(−z_il)``, z = scale·q·kᵀ, over the
    keys before each query (and its own with ``attend_current``).

    Args:
        q: (B, H, Tq, Dh); k: (B, H, Tk, Dh); v: (B, H, Tk, Dv), Tq ≤ Tk (queries at the last Tq positions).
    Returns:
        (B, H, Tq, Dv) in q's dtype, laid out token-major as SDPA returns it; rows with no key are zeros.
    """
    if q.shape[2] > k.shape[2] or k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"q, k and v need equal heads and Tq ≤ Tk, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    return _StickBreakingAttention.apply(q, k, v, scale, attend_current)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _unit_stride(x: Tensor, dtype: torch.dtype) -> Tensor:
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


class _StickBreakingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, attend_current):
        compute = _compute_dtype(q.dtype)
        q_, k_, v_ = (_unit_stride(x, compute) for x in (q, k, v))
        out = extension().sticks_forward(q_, k_, v_, scale, attend_current)
        ctx.save_for_backward(q_, k_, v_)
        ctx.arguments = (scale, attend_current)
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        grads = extension().sticks_backward(_unit_stride(grad_out, q.dtype), q, k, v, *ctx.arguments)
        return (*(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes)), None, None)
