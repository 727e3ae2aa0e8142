"""Stick-breaking attention inside Triton tiles, forward and backward (CUDA; CPU tensors under TRITON_INTERPRET=1).

Stick-breaking's weights replace the softmax: with z = scale·q·kᵀ over the allowed keys (causal: l ≤ i, or l < i
where a query does not attend to its own key),

    A_ij = σ(z_ij) · Π_{j<l allowed} (1 − σ(z_il)),    out_i = Σ_j A_ij v_j    (rows sum to at most 1).

Each query tile walks its key tiles from the diagonal back to key 0 and carries, per row, the log of the stick
that later keys left: Σ_{l later} log σ(−z_il). Inside a tile a reverse cumulative sum gives each key its share,
so nothing of size Tq × Tk exists, and there is no running maximum to rescale (every log weight is ≤ 0).

The backward walks the same way. With g_ij = dO_i·v_j and D_i = Σ_j A_ij g_ij = dO_i·out_i,

    dz_il = A_il g_il σ(−z_il) − σ(z_il) Σ_{j<l} A_ij g_ij,    Σ_{j<l} A_ij g_ij = D_i − Σ_{j≥l} A_ij g_ij,

so the walk carries the suffix Σ_{j≥l} A_ij g_ij beside the stick; D_i comes from the forward's float32 output. dq
stays in the program; dk and dv are added atomically in float32, per key/value head, so grouped-query heads need
no repeated k or v.

Positions: queries at Tk − Tq .. Tk − 1 and keys at 0 .. Tk − 1 (a training step, a prefill, a KV-cache step).
Shapes: B batch, H query heads, Hkv key/value heads, Tq/Tk query/key lengths, Dh head width, Dv value width.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .tiles_terms import along, dot, key_value_tiles, program_tile
from .tiles_triton import (by_value_columns, check_own_positions, last_unit, offered_once_checked, product_kind,
                           widths)
#: whether a GPU has run this kernel's CUDA tests; until then ``forms`` offers it on a GPU only where
#: POSENC_STICKS_TRITON=1 (``benchmarks/scripts/gpu.sh`` sets it), and stick-breaking there computes as eager does
CHECKED_ON_GPU = False
#: the widest heads and values (bf16/fp16, float32) whose tiles (``_blocks``) fit an H100's shared memory, compiled
#: for sm_90 (wider values run by blocks of columns: ``by_value_columns``)
WIDEST = (256, 128)


def offered(q: Tensor) -> bool:
    """Whether ``forms`` offers this kernel for q (``tiles_triton.offered_once_checked``)."""
    return offered_once_checked(q, CHECKED_ON_GPU, "POSENC_STICKS_TRITON", WIDEST)


def stick_breaking_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, attend_current: bool) -> Tensor:
    """Causal stick-breaking attention at the model's own positions.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv), Tq ≤ Tk, H a multiple of Hkv; float16,
            bfloat16 or float32; v of any width (past ``WIDEST`` by blocks of columns).
        scale: the logit scale.
        attend_current: whether a query may attend to the key at its own position.
    Returns:
        (B, H, Tq, Dv) in q's dtype; a row with no allowed key is zeros.
    """
    check_own_positions(q, k, v, WIDEST)
    return by_value_columns(lambda columns: _StickBreaking.apply(q, k, columns, float(scale), bool(attend_current)),
                            v, WIDEST)


@triton.jit
def _log_sigmoid(x):
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _key_tile(q, start_n, K, V, s_kt, s_vt, rows, q_pos, q_len, k_len, scale, offs_d, offs_dv,
              HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CURRENT: tl.constexpr,
              DOT: tl.constexpr):
    """A query tile against the keys from ``start_n``: (keys, k (BLOCK_N, BLOCK_D), v (BLOCK_N, BLOCK_DV), z,
    allowed, log σ(z), log σ(−z) (0 where not allowed))."""
    cols = start_n + tl.arange(0, BLOCK_N)
    in_keys, k_tile, v_tile = key_value_tiles(K, V, cols, k_len, s_kt, s_vt, offs_d, offs_dv, HEAD_DIM, VALUE_DIM)
    z = dot(q, tl.trans(k_tile), DOT) * scale
    earlier = (cols[None, :] <= q_pos[:, None]) if CURRENT else (cols[None, :] < q_pos[:, None])
    allowed = earlier & in_keys[None, :] & (rows < q_len)[:, None]
    log_rest = tl.where(allowed, _log_sigmoid(-z), 0.0)
    return cols, in_keys, k_tile, v_tile, z, allowed, _log_sigmoid(z), log_rest


@triton.jit
def _weights(log_take, log_rest, stick, allowed):
    """The tile's weights: each key takes σ(z) of what the later keys of the tile and ``stick`` (the later tiles',
    per row) left."""
    later_in_tile = tl.cumsum(log_rest, axis=1, reverse=True) - log_rest
    return tl.where(allowed, tl.exp(log_take + later_in_tile + stick[:, None]), 0.0)


@triton.jit
def _query_tile(Q, s_qb, s_qh, s_qt, heads, q_len, k_len, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's query tile: (b, h, its rows, their key positions, offs_d, offs_dv, q (BLOCK_M, BLOCK_D), the
    number of key tiles up to its last query's position)."""
    start_m, b, h = program_tile(q_len, heads, BLOCK_M)
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * s_qb + h * s_qh + along(rows, s_qt)[:, None] + offs_d[None, :],
                mask=(rows < q_len)[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    tiles = tl.cdiv(tl.minimum(start_m + BLOCK_M + (k_len - q_len), k_len), BLOCK_N)
    return b, h, rows, rows + (k_len - q_len), offs_d, offs_dv, q, tiles


@triton.jit
def _forward(Q, K, V, OUT, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ob, s_oh, s_ot,
             heads, group, q_len, k_len, scale, HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CURRENT: tl.constexpr, DOT: tl.constexpr):
    """OUT (B, H, Tq, Dv) float32."""
    b, h, rows, q_pos, offs_d, offs_dv, q, tiles = _query_tile(Q, s_qb, s_qh, s_qt, heads, q_len, k_len, HEAD_DIM,
                                                               BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N)
    K_, V_ = K + b * s_kb + (h // group) * s_kh, V + b * s_vb + (h // group) * s_vh
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    stick = tl.zeros([BLOCK_M], tl.float32)
    for back in range(0, tiles):
        cols, in_keys, k_tile, v_tile, z, allowed, log_take, log_rest = _key_tile(
            q, (tiles - 1 - back) * BLOCK_N, K_, V_, s_kt, s_vt, rows, q_pos, q_len, k_len, scale, offs_d, offs_dv,
            HEAD_DIM, VALUE_DIM, BLOCK_N, CURRENT, DOT)
        weights = _weights(log_take, log_rest, stick, allowed)
        acc += dot(weights.to(v_tile.dtype), v_tile, DOT)
        stick += tl.sum(log_rest, 1)
    tl.store(OUT + b * s_ob + h * s_oh + along(rows, s_ot)[:, None] + offs_dv[None, :], acc,
             mask=(rows < q_len)[:, None] & (offs_dv[None, :] < VALUE_DIM))


@triton.jit
def _backward(Q, K, V, DO, DELTA, DQ, DK, DV, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt,
              s_dob, s_doh, s_dot, s_dqb, s_dqh, s_dqt, s_dkb, s_dkh, s_dkt, s_dvb, s_dvh, s_dvt,
              heads, group, q_len, k_len, scale, HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr,
              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CURRENT: tl.constexpr, DOT: tl.constexpr):
    """DQ (B, H, Tq, Dh) in q's dtype; DK (B, Hkv, Tk, Dh) and DV (B, Hkv, Tk, Dv) float32, added to."""
    b, h, rows, q_pos, offs_d, offs_dv, q, tiles = _query_tile(Q, s_qb, s_qh, s_qt, heads, q_len, k_len, HEAD_DIM,
                                                               BLOCK_D, BLOCK_DV, BLOCK_M, BLOCK_N)
    in_queries = rows < q_len
    grad = tl.load(DO + b * s_dob + h * s_doh + along(rows, s_dot)[:, None] + offs_dv[None, :],
                   mask=in_queries[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
    total = tl.load(DELTA + (b * heads + h) * q_len + rows, mask=in_queries, other=0.0)  # D_i
    kv_head = h // group
    K_, V_ = K + b * s_kb + kv_head * s_kh, V + b * s_vb + kv_head * s_vh
    DK_, DV_ = DK + b * s_dkb + kv_head * s_dkh, DV + b * s_dvb + kv_head * s_dvh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    stick = tl.zeros([BLOCK_M], tl.float32)
    later_taken = tl.zeros([BLOCK_M], tl.float32)  # Σ over the later tiles' keys of A·g
    for back in range(0, tiles):
        cols, in_keys, k_tile, v_tile, z, allowed, log_take, log_rest = _key_tile(
            q, (tiles - 1 - back) * BLOCK_N, K_, V_, s_kt, s_vt, rows, q_pos, q_len, k_len, scale, offs_d, offs_dv,
            HEAD_DIM, VALUE_DIM, BLOCK_N, CURRENT, DOT)
        # the weights as the forward's product read them (rounded to v's dtype), so that Σ_j A_ij g_ij is D_i
        weights = _weights(log_take, log_rest, stick, allowed).to(v_tile.dtype).to(tl.float32)
        taken = weights * dot(grad, tl.trans(v_tile), DOT)  # A_ij g_ij
        from_here = tl.cumsum(taken, axis=1, reverse=True) + later_taken[:, None]  # Σ_{j ≥ l} A g
        take = tl.exp(log_take)  # σ(z)
        dz = tl.where(allowed, taken * (1.0 - take) - take * (total[:, None] - from_here), 0.0) * scale
        dq += dot(dz.to(k_tile.dtype), k_tile, DOT)
        key_rows = in_keys[:, None]
        tl.atomic_add(DK_ + along(cols, s_dkt)[:, None] + offs_d[None, :], dot(tl.trans(dz.to(q.dtype)), q, DOT),
                      mask=key_rows & (offs_d[None, :] < HEAD_DIM))
        tl.atomic_add(DV_ + along(cols, s_dvt)[:, None] + offs_dv[None, :],
                      dot(tl.trans(weights.to(grad.dtype)), grad, DOT), mask=key_rows & (offs_dv[None, :] < VALUE_DIM))
        stick += tl.sum(log_rest, 1)
        later_taken += tl.sum(taken, 1)
    tl.store(DQ + b * s_dqb + h * s_dqh + along(rows, s_dqt)[:, None] + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM))


def _blocks(q: Tensor, value_dim: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, warps): 16 × 16 under the interpreter, so a test at a few dozen tokens crosses tiles; on a
    GPU 64 × 64 with 8 warps, not yet timed for this kernel, and 32 × 32 with 4 for heads or values wider than 128
    (float32: 64). Compiled for sm_90 (Triton 3.6, ``benchmarks/scripts/sm90_tiles.py``): at 64 × 64 the backward
    spilled 120–128 bytes of registers per thread in bf16 at width 64, 248 at 128 and 488 in float32 at 64; bf16 at
    256 asked for 320 KiB of shared memory (a block has 227) and float32 at 128 spilled 4,544 bytes; 32 × 32 fits
    them in 114 KiB, spilling 152 bytes and none."""
    if q.device.type == "cpu":
        return 16, 16, 1
    narrow = max(q.shape[-1], value_dim) <= (64 if q.dtype == torch.float32 else 128)
    return (64, 64, 8) if narrow else (32, 32, 4)


def _sizes(q: Tensor, k: Tensor, v: Tensor, attend_current: bool) -> dict:
    block_m, block_n, warps = _blocks(q, v.shape[-1])
    return dict(**widths(q, v.shape[-1]), BLOCK_M=block_m, BLOCK_N=block_n, CURRENT=attend_current,
                DOT=product_kind(q), num_warps=warps)


class _StickBreaking(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, attend_current):
        q, k, v = (last_unit(x) for x in (q, k, v))
        batch, heads, q_len, _ = q.shape
        out = torch.empty(batch, heads, q_len, v.shape[-1], device=q.device, dtype=torch.float32)
        sizes = _sizes(q, k, v, attend_current)
        _forward[(triton.cdiv(q_len, sizes["BLOCK_M"]) * batch * heads,)](
            q, k, v, out, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], heads,
            heads // k.shape[1], q_len, k.shape[2], scale, **sizes)
        ctx.save_for_backward(q, k, v, out)
        ctx.scale, ctx.attend_current = scale, attend_current
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        grad_out = last_unit(grad_out.to(q.dtype))
        batch, heads, q_len, _ = q.shape
        total = (grad_out.float() * out).sum(-1).contiguous()  # (B, H, Tq): D_i = dO_i·out_i
        dq = torch.empty_like(q)
        dk = torch.zeros(k.shape, device=k.device, dtype=torch.float32)
        dv = torch.zeros(v.shape, device=v.device, dtype=torch.float32)
        sizes = _sizes(q, k, v, ctx.attend_current)
        _backward[(triton.cdiv(q_len, sizes["BLOCK_M"]) * batch * heads,)](
            q, k, v, grad_out, total, dq, dk, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *grad_out.stride()[:3], *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], heads,
            heads // k.shape[1], q_len, k.shape[2], ctx.scale, **sizes)
        return dq, dk.to(k.dtype), dv.to(v.dtype), None, None
