"""CoPE's attention inside Triton tiles, forward and backward (CUDA; CPU tensors under TRITON_INTERPRET=1): the GPU's
counterpart of ``gated_counts``, for a table of any size.

The logit of query i and key j is ``scale·q_i·k_j + lerp(Z_i[⌊p⌋], Z_i[⌈p⌉], p − ⌊p⌋)``, with Z_i[c] = q_i·e_c and
CoPE's count ``p_ij = min(Σ_{t=j..i} σ(gate_scale·q_i·k_t), P − 1)``. Each query tile walks its key tiles from the
diagonal back to key 0, carrying per row the gates counted so far; inside a tile a reverse cumulative sum gives each
key its count. The pairs of a tile read a few table rows, not all P: the tile computes Z over windows of W
consecutive rows, from the smallest ⌊p⌋ its allowed pairs read to the largest ⌈p⌉, each window from the next row
some pair reads (each row's counts within a tile span at most W + 2 rows; rows whose gates differ drift apart,
leaving rows between them that no pair reads). So Z never holds more than (W, W) numbers and P is unbounded (one row
per token: the tiny LM's CoPE). Once every row's count has reached P − 1 the earlier keys all read Z_i[P − 1],
computed once: those tiles are plain attention plus one number per row, with no gates.

The backward walks twice. The first walk, over the counting tiles only, sums per row dP_ij = ds_ij·(Z_i[⌈p⌉] −
Z_i[⌊p⌋]) (zero where the count is clamped). The second takes each gate's gradient from it, Σ_{j≤t} dP_ij = that
total − the sum over the later keys, which the walk carries; reduces ds onto each window's columns (two per pair, by
⌊p⌋ and ⌈p⌉, found by binary search over the keys, whose counts never rise: ``count_windows_triton``), which adds
dZ·e to dq and dZᵀ·q to the table's gradient (atomically, float32); and adds dk and dv atomically in float32, per
key/value head. The counts and gates are float32 whatever q's dtype, and so are Z and dZ (their products keep the
table's float32 digits, ``count_windows_triton``) and the output the backward reads (D_i = dO_i·out_i): from a bf16
output, bf16 gradients of q and k moved by 4e-2 of their largest magnitude, 6e-3 from a float32 one.

Positions: queries at Tk − Tq .. Tk − 1 and keys at 0 .. Tk − 1 (a training step, a prefill, a KV-cache step),
causal. Shapes: B batch, H query heads, Hkv key/value heads, Tq/Tk query/key lengths, Dh head width, Dv value width,
P table rows, W the window (the tile's size).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .count_windows_triton import looked_up, to_table
from .tiles_terms import along, dot, key_value_tiles, output_grads, program_tile, softmax_step
from .tiles_triton import (LOG2E, by_value_columns, check_own_positions, last_unit, offered_once_checked,
                           product_kind, widths)

#: whether a GPU has run this kernel's CUDA tests; until then ``forms`` offers it on a GPU only where
#: POSENC_COUNTS_TRITON=1 (``benchmarks/scripts/gpu.sh`` sets it)
CHECKED_ON_GPU = False
#: the widest heads and values (bf16/fp16, float32) whose tiles fit an H100's shared memory, compiled for sm_90:
#: float32 at 128 and any dtype at 256 did not fit (wider values run by blocks of columns: ``by_value_columns``)
WIDEST = (128, 64)


def offered(q: Tensor) -> bool:
    """Whether ``forms`` offers this kernel for q (``tiles_triton.offered_once_checked``), with a table of any size."""
    return offered_once_checked(q, CHECKED_ON_GPU, "POSENC_COUNTS_TRITON", WIDEST)


def counts_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, *, scale: float, gate_scale: float) -> Tensor:
    """Causal CoPE attention, queries at the last Tq key positions.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv), Tq ≤ Tk, H a multiple of Hkv; float16,
            bfloat16 or float32; v of any width (past ``WIDEST`` by blocks of columns).
        table: (P, Dh) float, CoPE's ``embeddings``, P ≥ 2.
        scale: the content logits' scale; gate_scale: the gates' (CoPE: 1/√Dh).
    Returns:
        (B, H, Tq, Dv) in q's dtype; gradients reach q, k, v and the table.
    """
    check_own_positions(q, k, v, WIDEST)
    width = q.shape[-1]
    if table.dim() != 2 or table.shape[0] < 2 or table.shape[1] != width:
        raise ValueError(f"table must be (P >= 2, Dh = {width}), got {tuple(table.shape)}")
    return by_value_columns(
        lambda columns: _CountsAttention.apply(q, k, columns, table, float(scale), float(gate_scale)), v, WIDEST)


@triton.jit
def _query_tile(Q, TABLE, s_qb, s_qh, s_qt, heads, q_len, k_len, n_rows, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr):
    """This program's query tile: (b, h, its rows, their key positions, offs_d, offs_dv, q (BLOCK, BLOCK_D), the
    table's last row e[P − 1] (BLOCK_D,) float32 and Z[P − 1] (BLOCK,) float32, the number of key tiles up to its
    last query's position)."""
    start_m, b, h = program_tile(q_len, heads, BLOCK)
    rows = start_m + tl.arange(0, BLOCK)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * s_qb + h * s_qh + along(rows, s_qt)[:, None] + offs_d[None, :],
                mask=(rows < q_len)[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    last_row = tl.load(TABLE + (n_rows - 1) * HEAD_DIM + offs_d, mask=offs_d < HEAD_DIM, other=0.0)
    at_last = tl.sum(q.to(tl.float32) * last_row[None, :], 1)
    tiles = tl.cdiv(tl.minimum(start_m + BLOCK + (k_len - q_len), k_len), BLOCK)
    return b, h, rows, rows + (k_len - q_len), offs_d, offs_dv, q, last_row, at_last, tiles


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
    in_keys, k_tile, v_tile = key_value_tiles(K, V, cols, k_len, s_kt, s_vt, offs_d, offs_dv, HEAD_DIM, VALUE_DIM)
    allowed = (cols[None, :] <= q_pos[:, None]) & in_keys[None, :] & (rows < q_len)[:, None]
    return cols, in_keys, k_tile, v_tile, allowed, dot(q, tl.trans(k_tile), DOT)


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def _tile_counts(products, allowed, counted, n_rows, gate_scale, ORDERED: tl.constexpr):
    """A counting tile's gates, ⌊p⌋ and ⌈p⌉ (int32), p − ⌊p⌋ and whether p was below P − 1; and the window
    bounds: the smallest ⌊p⌋ and the largest ⌈p⌉ of its allowed pairs. ``ORDERED``: counts never rise along the
    keys (each sums the gates from its key on), which a GPU's parallel sums can break by a rounding; the table's
    gradient (``count_windows_triton``) searches them, so in the backward each count is raised to the largest at a
    later key."""
    gates = tl.where(allowed, tl.sigmoid(products * gate_scale), 0.0)
    counts = counted[:, None] + tl.cumsum(gates, axis=1, reverse=True)
    if ORDERED:
        counts = tl.associative_scan(counts, 1, _larger, reverse=True)
    below_top = counts < n_rows - 1
    counts = tl.minimum(counts, n_rows - 1.0)
    floor = tl.floor(counts)
    low, high = floor.to(tl.int32), tl.ceil(counts).to(tl.int32)
    return gates, low, high, counts - floor, below_top, tl.min(tl.where(allowed, low, n_rows)), tl.max(
        tl.where(allowed, high, -1))


@triton.jit
def _counted_logits(products, allowed, at_low, fraction, rise, scale_log2):
    """A counting tile's base-2 logits, −inf where not allowed."""
    return tl.where(allowed, products * scale_log2 + (at_low + fraction * rise) * 1.4426950408889634, float("-inf"))


@triton.jit
def _filled_logits(products, allowed, at_last, scale_log2):
    """A tile past the counting: base-2 logits with every pair at Z[P − 1]."""
    return tl.where(allowed, products * scale_log2 + at_last[:, None] * 1.4426950408889634, float("-inf"))


@triton.jit
def _forward(Q, K, V, TABLE, OUT, LSE, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ob, s_oh, s_ot,
             heads, group, q_len, k_len, n_rows, scale_log2, gate_scale, HEAD_DIM: tl.constexpr,
             VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr,
             DOT: tl.constexpr):
    """OUT (B, H, Tq, Dv) and LSE (B·H, Tq), each row's base-2 log-sum-exp."""
    b, h, rows, q_pos, offs_d, offs_dv, q, last_row, at_last, tiles = _query_tile(
        Q, TABLE, s_qb, s_qh, s_qt, heads, q_len, k_len, n_rows, HEAD_DIM, BLOCK_D, BLOCK_DV, BLOCK)
    offs_w = tl.arange(0, BLOCK)
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
            gates, low, high, fraction, below_top, first, last = _tile_counts(products, allowed, counted, n_rows,
                                                                              gate_scale, False)
            at_low, rise = looked_up(q, TABLE, low, high, allowed, first, last, n_rows, offs_w, offs_d, HEAD_DIM,
                                     BLOCK, DOT)
            s = _counted_logits(products, allowed, at_low, fraction, rise, scale_log2)
            counted += tl.sum(gates, 1)
        else:
            s = _filled_logits(products, allowed, at_last, scale_log2)
        acc, m_i, sums, _ = softmax_step(acc, m_i, sums, s, v_tile, DOT)
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
def _counting_grads(q, products, allowed, counted, TABLE, grad, v_tile, lse, delta, n_rows, offs_w, offs_d,
                    scale_log2, gate_scale, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, DOT: tl.constexpr):
    """A counting tile in either walk of the backward, its counts in order (``_tile_counts``): (gates, ⌊p⌋, ⌈p⌉,
    p − ⌊p⌋, whether p < P − 1, the window bounds, Z[⌈p⌉] − Z[⌊p⌋], the softmax weights, ds)."""
    gates, low, high, fraction, below_top, first, last = _tile_counts(products, allowed, counted, n_rows, gate_scale,
                                                                      True)
    at_low, rise = looked_up(q, TABLE, low, high, allowed, first, last, n_rows, offs_w, offs_d, HEAD_DIM, BLOCK, DOT)
    p, ds = _softmax_grads(_counted_logits(products, allowed, at_low, fraction, rise, scale_log2), grad, v_tile, lse,
                           delta, DOT)
    return gates, low, high, fraction, below_top, first, last, rise, p, ds


@triton.jit
def _backward(Q, K, V, TABLE, DO, LSE, DELTA, DQ, DK, DV, DTABLE, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt,
              s_dob, s_doh, s_dot, s_dqb, s_dqh, s_dqt, s_dkb, s_dkh, s_dkt, s_dvb, s_dvh, s_dvt,
              heads, group, q_len, k_len, n_rows, scale, scale_log2, gate_scale, HEAD_DIM: tl.constexpr,
              VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr,
              DOT: tl.constexpr, LOG_BLOCK: tl.constexpr):
    """DQ (B, H, Tq, Dh) in q's dtype; DK, DV and DTABLE (P, Dh) float32, added to."""
    b, h, rows, q_pos, offs_d, offs_dv, q, last_row, at_last, tiles = _query_tile(
        Q, TABLE, s_qb, s_qh, s_qt, heads, q_len, k_len, n_rows, HEAD_DIM, BLOCK_D, BLOCK_DV, BLOCK)
    offs_w = tl.arange(0, BLOCK)
    in_queries, grad, lse, delta = output_grads(DO, LSE, DELTA, s_dob, s_doh, s_dot, b, h, heads, rows, q_len,
                                                offs_dv, VALUE_DIM)
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
            gates, _, _, _, below_top, _, _, rise, _, ds = _counting_grads(
                q, products, allowed, counted, TABLE, grad, v_tile, lse, delta, n_rows, offs_w, offs_d, scale_log2,
                gate_scale, HEAD_DIM, BLOCK, DOT)
            total += tl.sum(tl.where(below_top, ds * rise, 0.0), 1)
            counted += tl.sum(gates, 1)
    # second walk: every gradient
    dq = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    d_last = tl.zeros([BLOCK], tl.float32)  # Σ ds over the pairs at Z[P − 1] past the counting
    counted = tl.zeros([BLOCK], tl.float32)
    later = tl.zeros([BLOCK], tl.float32)  # Σ dP over the keys after this tile
    for back in range(0, tiles):
        cols, in_keys, k_tile, v_tile, allowed, products = _key_tile(
            q, (tiles - 1 - back) * BLOCK, K_, V_, s_kt, s_vt, rows, q_pos, q_len, k_len, offs_d, offs_dv, HEAD_DIM,
            VALUE_DIM, BLOCK, DOT)
        if _counting(counted, rows, q_len, n_rows):
            gates, low, high, fraction, below_top, first, last, rise, p, ds = _counting_grads(
                q, products, allowed, counted, TABLE, grad, v_tile, lse, delta, n_rows, offs_w, offs_d, scale_log2,
                gate_scale, HEAD_DIM, BLOCK, DOT)
            d_count = tl.where(below_top, ds * rise, 0.0)  # dP_ij
            after = later[:, None] + tl.cumsum(d_count, axis=1, reverse=True) - d_count  # Σ_{j > t} dP_ij
            d_gates = tl.where(allowed, (total[:, None] - after) * gates * (1.0 - gates) * gate_scale, 0.0)
            d_logits = ds * scale + d_gates  # both reach q and k through q·k
            dq = to_table(dq, ds, low, high, fraction, allowed, first, last, q, TABLE, DTABLE, n_rows, offs_w, offs_d,
                          HEAD_DIM, BLOCK, LOG_BLOCK, DOT)
            later += tl.sum(d_count, 1)
            counted += tl.sum(gates, 1)
        else:
            p, ds = _softmax_grads(_filled_logits(products, allowed, at_last, scale_log2), grad, v_tile, lse, delta,
                                   DOT)
            d_last += tl.sum(ds, 1)
            d_logits = ds * scale
        dq += dot(d_logits.to(k_tile.dtype), k_tile, DOT)
        key_rows = in_keys[:, None]
        tl.atomic_add(DK_ + along(cols, s_dkt)[:, None] + offs_d[None, :], dot(tl.trans(d_logits.to(q.dtype)), q, DOT),
                      mask=key_rows & (offs_d[None, :] < HEAD_DIM))
        tl.atomic_add(DV_ + along(cols, s_dvt)[:, None] + offs_dv[None, :], dot(tl.trans(p.to(grad.dtype)), grad, DOT),
                      mask=key_rows & (offs_dv[None, :] < VALUE_DIM))
    dq += d_last[:, None] * last_row[None, :]
    tl.atomic_add(DTABLE + (n_rows - 1) * HEAD_DIM + offs_d, tl.sum(d_last[:, None] * q.to(tl.float32), 0),
                  mask=offs_d < HEAD_DIM)
    tl.store(DQ + b * s_dqb + h * s_dqh + along(rows, s_dqt)[:, None] + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM))


