"""Attention with a learned vector per offset inside Triton tiles, forward and backward (CUDA; CPU tensors under
TRITON_INTERPRET=1): Transformer-XL's position terms (the GPU's counterpart of ``offset_lookup``) and Shaw's band of
key and value rows (of ``band``). The programs, and how a tile reads its offsets, are ``lookups_jit``'s.

Positions: queries at Tk − Tq .. Tk − 1 and keys at 0 .. Tk − 1 (a training step, a prefill, a KV-cache step),
causal. Shapes: B batch, H query heads, Hkv key/value heads, Tq/Tk query/key lengths, Dh head width, Dv value
width, N table rows.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from . import lookups_jit
from .offset_lookup import check_lookup_terms
from .tiles_triton import (LOG2E, by_value_columns, check_own_positions, last_unit, offered_once_checked,
                           product_kind, widths)

#: whether a GPU has run this kernel's CUDA tests; until then ``forms`` offers it on a GPU only where
#: POSENC_LOOKUPS_TRITON=1 (``benchmarks/scripts/gpu.sh`` sets it)
CHECKED_ON_GPU = False
#: the widest heads and values (bf16/fp16, float32) whose tiles fit an H100's shared memory, compiled for sm_90:
#: float32 at 128 and any dtype at 256 did not fit (wider values run by blocks of columns: ``by_value_columns``)
WIDEST = (128, 64)


def offered(q: Tensor) -> bool:
    """Whether ``forms`` offers this kernel for q (``tiles_triton.offered_once_checked``)."""
    return offered_once_checked(q, CHECKED_ON_GPU, "POSENC_LOOKUPS_TRITON", WIDEST)


def lookup_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, *, content_shift: Tensor | None = None,
                     lookup_shift: Tensor | None = None, values: Tensor | None = None,
                     value_floor: Tensor | None = None, scale: float) -> Tensor:
    """Causal ``softmax(scale·(c_i·k_j + l_i·table[h, i − j]))·v`` (plus ``Σ_j p_ij values[h, i − j]`` and
    ``value_floor``), queries at the last Tq key positions; offsets past the table's last row add nothing.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv), Tq ≤ Tk, H a multiple of Hkv; float16,
            bfloat16 or float32; v of any width (past ``WIDEST`` by blocks of columns, with ``values`` and
            ``value_floor``).
        table: (H or 1, N, Dh) float: row d is the vector of offset d (Transformer-XL: N ≥ Tk; Shaw's band: N = K).
        content_shift, lookup_shift: (H, Dh) float, added to q for the content and lookup products; None for 0.
        values: (like the table, N, Dv) float or None: row d is added to the output of every pair at offset d,
            times the pair's weight (Shaw's value band).
        value_floor: (Dv,) float or None: added to every output inside the tiles (Shaw's value for the offsets past
            its band), so no second copy of the output is kept for the backward.
        scale: the logit scale.
    Returns:
        (B, H, Tq, Dv) in q's dtype; gradients reach q, k, v and every table and shift given (products in q's
        dtype, accumulated in float32).
    """
    check_own_positions(q, k, v, WIDEST)
    check_lookup_terms(q, v, table, values, value_floor, content_shift, lookup_shift)
    return by_value_columns(lambda columns, values, value_floor: _LookupAttention.apply(
        q, k, columns, table, values, value_floor, content_shift, lookup_shift, float(scale)), v, WIDEST, values,
        value_floor)


def _sizes(q: Tensor, v: Tensor, has_values: bool) -> dict:
    """Compile-time sizes: 16 × 16 tiles under the interpreter, so a test at a few dozen tokens crosses tiles; on a
    GPU, not yet timed, 8 warps over two pipeline stages and 64 × 64 tiles in bf16/fp16 up to a head width of 64,
    32 × 32 wider or in float32. Compiled for sm_90 by Triton 3.6 (``benchmarks/scripts/sm90_tiles.py``; the
    backward, bytes of registers spilled per thread, Transformer-XL's / Shaw's): 64 × 64 tiles spill 168 / 392 at
    bf16 width 64, 1,320 / 1,992 at 128 (one stage: two did not fit), 4,744 / 14,080 in float32; 32 × 32 tiles
    0 / 96 at bf16 width 128 and 32 / 1,408 in float32. With 4 warps everything spilled more."""
    cpu = q.device.type == "cpu"
    small = q.dtype == torch.float32 or max(q.shape[-1], v.shape[-1]) > 64
    return dict(**widths(q, v.shape[-1]), BLOCK=16 if cpu else 32 if small else 64,
                HAS_VALUES=has_values, DOT=product_kind(q), num_warps=1 if cpu else 8, num_stages=1 if cpu else 2)


def _rows(table: Tensor) -> tuple[int, int]:
    """A table's head and row strides; head stride 0 where one table serves every head."""
    return (table.stride(0) if table.shape[0] > 1 else 0), table.stride(1)


