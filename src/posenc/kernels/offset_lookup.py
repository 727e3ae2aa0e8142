"""Causal attention with a query-dependent term per offset, with the term inside the kernel
(``offset_lookup_cpu.cpp``), on CPU: Transformer-XL's position terms, and Shaw's band of nearest offsets.

Transformer-XL adds ``(q_i + v)·W_R r_{i−j}`` to every logit. As extra q/k channels (``kernels.channels``) that is
an attention of width Dh + H·Dh; as a mask it is a (B, H, Tq, Tk) tensor kept with its gradient. Here each head's
W_R r_d is a table of N offsets (H, N, Dh), a query tile multiplies its lookup queries by the table once (the
paper's "relative shift" becomes an index), and the logits of a tile live in a buffer of tile × keys: what
autograd keeps is the two query tensors, k, v, the table, the output and one log-sum-exp per row.

Shaw's terms are the same kernel with a table of its K nearest offsets shared by every head (``band.Banded``):
offsets past the table add nothing, and a second table of values adds ``Σ_j p_ij values[i − j]`` to the output.

Positions: queries at Tk − Tq .. Tk − 1 and keys at 0 .. Tk − 1 (a training step, a prefill, a KV-cache step).
Computed in float32 (float64 for float64 inputs); BLAS does the products.

Shapes: B batch, H heads, Tq/Tk query/key lengths, Dh head width, Dv value width, N offsets in the table.
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


def offset_lookup_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, *, content_shift: Tensor | None = None,
                            lookup_shift: Tensor | None = None, values: Tensor | None = None,
                            value_floor: Tensor | None = None, scale: float) -> Tensor:
    """Causal ``softmax(scale·(c_i·k_j + l_i·table[h, i − j]))·v`` (plus ``Σ_j p_ij values[h, i − j]`` and
    ``value_floor``) with c = q + content_shift and l = q + lookup_shift per head (Transformer-XL's u and v), queries
    at the last Tq key positions; offsets past the table's last row add nothing.

    Args:
        q: (B, H, Tq, Dh); k: (B, H, Tk, Dh); v: (B, H, Tk, Dv), Tq ≤ Tk.
        table: (H or 1, N, Dh): row d is the vector of offset d (Transformer-XL: N ≥ Tk; Shaw's band: N = K, one
            table for every head).
        content_shift, lookup_shift: (H, Dh), or None for no shift.
        values: (H or 1, N, Dv) or None: row d is added to the output of every pair at offset d, times the pair's
            weight (Shaw's value band).
        value_floor: (Dv,) or None: added to every output (Shaw's value for the offsets past its band).
        scale: the logit scale.
    Returns:
        (B, H, Tq, Dv) in q's dtype, laid out token-major as SDPA returns it; gradients reach every tensor given.
        The shifted queries are formed again in the backward rather than kept.
    """
    heads = q.shape[1]
    if k.shape[1] != heads or v.shape[1] != heads or q.shape[2] > k.shape[2]:
        raise ValueError(f"q, k and v need equal heads and Tq ≤ Tk, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    check_lookup_terms(q, v, table, values, value_floor, content_shift, lookup_shift)
    return _OffsetLookupAttention.apply(q, k, v, table, values, value_floor, content_shift, lookup_shift, scale)


def check_lookup_terms(q: Tensor, v: Tensor, table: Tensor, values: Tensor | None, value_floor: Tensor | None,
                       content_shift: Tensor | None, lookup_shift: Tensor | None) -> None:
    """Raises ValueError, naming the argument and the shape it needs, where the position terms of an offset-lookup
    attention (this module's, or ``lookups_triton``'s on a GPU) do not fit q (B, H, Tq, Dh) and v (B, Hkv, Tk, Dv)."""
    heads, width = q.shape[1], q.shape[3]
    if table.dim() != 3 or table.shape[0] not in (1, heads) or table.shape[1] < 1 or table.shape[2] != width:
        raise ValueError(f"table must be (H or 1, N ≥ 1, Dh) = ({heads}, N, {width}), got {tuple(table.shape)}")
    if values is not None and values.shape != table.shape[:2] + v.shape[-1:]:
        raise ValueError(f"values must be (like the table, N, Dv) = {tuple(table.shape[:2] + v.shape[-1:])}, "
                         f"got {tuple(values.shape)}")
    if value_floor is not None and value_floor.shape != v.shape[-1:]:
        raise ValueError(f"value_floor must be (Dv,) = ({v.shape[-1]},), got {tuple(value_floor.shape)}")
    for name, shift in (("content_shift", content_shift), ("lookup_shift", lookup_shift)):
        if shift is not None and shift.shape != (heads, width):
            raise ValueError(f"{name} must be (H, Dh) = ({heads}, {width}), got {tuple(shift.shape)}")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _unit_stride(x: Tensor, dtype: torch.dtype) -> Tensor:
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


def _shifted(q: Tensor, shift: Tensor | None) -> Tensor:
    return q if shift is None else q + shift[None, :, None, :]


def _compact(x: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    return None if x is None else x.to(dtype).contiguous()


class _OffsetLookupAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, values, value_floor, content_shift, lookup_shift, scale):
        compute = _compute_dtype(q.dtype)
        q_, k_, v_ = (_unit_stride(x, compute) for x in (q, k, v))
        table_, values_, value_floor_, content_shift_, lookup_shift_ = (
            _compact(x, compute) for x in (table, values, value_floor, content_shift, lookup_shift))
        out, lse = extension().offset_lookup_forward(_shifted(q_, content_shift_), _shifted(q_, lookup_shift_), k_,
                                                     v_, table_, values_, scale)
        if value_floor_ is not None:  # in place: the output kept for the backward is the one returned
            out.add_(value_floor_)
        ctx.save_for_backward(q_, k_, v_, table_, values_, value_floor_, content_shift_, lookup_shift_, out, lse)
        ctx.scale = scale
        ctx.dtypes = tuple(None if x is None else x.dtype
                           for x in (q, k, v, table, values, value_floor, content_shift, lookup_shift))
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, values, value_floor, content_shift, lookup_shift, out, lse = ctx.saved_tensors
        grad_out = _unit_stride(grad_out, q.dtype)
        weighted = out if value_floor is None else out - value_floor  # Σ_j p_ij (v_j + values[i − j])
        row_terms = (grad_out * weighted).sum(-1).contiguous()  # (B, H, Tq): Σ_d dout·weighted
        grad_c, grad_l, grad_k, grad_v, grad_table, grad_values = extension().offset_lookup_backward(
            grad_out, _shifted(q, content_shift), _shifted(q, lookup_shift), k, v, table, values, lse, row_terms,
            ctx.scale)
        grads = (grad_c + grad_l, grad_k, grad_v, grad_table, grad_values, grad_out.sum((0, 1, 2)),
                 grad_c.sum((0, 2)), grad_l.sum((0, 2)))
        return (*(None if dtype is None else g.to(dtype) for g, dtype in zip(grads, ctx.dtypes)), None)
