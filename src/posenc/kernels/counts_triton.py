"""CoPE's attention inside Triton tiles, forward and backward (CUDA; CPU tensors under TRITON_INTERPRET=1): the
GPU's counterpart of ``gated_counts``.

The logit of query i and key j is ``scale·q_i·k_j + lerp(Z_i[⌊p⌋], Z_i[⌈p⌉], p − ⌊p⌋)``, with Z = q·eᵀ (a row of
P numbers per query) and CoPE's count ``p_ij = min(Σ_{t=j..i} σ(gate_scale·q_i·k_t), P − 1)``. Each query tile
computes its Z once and walks its key tiles from the diagonal back to key 0, carrying per row the gates counted so
far; inside a tile a reverse cumulative sum gives each key its count. Once every row's count has reached P − 1 the
earlier keys all read Z_i[P − 1]: those tiles are plain attention plus one number per row, with no gates.

The backward walks twice. The first walk, over the counting tiles only, sums per row dP_ij = ds_ij·(Z_i[⌈p⌉] −
Z_i[⌊p⌋]) (zero where the count is clamped). The second takes each gate's gradient from it, Σ_{j≤t} dP_ij = that
total − the sum over the later keys, which the walk carries; reduces ds onto Z's columns (two per pair, by
⌊p⌋ and ⌈p⌉); and adds dk and dv atomically in float32, per key/value head. dq gains dZ·e and the table dZᵀ·q once
per program. Z, the counts and the gates are float32 whatever q's dtype, and so is the output the backward reads
(D_i = dO_i·out_i): from a bf16 output, bf16 gradients of q and k moved by 4e-2 of their largest magnitude, 6e-3
from a float32 one.

Positions: queries at Tk − Tq .. Tk − 1 and keys at 0 .. Tk − 1 (a training step, a prefill, a KV-cache step),
causal. Shapes: B batch, H query heads, Hkv key/value heads, Tq/Tk query/key lengths, Dh head width, Dv value
width, P table rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .tiles_terms import along, dot, program_tile
from .tiles_triton import (LOG2E, check_own_positions, fits_shared_memory, last_unit, offered_once_checked,
                           product_kind)

#: whether a GPU has run this kernel's CUDA tests; until then ``forms`` offers it on a GPU only where
#: POSENC_COUNTS_TRITON=1 (``benchmarks/scripts/gpu.sh`` sets it)
CHECKED_ON_GPU = False


def offered(q: Tensor, rows: int) -> bool:
    """Whether ``forms`` offers this kernel for q (``tiles_triton.offered_once_checked``) and CoPE's table of
    ``rows`` positions: at head widths whose tiles fit (``tiles_triton.fits_shared_memory``), and up to 128 rows
    (256 did not fit)."""
    return fits_shared_memory(q) and rows <= 128 and offered_once_checked(q, CHECKED_ON_GPU, "POSENC_COUNTS_TRITON")


def counts_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, *, scale: float, gate_scale: float) -> Tensor:
    """Causal CoPE attention, queries at the last Tq key positions.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv), Tq ≤ Tk, H a multiple of Hkv; float16,
            bfloat16 or float32.
        table: (P, Dh) float, CoPE's ``embeddings``, P ≥ 2.
        scale: the content logits' scale; gate_scale: the gates' (CoPE: 1/√Dh).
    Returns:
        (B, H, Tq, Dv) in q's dtype; gradients reach q, k, v and the table.
    """
    check_own_positions(q, k, v)
    width = q.shape[-1]
    if table.dim() != 2 or table.shape[0] < 2 or table.shape[1] != width:
        raise ValueError(f"table must be (P >= 2, Dh = {width}), got {tuple(table.shape)}")
    return _CountsAttention.apply(q, k, v, table, float(scale), float(gate_scale))


@triton.jit
def _query_tile(Q, TABLE, s_qb, s_qh, s_qt, heads, q_len, k_len, n_rows, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK: tl.constexpr):
    """This program's query tile: (b, h, its rows, their key positions, offs_d, offs_dv, q (BLOCK, BLOCK_D), Z
    (BLOCK, BLOCK_P) float32, the table's rows (BLOCK_P, BLOCK_D) float32, the number of key tiles up to its last
    query's position)."""
    start_m, b, h = program_tile(q_len, heads, BLOCK)
    rows = start_m + tl.arange(0, BLOCK)
    offs_d, offs_dv, offs_p = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV), tl.arange(0, BLOCK_P)
    q = tl.load(Q + b * s_qb + h * s_qh + along(rows, s_qt)[:, None] + offs_d[None, :],
                mask=(rows < q_len)[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    table = tl.load(TABLE + offs_p[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=(offs_p[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    per_row = tl.dot(q.to(tl.float32), tl.trans(table), input_precision="ieee")  # Z, never in q's dtype
    tiles = tl.cdiv(tl.minimum(start_m + BLOCK + (k_len - q_len), k_len), BLOCK)
    return b, h, rows, rows + (k_len - q_len), offs_d, offs_dv, offs_p, q, per_row, table, tiles


@triton.jit
def _counting(counted, rows, q_len, n_rows):
    """Whether some query row of the tile has counted fewer than P − 1 gates; once none has, every earlier key
    reads Z[P − 1]."""
    return tl.min(tl.where(rows < q_len, counted, n_rows), 0) < n_rows - 1


@triton.jit
def _key_tile(q, start_n, K, V, s_kt, s_vt, rows, q_pos, q_len, k_len, offs_d, offs_dv, HEAD_DIM: tl.constexpr,
              VALUE_DIM: tl.constexpr, BLOCK: tl.constexpr, DOT: tl.constexpr):
    """A query tile against the keys from ``start_n``: (keys, whether within Tk, k (BLOCK, BLOCK_D), v (BLOCK,
    BLOCK_DV), the pairs that may attend, q·kᵀ (BLOCK, BLOCK) float32)."""
    cols = start_n + tl.arange(0, BLOCK)
    in_keys = cols < k_len
    k_tile = tl.load(K + along(cols, s_kt)[:, None] + offs_d[None, :],
                     mask=in_keys[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    v_tile = tl.load(V + along(cols, s_vt)[:, None] + offs_dv[None, :],
                     mask=in_keys[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
    allowed = (cols[None, :] <= q_pos[:, None]) & in_keys[None, :] & (rows < q_len)[:, None]
    return cols, in_keys, k_tile, v_tile, allowed, dot(q, tl.trans(k_tile), DOT)


@triton.jit
def _counted_logits(products, allowed, per_row, counted, n_rows, scale_log2, gate_scale):
    """A counting tile's base-2 logits (−inf where not allowed), gates, ⌊p⌋ and ⌈p⌉ (int32), p − ⌊p⌋, whether p
    was below P − 1, and Z[⌈p⌉] − Z[⌊p⌋]."""
    gates = tl.where(allowed, tl.sigmoid(products * gate_scale), 0.0)
    counts = counted[:, None] + tl.cumsum(gates, axis=1, reverse=True)
    below_top = counts < n_rows - 1
    counts = tl.minimum(counts, n_rows - 1.0)
    floor = tl.floor(counts)
    low, high = floor.to(tl.int32), tl.ceil(counts).to(tl.int32)
    fraction = counts - floor
    at_low = tl.gather(per_row, low, 1)
    rise = tl.gather(per_row, high, 1) - at_low
    s = tl.where(allowed, products * scale_log2 + (at_low + fraction * rise) * 1.4426950408889634, float("-inf"))
    return s, gates, low, high, fraction, below_top, rise


@triton.jit
def _filled_logits(products, allowed, per_row, offs_p, n_rows, scale_log2):
    """A tile past the counting: base-2 logits with every pair at Z[P − 1]."""
    last = tl.sum(tl.where(offs_p[None, :] == n_rows - 1, per_row, 0.0), 1)
    return tl.where(allowed, products * scale_log2 + last[:, None] * 1.4426950408889634, float("-inf"))


@triton.jit
def _forward(Q, K, V, TABLE, OUT, LSE, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ob, s_oh, s_ot,
             heads, group, q_len, k_len, n_rows, scale_log2, gate_scale, HEAD_DIM: tl.constexpr,
             VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_P: tl.constexpr,
             BLOCK: tl.constexpr, DOT: tl.constexpr):
    """OUT (B, H, Tq, Dv) and LSE (B·H, Tq), each row's base-2 log-sum-exp."""
    b, h, rows, q_pos, offs_d, offs_dv, offs_p, q, per_row, _, tiles = _query_tile(
        Q, TABLE, s_qb, s_qh, s_qt, heads, q_len, k_len, n_rows, HEAD_DIM, BLOCK_D, BLOCK_DV, BLOCK_P, BLOCK)
    K_, V_ = K + b * s_kb + (h // group) * s_kh, V + b * s_vb + (h // group) * s_vh
    m_i = tl.full([BLOCK], float("-inf"), tl.float32)
    sums = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_DV], tl.float32)
    counted = tl.zeros([BLOCK], tl.float32)
    for back in range(0, tiles):
        cols, in_keys, k_tile, v_tile, allowed, products = _key_tile(
            q, (tiles - 1 - back) * BLOCK, K_, V_, s_kt, s_vt, rows, q_pos, q_len, k_len, offs_d, offs_dv, HEAD_DIM,
            VALUE_DIM, BLOCK, DOT)
        if _counting(counted, rows, q_len, n_rows):
            s, gates, low, high, fraction, below_top, rise = _counted_logits(products, allowed, per_row, counted,
                                                                             n_rows, scale_log2, gate_scale)
            counted += tl.sum(gates, 1)
        else:
            s = _filled_logits(products, allowed, per_row, offs_p, n_rows, scale_log2)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # padding rows past Tq see no key
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        sums = sums * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot(p.to(v_tile.dtype), v_tile, DOT)
        m_i = m_new
    in_queries = rows < q_len
    out = acc / tl.where(in_queries, sums, 1.0)[:, None]
    tl.store(OUT + b * s_ob + h * s_oh + along(rows, s_ot)[:, None] + offs_dv[None, :], out.to(OUT.dtype.element_ty),
             mask=in_queries[:, None] & (offs_dv[None, :] < VALUE_DIM))
    tl.store(LSE + (b * heads + h) * q_len + rows, m_i + tl.math.log2(tl.where(in_queries, sums, 1.0)),
             mask=in_queries)


@triton.jit
def _softmax_grads(s, grad, v_tile, lse, delta, DOT: tl.constexpr):
    """(weights, ds): the tile's softmax weights and the gradient of its natural-unit logits."""
    p = tl.math.exp2(s - lse[:, None])
    return p, p * (dot(grad, tl.trans(v_tile), DOT) - delta[:, None])


@triton.jit
def _backward(Q, K, V, TABLE, DO, LSE, DELTA, DQ, DK, DV, DTABLE, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt,
              s_dob, s_doh, s_dot, s_dqb, s_dqh, s_dqt, s_dkb, s_dkh, s_dkt, s_dvb, s_dvh, s_dvt,
              heads, group, q_len, k_len, n_rows, scale, scale_log2, gate_scale, HEAD_DIM: tl.constexpr,
              VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_P: tl.constexpr,
              BLOCK: tl.constexpr, DOT: tl.constexpr):
    """DQ (B, H, Tq, Dh) in q's dtype; DK, DV and DTABLE (P, Dh) float32, added to."""
    b, h, rows, q_pos, offs_d, offs_dv, offs_p, q, per_row, table, tiles = _query_tile(
        Q, TABLE, s_qb, s_qh, s_qt, heads, q_len, k_len, n_rows, HEAD_DIM, BLOCK_D, BLOCK_DV, BLOCK_P, BLOCK)
    in_queries = rows < q_len
    grad = tl.load(DO + b * s_dob + h * s_doh + along(rows, s_dot)[:, None] + offs_dv[None, :],
                   mask=in_queries[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
    lse = tl.load(LSE + (b * heads + h) * q_len + rows, mask=in_queries, other=float("inf"))
    delta = tl.load(DELTA + (b * heads + h) * q_len + rows, mask=in_queries, other=0.0)
    kv_head = h // group
    K_, V_ = K + b * s_kb + kv_head * s_kh, V + b * s_vb + kv_head * s_vh
    DK_, DV_ = DK + b * s_dkb + kv_head * s_dkh, DV + b * s_dvb + kv_head * s_dvh
    # first walk: per row, Σ_j dP_ij over the counting tiles (the others' counts are clamped: dP = 0)
    counted = tl.zeros([BLOCK], tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    for back in range(0, tiles):
        if _counting(counted, rows, q_len, n_rows):
            cols, in_keys, k_tile, v_tile, allowed, products = _key_tile(
                q, (tiles - 1 - back) * BLOCK, K_, V_, s_kt, s_vt, rows, q_pos, q_len, k_len, offs_d, offs_dv,
                HEAD_DIM, VALUE_DIM, BLOCK, DOT)
            s, gates, low, high, fraction, below_top, rise = _counted_logits(products, allowed, per_row, counted,
                                                                             n_rows, scale_log2, gate_scale)
            _, ds = _softmax_grads(s, grad, v_tile, lse, delta, DOT)
            total += tl.sum(tl.where(below_top, ds * rise, 0.0), 1)
            counted += tl.sum(gates, 1)
    # second walk: every gradient
    dq = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    d_per_row = tl.zeros([BLOCK, BLOCK_P], tl.float32)
    counted = tl.zeros([BLOCK], tl.float32)
    later = tl.zeros([BLOCK], tl.float32)  # Σ dP over the keys after this tile
    for back in range(0, tiles):
        cols, in_keys, k_tile, v_tile, allowed, products = _key_tile(
            q, (tiles - 1 - back) * BLOCK, K_, V_, s_kt, s_vt, rows, q_pos, q_len, k_len, offs_d, offs_dv, HEAD_DIM,
            VALUE_DIM, BLOCK, DOT)
        if _counting(counted, rows, q_len, n_rows):
            s, gates, low, high, fraction, below_top, rise = _counted_logits(products, allowed, per_row, counted,
                                                                             n_rows, scale_log2, gate_scale)
            p, ds = _softmax_grads(s, grad, v_tile, lse, delta, DOT)
            d_count = tl.where(below_top, ds * rise, 0.0)  # dP_ij
            after = later[:, None] + tl.cumsum(d_count, axis=1, reverse=True) - d_count  # Σ_{j > t} dP_ij
            d_gates = tl.where(allowed, (total[:, None] - after) * gates * (1.0 - gates) * gate_scale, 0.0)
            d_logits = ds * scale + d_gates  # both reach q and k through q·k
            # ds onto Z's columns ⌊p⌋ and ⌈p⌉, over the columns the allowed pairs read (a masked pair counts 0, and
            # its ds is 0: on the diagonal they would start the loop at column 0)
            for column in range(tl.min(tl.where(allowed, low, n_rows - 1)), tl.max(tl.where(allowed, high, 0)) + 1):
                share = tl.where(low == column, 1.0 - fraction, 0.0) + tl.where(high == column, fraction, 0.0)
                d_per_row += tl.where(offs_p[None, :] == column, tl.sum(ds * share, 1)[:, None], 0.0)
            later += tl.sum(d_count, 1)
            counted += tl.sum(gates, 1)
        else:
            p, ds = _softmax_grads(_filled_logits(products, allowed, per_row, offs_p, n_rows, scale_log2), grad,
                                   v_tile, lse, delta, DOT)
            d_per_row += tl.where(offs_p[None, :] == n_rows - 1, tl.sum(ds, 1)[:, None], 0.0)
            d_logits = ds * scale
        dq += dot(d_logits.to(k_tile.dtype), k_tile, DOT)
        key_rows = in_keys[:, None]
        tl.atomic_add(DK_ + along(cols, s_dkt)[:, None] + offs_d[None, :], dot(tl.trans(d_logits.to(q.dtype)), q, DOT),
                      mask=key_rows & (offs_d[None, :] < HEAD_DIM))
        tl.atomic_add(DV_ + along(cols, s_dvt)[:, None] + offs_dv[None, :], dot(tl.trans(p.to(grad.dtype)), grad, DOT),
                      mask=key_rows & (offs_dv[None, :] < VALUE_DIM))
    dq += tl.dot(d_per_row, table, input_precision="ieee")
    tl.atomic_add(DTABLE + offs_p[:, None] * HEAD_DIM + offs_d[None, :],
                  tl.dot(tl.trans(d_per_row), q.to(tl.float32), input_precision="ieee"),
                  mask=(offs_p[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))
    tl.store(DQ + b * s_dqb + h * s_dqh + along(rows, s_dqt)[:, None] + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM))


def _sizes(q: Tensor, v: Tensor, rows: int) -> dict:
    """Compile-time sizes: 16 × 16 tiles under the interpreter, so a test at a few dozen tokens crosses tiles; on a
    GPU 64 × 64 with 4 warps, the tiles' backward size (``tiles_triton._blocks``), not yet timed for this kernel."""
    block, warps = (16, 1) if q.device.type == "cpu" else (64, 4)
    return dict(HEAD_DIM=q.shape[-1], VALUE_DIM=v.shape[-1], BLOCK_D=max(16, triton.next_power_of_2(q.shape[-1])),
                BLOCK_DV=max(16, triton.next_power_of_2(v.shape[-1])), BLOCK_P=max(16, triton.next_power_of_2(rows)),
                BLOCK=block, DOT=product_kind(q), num_warps=warps)


class _CountsAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, scale, gate_scale):
        q, k, v = (last_unit(x) for x in (q, k, v))
        table_ = table.to(torch.float32).contiguous()
        batch, heads, q_len, _ = q.shape
        out = q.new_empty(batch, q_len, heads, v.shape[-1], dtype=torch.float32).transpose(1, 2)
        lse = torch.empty(batch * heads, q_len, device=q.device, dtype=torch.float32)
        sizes = _sizes(q, v, table_.shape[0])
        _forward[(triton.cdiv(q_len, sizes["BLOCK"]) * batch * heads,)](
            q, k, v, table_, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], heads,
            heads // k.shape[1], q_len, k.shape[2], table_.shape[0], scale * LOG2E, gate_scale, **sizes)
        ctx.save_for_backward(q, k, v, table_, out, lse)
        ctx.scales, ctx.table_dtype = (scale, gate_scale), table.dtype
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, out, lse = ctx.saved_tensors
        scale, gate_scale = ctx.scales
        grad_out = last_unit(grad_out.to(q.dtype))
        batch, heads, q_len, _ = q.shape
        delta = (grad_out.float() * out.float()).sum(-1).contiguous()  # (B, H, Tq): Σ_d dout·out
        dq = torch.empty_like(q)
        dk, dv = (torch.zeros(x.shape, device=x.device, dtype=torch.float32) for x in (k, v))
        d_table = torch.zeros_like(table)
        sizes = _sizes(q, v, table.shape[0])
        _backward[(triton.cdiv(q_len, sizes["BLOCK"]) * batch * heads,)](
            q, k, v, table, grad_out, lse, delta, dq, dk, dv, d_table, *q.stride()[:3], *k.stride()[:3],
            *v.stride()[:3], *grad_out.stride()[:3], *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], heads,
            heads // k.shape[1], q_len, k.shape[2], table.shape[0], scale, scale * LOG2E, gate_scale, **sizes)
        return dq, dk.to(k.dtype), dv.to(v.dtype), d_table.to(ctx.table_dtype), None, None