class _LookupAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, values, value_floor, content_shift, lookup_shift, scale):
        q, k, v = (last_unit(x) for x in (q, k, v))
        has_values = values is not None
        table_ = table.to(torch.float32).contiguous()
        values_ = values.to(torch.float32).contiguous() if has_values else table_  # a stand-in, never read
        floor = (q.new_zeros(v.shape[-1], dtype=torch.float32) if value_floor is None
                 else value_floor.to(torch.float32).contiguous())
        batch, heads, q_len, width = q.shape
        shifts = q.new_zeros(2, heads, width, dtype=torch.float32)  # (2, H, Dh): content, lookup
        for row, shift in enumerate((content_shift, lookup_shift)):
            if shift is not None:
                shifts[row] = shift.to(torch.float32)
        out = q.new_empty(batch, q_len, heads, v.shape[-1]).transpose(1, 2)  # token-major, as SDPA returns it
        lse = torch.empty(batch * heads, q_len, device=q.device, dtype=torch.float32)
        sizes = _sizes(q, v, has_values)
        lookups_jit.forward[(triton.cdiv(q_len, sizes["BLOCK"]) * batch * heads,)](
            q, k, v, table_, values_, floor, shifts, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *_rows(table_), *_rows(values_), *out.stride()[:3], heads, heads // k.shape[1], q_len, k.shape[2],
            table_.shape[1], scale * LOG2E, **sizes)
        ctx.save_for_backward(q, k, v, table_, values_, floor, shifts, out, lse)
        ctx.scale, ctx.has_values = scale, has_values
        ctx.dtypes = tuple(None if x is None else x.dtype
                           for x in (table, values, value_floor, content_shift, lookup_shift))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, values, floor, shifts, out, lse = ctx.saved_tensors
        grad_out = last_unit(grad_out.to(q.dtype))
        batch, heads, q_len, _ = q.shape
        # (B, H, Tq): Σ_d dout·(out − floor), the floor being no weighted term
        delta = (grad_out.float() * (out.float() - floor)).sum(-1).contiguous()
        dq = torch.empty_like(q)
        dk, dv = (torch.zeros(x.shape, device=x.device, dtype=torch.float32) for x in (k, v))
        d_table, d_values, d_shifts = torch.zeros_like(table), torch.zeros_like(values), torch.zeros_like(shifts)
        sizes = _sizes(q, v, ctx.has_values)
        lookups_jit.backward[(triton.cdiv(q_len, sizes["BLOCK"]) * batch * heads,)](
            q, k, v, table, values, shifts, grad_out, lse, delta, dq, dk, dv, d_table, d_values, d_shifts,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *_rows(table), *_rows(values), *grad_out.stride()[:3],
            *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], heads, heads // k.shape[1], q_len, k.shape[2],
            table.shape[1], ctx.scale, ctx.scale * LOG2E, **sizes)
        d_floor = grad_out.float().sum((0, 1, 2))  # (Dv,)
        grads = (d_table, d_values, d_floor, d_shifts[0], d_shifts[1])
        return (dq, dk.to(k.dtype), dv.to(v.dtype),
                *(None if dtype is None else g.to(dtype) for g, dtype in zip(grads, ctx.dtypes)), None)
