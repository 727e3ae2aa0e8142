"""RoPE on q and k in one Triton launch, forward and backward (CUDA; CPU under TRITON_INTERPRET=1).

One program rotates a tile of positions of one (batch, head): it reads the tile's cos/sin
once (F values per position), its channels once, and writes them once, in float32
whatever the activation dtype. The grid covers the query heads and then the key heads, so q and k
(which may sit at different positions: KV-cache decoding) share one launch. The
backward pass is the same kernel with sin negated (a rotation's inverse is its
transpose), so only cos/sin are kept for it.

Shapes: B batch, H query heads, Hk key heads, T positions, Dh head width, F pairs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

#: pairs per program: a tile of up to 64 positions of one (batch, head); one row per program left a launch of
#: tiny programs at 6.9x a copy of the same bytes on an H200 (q and k of (4, 16, 2048, 64), bf16)
TILE_PAIRS = 2048


@triton.jit
def _rope_tiles(q, k, q_out, k_out, q_cos, q_sin, k_cos, k_sin,
                q_sb, q_sh, q_st, k_sb, k_sh, k_st, qo_sb, qo_sh, qo_st, ko_sb, ko_sh, ko_st,
                qc_sb, qc_st, kc_sb, kc_st, q_len, k_len, q_heads, all_heads, sign,
                PAIRS: tl.constexpr, HEAD_DIM: tl.constexpr, INTERLEAVED: tl.constexpr,
                BLOCK_T: tl.constexpr, BLOCK_PAIRS: tl.constexpr, BLOCK_REST: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]  # (BLOCK_T, 1) positions
    b = tl.program_id(1) // all_heads
    head = tl.program_id(1) % all_heads  # query heads first, then key heads
    if head < q_heads:
        length = q_len
        src = q + b * q_sb + head * q_sh + t * q_st
        dst = q_out + b * qo_sb + head * qo_sh + t * qo_st
        cos_rows = q_cos + b * qc_sb + t * qc_st
        sin_rows = q_sin + b * qc_sb + t * qc_st
    else:
        length = k_len
        src = k + b * k_sb + (head - q_heads) * k_sh + t * k_st
        dst = k_out + b * ko_sb + (head - q_heads) * ko_sh + t * ko_st
        cos_rows = k_cos + b * kc_sb + t * kc_st
        sin_rows = k_sin + b * kc_sb + t * kc_st
    pair = tl.arange(0, BLOCK_PAIRS)[None, :]  # (1, BLOCK_PAIRS)
    in_range = (t < length) & (pair < PAIRS)
    cos = tl.load(cos_rows + pair, mask=in_range, other=0.0).to(tl.float32)
    sin = tl.load(sin_rows + pair, mask=in_range, other=0.0).to(tl.float32) * sign
    if INTERLEAVED:
        first, second = 2 * pair, 2 * pair + 1
    else:
        first, second = pair, pair + PAIRS
    x1 = tl.load(src + first, mask=in_range, other=0.0).to(tl.float32)
    x2 = tl.load(src + second, mask=in_range, other=0.0).to(tl.float32)
    tl.store(dst + first, (x1 * cos - x2 * sin).to(dst.dtype.element_ty), mask=in_range)
    tl.store(dst + second, (x2 * cos + x1 * sin).to(dst.dtype.element_ty), mask=in_range)
    if BLOCK_REST > 0:  # partial rotary: the channels past 2F pass through
        rest = 2 * PAIRS + tl.arange(0, BLOCK_REST)[None, :]
        keep = (t < length) & (rest < HEAD_DIM)
        tl.store(dst + rest, tl.load(src + rest, mask=keep), mask=keep)


def _launch(q: Tensor, k: Tensor, q_cos: Tensor, q_sin: Tensor, k_cos: Tensor, k_sin: Tensor, layout: str,
            sign: float) -> tuple[Tensor, Tensor]:
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    q_cos, q_sin, k_cos, k_sin = (t.contiguous() for t in (q_cos, q_sin, k_cos, k_sin))
    batch, q_heads, q_len, head_dim = q.shape
    k_heads, k_len = k.shape[1], k.shape[2]
    pairs = q_cos.shape[-1]
    block_pairs = triton.next_power_of_2(pairs)
    block_t = max(1, min(64, TILE_PAIRS // block_pairs))

    def batch_stride(table: Tensor) -> int:  # (B or 1, 1, T, F): 0 broadcasts one row set over the batch
        return 0 if table.shape[0] == 1 else table.stride(0)

    grid = (triton.cdiv(max(q_len, k_len), block_t), batch * (q_heads + k_heads))
    _rope_tiles[grid](
        q, k, q_out, k_out, q_cos, q_sin, k_cos, k_sin,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2), k_out.stride(0), k_out.stride(1), k_out.stride(2),
        batch_stride(q_cos), q_cos.stride(2), batch_stride(k_cos), k_cos.stride(2), q_len, k_len, q_heads,
        q_heads + k_heads, sign,
        PAIRS=pairs, HEAD_DIM=head_dim, INTERLEAVED=layout == "interleaved", BLOCK_T=block_t,
        BLOCK_PAIRS=block_pairs,
        BLOCK_REST=0 if head_dim == 2 * pairs else triton.next_power_of_2(head_dim - 2 * pairs),
    )
    return q_out, k_out


class _RopeQK(torch.autograd.Function):
    @staticmethod
    def forward(q, k, q_cos, q_sin, k_cos, k_sin, layout):
        return _launch(q, k, q_cos, q_sin, k_cos, k_sin, layout, 1.0)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[2:6])
        ctx.layout = inputs[6]

    @staticmethod
    def backward(ctx, grad_q: Tensor, grad_k: Tensor):
        q_cos, q_sin, k_cos, k_sin = ctx.saved_tensors
        grad_q, grad_k = _launch(grad_q, grad_k, q_cos, q_sin, k_cos, k_sin, ctx.layout, -1.0)
        return grad_q, grad_k, None, None, None, None, None


def rope_qk_triton(q: Tensor, k: Tensor, q_cos: Tensor, q_sin: Tensor, k_cos: Tensor, k_sin: Tensor,
                   layout: str = "half") -> tuple[Tensor, Tensor]:
    """Rotate q and k in one launch; the same result as ``rotate_pairs`` on each.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hk, Tk, Dh); any float dtype, last dim contiguous (else copied).
        q_cos, q_sin: (B or 1, 1, Tq, F) from ``rope_cos_sin`` (float32); k_cos, k_sin: (B or 1, 1, Tk, F).
        layout: "half" or "interleaved".
    Returns:
        Rotated (q, k), new tensors in the inputs' dtypes; differentiable in q and k.
    """
    return _RopeQK.apply(q, k, q_cos, q_sin, k_cos, k_sin, layout)
