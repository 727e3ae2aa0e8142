"""Causal attention with a query-dependent term per offset, with the term inside the kernel
(``offset_lookup_cpu.cpp``): Transformer-XL's position terms at a model's own positions, on CPU.

Transformer-XL adds ``(q_i + v)·W_R r_{i−j}`` to every logit. As extra q/k channels (``kernels.channels``) that is
an attention of width Dh + H·Dh; as a mask it is a (B, H, Tq, Tk) tensor kept with its gradient. Here each head's
W_R r_d is a table of N offsets (H, N, Dh), a query tile multiplies its lookup queries by the table once (the
paper's "relative shift" becomes an index), and the logits of a tile live in a buffer of tile × keys: what
autograd keeps is the two query tensors, k, v, the table, the output and one log-sum-exp per row.

Positions: queries at Tk − Tq .. Tk − 1 and keys at 0 .. Tk − 1 (a training step, a prefill, a KV-cache step).
Computed in float32 (float64 for float64 inputs); BLAS does the products.

Shapes: B batch, H heads, Tq/Tk query/key lengths, Dh head width, Dv value width, N ≥ Tk offsets in the table.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from . import native

extension = native.loader("offset_lookup_cpu.cpp", "the offset-lookup attention kernel")


@runtime_checkable
class OffsetLookups(Protocol):
    """An encoding whose content-position term this kernel computes (Transformer-XL): the logit of query i and
    key j gains ``(q_i + lookup_shift)·table[i − j] + content_shift·k_j``."""

    def offset_lookup_table(self, keys: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """(H, keys, Dh): each head's vector at offsets 0 .. keys − 1."""

    def query_shifts(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(content_shift (H, Dh), lookup_shift (H, Dh))."""


def serves(q: Tensor) -> bool:
    """Whether the kernel runs on q's device here: CPU, eager (not inside a ``torch.compile`` graph), built."""
    return native.runs_here(q, extension)


def offset_lookup_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, *, content_shift: Tensor,
                            lookup_shift: Tensor, scale: float) -> Tensor:
    """Causal ``softmax(scale·(c_i·k_j + l_i·table[h, i − j]))·v`` with c = q + content_shift and
    l = q + lookup_shift per head (Transformer-XL's u and v), queries at the last Tq key positions.

    Args:
        q: (B, H, Tq, Dh); k: (B, H, Tk, Dh); v: (B, H, Tk, Dv), Tq ≤ Tk.
        table: (H, N, Dh), N ≥ Tk: row d of head h is the vector of offset d.
        content_shift, lookup_shift: (H, Dh).
    Returns:
        (B, H, Tq, Dv) in q's dtype, laid out token-major as SDPA returns it; gradients reach every input. The
        shifted queries are formed again in the backward rather than kept.
    """
    heads, width = q.shape[1], q.shape[3]
    if k.shape[1] != heads or v.shape[1] != heads or q.shape[2] > k.shape[2]:
        raise ValueError(f"q, k and v need equal heads and Tq ≤ Tk, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if table.dim() != 3 or table.shape[0] != heads or table.shape[1] < k.shape[2] or table.shape[2] != width:
        raise ValueError(f"table must be (H, N ≥ Tk, Dh) = ({heads}, ≥ {k.shape[2]}, {width}), "
                         f"got {tuple(table.shape)}")
    for name, shift in (("content_shift", content_shift), ("lookup_shift", lookup_shift)):
        if shift.shape != (heads, width):
            raise ValueError(f"{name} must be (H, Dh) = ({heads}, {width}), got {tuple(shift.shape)}")
    return _OffsetLookupAttention.apply(q, k, v, table, content_shift, lookup_shift, scale)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _unit_stride(x: Tensor, dtype: torch.dtype) -> Tensor:
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


def _shifted(q: Tensor, shift: Tensor) -> Tensor:
    return q + shift[None, :, None, :]


class _OffsetLookupAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, content_shift, lookup_shift, scale):
        compute = _compute_dtype(q.dtype)
        q_, k_, v_ = (_unit_stride(x, compute) for x in (q, k, v))
        table_, content_shift_, lookup_shift_ = (x.to(compute).contiguous() for x in (table, content_shift,
                                                                                     lookup_shift))
        out, lse = extension().offset_lookup_forward(_shifted(q_, content_shift_), _shifted(q_, lookup_shift_), k_,
                                                     v_, table_, scale)
        ctx.save_for_backward(q_, k_, v_, table_, content_shift_, lookup_shift_, out, lse)
        ctx.scale = scale
        ctx.dtypes = tuple(x.dtype for x in (q, k, v, table, content_shift, lookup_shift))
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, content_shift, lookup_shift, out, lse = ctx.saved_tensors
        grad_out = _unit_stride(grad_out, q.dtype)
        row_terms = (grad_out * out).sum(-1).contiguous()  # (B, H, Tq): Σ_d dout·out
        grad_c, grad_l, grad_k, grad_v, grad_table = extension().offset_lookup_backward(
            grad_out, _shifted(q, content_shift), _shifted(q, lookup_shift), k, v, table, lse, row_terms, ctx.scale)
        grads = (grad_c + grad_l, grad_k, grad_v, grad_table, grad_c.sum((0, 2)), grad_l.sum((0, 2)))
        return (*(g.to(dtype) for g, dtype in zip(grads, ctx.dtypes)), None)
