"""RoPE on q and k in one Triton launch, forward and backward (CUDA; CPU under TRITON_INTERPRET=1).

One program rotates a tile of positions of one batch row for a group of heads: it reads the tile's
cos/sin once (F values per position) for all the group's heads, then each head's channels once, and
writes them once, in cos's dtype (float32; float64 for float64 tables) whatever the activation dtype.
The grid covers the query head groups and then the key head groups, so q and k (which may sit at
different positions: KV-cache decoding) share one launch. Each program reads the two members of its
pairs before it writes them and no two programs share a channel, so the output may be the input
itself: ``rope_qk_triton_`` rotates in place. The backward pass is the same kernel with sin negated
(a rotation's inverse is its transpose), so only cos/sin are kept for it; it writes new tensors
(the gradients autograd hands over may be the caller's own tensors, or expanded ones).

Shapes: B batch, H query heads, Hk key heads, T positions, Dh head width, F pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from .tiles_terms import program_tile


@dataclass(frozen=True)
class Tiling:
    """The work of one program; ``benchmarks/scripts/gpu_rope_sweep.py`` times a few of these against ``copy_``."""

    pairs: int = 2048  # pairs per head: a tile of pairs // F positions (at most 64)
    heads: int = 8  # heads per program, sharing one load of the tile's cos/sin (2x the bf16 bytes of one head)
    warps: int = 8


#: on an H200, q (8, 32, 4096, 128) and k (8, 8, 4096, 128) in bf16, device time / copy_'s: in place 1.10x
#: (one head per program, 4 warps: 1.12x; 4 heads: 1.13x; 64 positions of 8 heads: 1.18x)
TILING = Tiling()


@triton.jit
def _rope_tiles(q, k, q_out, k_out, q_cos, q_sin, k_cos, k_sin,
                q_sb, q_sh, q_st, k_sb, k_sh, k_st, qo_sb, qo_sh, qo_st, ko_sb, ko_sh, ko_st,
                qc_sb, qc_st, kc_sb, kc_st, q_len, k_len, q_heads, k_heads, q_groups, all_groups, sign,
                PAIRS: tl.constexpr, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr, HEADS: tl.constexpr,
                BLOCK_T: tl.constexpr, BLOCK_PAIRS: tl.constexpr, BLOCK_REST: tl.constexpr):
    # the grid as every tile kernel's (``program_tile``), head groups for heads: query head groups first, then key
    # head groups; offsets in int64 (a tensor's rows or heads pass 2^31 elements at 2^20 tokens)
    start, b, group = program_tile(tl.maximum(q_len, k_len), all_groups, BLOCK_T)
    t = (start + tl.arange(0, BLOCK_T)).to(tl.int64)[:, None]  # (BLOCK_T, 1) positions
    if group < q_groups:
        length, heads, first = q_len, q_heads, group * HEADS
        src, src_sh = q + b * q_sb + t * q_st, q_sh
        dst, dst_sh = q_out + b * qo_sb + t * qo_st, qo_sh
        cos_rows, sin_rows = q_cos + b * qc_sb + t * qc_st, q_sin + b * qc_sb + t * qc_st
    else:
        length, heads, first = k_len, k_heads, (group - q_groups) * HEADS
        src, src_sh = k + b * k_sb + t * k_st, k_sh
        dst, dst_sh = k_out + b * ko_sb + t * ko_st, ko_sh
        cos_rows, sin_rows = k_cos + b * kc_sb + t * kc_st, k_sin + b * kc_sb + t * kc_st
    pair = tl.arange(0, BLOCK_PAIRS)[None, :]  # (1, BLOCK_PAIRS)
    cos = tl.load(cos_rows + pair, mask=(t < length) & (pair < PAIRS), other=0.0)  # the math dtype
    sin = tl.load(sin_rows + pair, mask=(t < length) & (pair < PAIRS), other=0.0) * sign
    channel = tl.arange(0, 2 * BLOCK_PAIRS)[None, :]  # (1, 2 BLOCK_PAIRS): interleaved rows, read whole
    for i in range(HEADS):
        head = first + i
        x_src, x_dst = src + head * src_sh, dst + head * dst_sh
        rows = t < tl.where(head < heads, length, 0)  # (BLOCK_T, 1): none past the last head
        if INTERLEAVED:  # one contiguous row load, split into the pairs' members
            row_mask = rows & (channel < 2 * PAIRS)
            x = tl.load(x_src + channel, mask=row_mask, other=0.0).to(cos.dtype)
            x1, x2 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_PAIRS, 2)))  # (BLOCK_T, BLOCK_PAIRS) each
            y = tl.reshape(tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin), (BLOCK_T, 2 * BLOCK_PAIRS))
            tl.store(x_dst + channel, y.to(x_dst.dtype.element_ty), mask=row_mask)
        else:  # two contiguous half rows
            mask = rows & (pair < PAIRS)
            x1 = tl.load(x_src + pair, mask=mask, other=0.0).to(cos.dtype)
            x2 = tl.load(x_src + PAIRS + pair, mask=mask, other=0.0).to(cos.dtype)
            tl.store(x_dst + pair, (x1 * cos - x2 * sin).to(x_dst.dtype.element_ty), mask=mask)
            tl.store(x_dst + PAIRS + pair, (x2 * cos + x1 * sin).to(x_dst.dtype.element_ty), mask=mask)
        if BLOCK_REST > 0:  # partial rotary, out of place: the channels past 2F pass through
            rest = 2 * PAIRS + tl.arange(0, BLOCK_REST)[None, :]
            keep = rows & (rest < HEAD_DIM)
            tl.store(x_dst + rest, tl.load(x_src + rest, mask=keep), mask=keep)

def _launch(q: Tensor, k: Tensor, q_out: Tensor, k_out: Tensor, tables: tuple[Tensor, ...], layout: str, sign: float,
            tiling: Tiling) -> None:
    """Write the rotation of (q, k) into (q_out, k_out), which may be (q, k) themselves. Last dims contiguous."""
    q_cos, q_sin, k_cos, k_sin = (t.contiguous() for t in tables)
    batch, q_heads, q_len, head_dim = q.shape
    k_heads, k_len = k.shape[1], k.shape[2]
    pairs = q_cos.shape[-1]
    block_pairs = triton.next_power_of_2(pairs)
    block_t = max(1, min(64, tiling.pairs // block_pairs, triton.next_power_of_2(max(q_len, k_len))))
    heads = max(1, min(tiling.heads, max(q_heads, k_heads)))
    q_groups, k_groups = triton.cdiv(q_heads, heads), triton.cdiv(k_heads, heads)

    def batch_stride(table: Tensor) -> int:  # (B or 1, 1, T, F): 0 broadcasts one row set over the batch
        return 0 if table.shape[0] == 1 else table.stride(0)

    in_place = q_out is q and k_out is k
    grid = (triton.cdiv(max(q_len, k_len), block_t) * batch * (q_groups + k_groups),)
    _rope_tiles[grid](
        q, k, q_out, k_out, q_cos, q_sin, k_cos, k_sin,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        batch_stride(q_cos), q_cos.stride(2), batch_stride(k_cos), k_cos.stride(2), q_len, k_len, q_heads, k_heads,
        q_groups, q_groups + k_groups, sign,
        PAIRS=pairs, HEAD_DIM=head_dim, INTERLEAVED=layout == "interleaved", HEADS=heads, BLOCK_T=block_t,
        BLOCK_PAIRS=block_pairs,
        BLOCK_REST=0 if in_place or head_dim == 2 * pairs else triton.next_power_of_2(head_dim - 2 * pairs),
        num_warps=tiling.warps,
    )


def _rotated(q: Tensor, k: Tensor, tables: tuple[Tensor, ...], layout: str, sign: float,
             tiling: Tiling) -> tuple[Tensor, Tensor]:
    """The rotation of (q, k) as new tensors."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    _launch(q, k, q_out, k_out, tables, layout, sign, tiling)
    return q_out, k_out