def _sizes(q: Tensor, v: Tensor) -> dict:
    """Compile-time sizes: 16 × 16 tiles and windows under the interpreter, so a test at a few dozen tokens crosses
    tiles and windows; on a GPU 32 × 32 with 8 warps, not yet timed. Compiled for sm_90 by Triton 3.6
    (``benchmarks/scripts/sm90_tiles.py``; forward / backward, bytes of registers spilled per thread): 64 × 64
    tiles spilled 600 / 1,656 at bf16 width 64, 784 / 2,160 at 128 and 3,352 / 6,752 in float32 (with 4 warps:
    more); 32 × 32 spill 8 / 48, 120 / 376 and 8 / 936. One pipeline stage: Triton 3.6's pipeliner fails on the
    key tiles' loop, which holds the windows' loop, once it knows k's rows are 16-byte aligned, as on every GPU
    launch (3.9 compiles it)."""
    block, warps = (16, 1) if q.device.type == "cpu" else (32, 8)
    return dict(**widths(q, v.shape[-1]), BLOCK=block, DOT=product_kind(q), num_warps=warps, num_stages=1)


class _CountsAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, scale, gate_scale):
        q, k, v = (last_unit(x) for x in (q, k, v))
        table_ = table.to(torch.float32).contiguous()
        batch, heads, q_len, _ = q.shape
        out = q.new_empty(batch, q_len, heads, v.shape[-1], dtype=torch.float32).transpose(1, 2)
        lse = torch.empty(batch * heads, q_len, device=q.device, dtype=torch.float32)
        sizes = _sizes(q, v)
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
        sizes = _sizes(q, v)
        _backward[(triton.cdiv(q_len, sizes["BLOCK"]) * batch * heads,)](
            q, k, v, table, grad_out, lse, delta, dq, dk, dv, d_table, *q.stride()[:3], *k.stride()[:3],
            *v.stride()[:3], *grad_out.stride()[:3], *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3], heads,
            heads // k.shape[1], q_len, k.shape[2], table.shape[0], scale, scale * LOG2E, gate_scale,
            LOG_BLOCK=sizes["BLOCK"].bit_length() - 1, **sizes)
        return dq, dk.to(k.dtype), dv.to(v.dtype), d_table.to(ctx.table_dtype), None, None