class _RopeQK(torch.autograd.Function):
    @staticmethod
    def forward(q, k, q_cos, q_sin, k_cos, k_sin, layout, tiling):
        return _rotated(q, k, (q_cos, q_sin, k_cos, k_sin), layout, 1.0, tiling)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[2:6])
        ctx.layout, ctx.tiling = inputs[6:8]

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor):
        grad_q, grad_k = _rotated(grad_q, grad_k, ctx.saved_tensors, ctx.layout, -1.0, ctx.tiling)
        return grad_q, grad_k, None, None, None, None, None, None


class _Rotated(torch.autograd.Function):
    """Autograd's record of one tensor that ``rope_qk_triton_`` rotates in place: forward returns x, marked dirty;
    backward rotates the gradient back into a new tensor. One record per tensor, because the engine refuses a
    Function that modifies a view (the model's q and k are views of its qkv projection) and returns two tensors."""

    @staticmethod
    def forward(x, cos, sin, layout, tiling):
        return x

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, cos, sin, ctx.layout, ctx.tiling = inputs
        ctx.save_for_backward(cos, sin)
        ctx.mark_dirty(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        rotated, _ = _rotated(grad, grad[:, :0], (cos, sin, cos, sin), ctx.layout, -1.0, ctx.tiling)  # no key heads
        return rotated, None, None, None, None


def rope_qk_triton(q: Tensor, k: Tensor, q_cos: Tensor, q_sin: Tensor, k_cos: Tensor, k_sin: Tensor,
                   layout: str = "half", tiling: Tiling = TILING) -> tuple[Tensor, Tensor]:
    """Rotate q and k in one launch; the same result as ``rotate_pairs`` on each.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hk, Tk, Dh); any float dtype, last dim contiguous (else copied).
        q_cos, q_sin: (B or 1, 1, Tq, F) from ``rope_cos_sin`` (float32, the math dtype); k_cos, k_sin:
            (B or 1, 1, Tk, F).
        layout: "half" or "interleaved".
        tiling: the work of one program (a benchmark's knob; the default is the measured best).
    Returns:
        Rotated (q, k), new tensors in the inputs' dtypes; differentiable in q and k.
    """
    return _RopeQK.apply(q, k, q_cos, q_sin, k_cos, k_sin, layout, tiling)


def rope_qk_triton_(q: Tensor, k: Tensor, q_cos: Tensor, q_sin: Tensor, k_cos: Tensor, k_sin: Tensor,
                    layout: str = "half", tiling: Tiling = TILING) -> tuple[Tensor, Tensor]:
    """``rope_qk_triton`` written into q and k themselves; returns (q, k).

    For a caller that owns q and k (the model's slices of its qkv projection), which must not overlap:
    nothing is allocated, and the bytes moved are those of one ``copy_``. Arguments as ``rope_qk_triton``.
    """
    # Autograd's records first, so that what it refuses (a leaf that requires grad) is refused before any write.
    q = _Rotated.apply(q, q_cos, q_sin, layout, tiling)
    k = _Rotated.apply(k, k_cos, k_sin, layout, tiling)
    tables = (q_cos, q_sin, k_cos, k_sin)
    with torch.no_grad():
        if q.stride(-1) == 1 and k.stride(-1) == 1:
            _launch(q, k, q, k, tables, layout, 1.0, tiling)
        else:  # the kernel reads rows contiguously: rotate copies and write them back
            for x, rotated in zip((q, k), _rotated(q, k, tables, layout, 1.0, tiling)):
                x.copy_(rotated)
    return q, k
