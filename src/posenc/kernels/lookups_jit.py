"""The Triton programs behind ``lookups_triton``: a forward (``forward``) and a backward (``backward``) over each
query tile's key tiles, with Transformer-XL's or Shaw's offset lookups inside each tile.

The logit of query i and key j is ``scale·(c_i·k_j + l_i·table[h, i − j])``, with c = q + content_shift and
l = q + lookup_shift per head (Transformer-XL's u and v; the table's row d is W_R r_d; Shaw: no shifts, and a table
of K rows, past which offsets add nothing); with value rows, each output also gains ``Σ_j p_ij values[h, i − j]``
and a floor (Shaw's value past the band) added as it is stored. A tile of BLOCK queries and BLOCK keys spans
2·BLOCK − 1 offsets, from ``base`` = its least offset: the program multiplies its l by those table rows, as two
(BLOCK, BLOCK) products (the window's lower and upper half), and gathers each pair's entry at window index
i − j + BLOCK − 1 (the paper's "relative shift" is that index); value rows go the other way, the weights scattered
into the window by the same index. Tiles whose offsets all lie past the table are plain attention. Nothing of size
Tq × Tk exists; memory is linear in T.

The backward walks each query tile's key tiles as the forward does. ds (the gradient of the logits over scale)
gives dc = ds·k; dk and dv are added atomically in float32, per key/value head, so grouped-query heads need no
repeated k or v. Gathered into the window, ds gives dl (= dP·window) and the table's gradient dPᵀ·l (the weights
give the value rows' the same way). Walking the keys upward moves the window down by BLOCK offsets, so a tile's
lower half is the next tile's upper half: the program carries it and adds each half to the gradient once it is
complete, one (BLOCK, Dh) atomic add per tile and table.

Pointer arguments named in capitals are tensors; ``s_*`` are strides.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles_terms import along, dot, key_value_tiles, output_grads, program_tile, softmax_step


@triton.jit
def _query_tile(Q, SHIFTS, s_qb, s_qh, s_qt, heads, q_len, k_len, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr):
    """This program's query tile: (b, h, its first row, its rows, their key positions, offs_d, offs_dv, c and l
    (BLOCK, BLOCK_D) in q's dtype, the number of key tiles up to its last query's position)."""
    start_m, b, h = program_tile(q_len, heads, BLOCK)
    rows = start_m + tl.arange(0, BLOCK)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    in_width = offs_d < HEAD_DIM
    q = tl.load(Q + b * s_qb + h * s_qh + along(rows, s_qt)[:, None] + offs_d[None, :],
                mask=(rows < q_len)[:, None] & in_width[None, :], other=0.0)
    content_shift = tl.load(SHIFTS + h * HEAD_DIM + offs_d, mask=in_width, other=0.0)
    lookup_shift = tl.load(SHIFTS + (heads + h) * HEAD_DIM + offs_d, mask=in_width, other=0.0)
    content = (q.to(tl.float32) + content_shift[None, :]).to(q.dtype)
    lookup = (q.to(tl.float32) + lookup_shift[None, :]).to(q.dtype)
    tiles = tl.cdiv(tl.minimum(start_m + BLOCK + (k_len - q_len), k_len), BLOCK)
    return b, h, start_m, rows, rows + (k_len - q_len), offs_d, offs_dv, content, lookup, tiles


@triton.jit
def _spans(start_m, shift, tiles, n_entries, BLOCK: tl.constexpr):
    """The first key tile whose offsets reach below N (the tiles before it read no table row), and the offset
    ``base`` of key tile 0."""
    base_0 = shift + start_m - (BLOCK - 1)  # tile t's least offset is base_0 − t·BLOCK
    past = tl.maximum(base_0 - n_entries, -1)  # integer division truncates: keep the numerator from below 0
    first_near = tl.minimum(tl.where(past >= 0, past // BLOCK + 1, 0), tiles)
    return first_near, base_0


@triton.jit
def _window_half(TABLE, s_tn, first, offs, n_entries, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """Table rows first .. first + BLOCK − 1 (BLOCK, len(offs)) float32, zeros outside 0 .. N − 1."""
    entries = first + tl.arange(0, BLOCK)
    inside = (entries >= 0) & (entries < n_entries)
    return tl.load(TABLE + along(entries, s_tn)[:, None] + offs[None, :],
                   mask=inside[:, None] & (offs[None, :] < WIDTH), other=0.0)


@triton.jit
def _add_half(DTABLE, s_tn, first, grad, offs, n_entries, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """Adds grad (BLOCK, len(offs)) to the table's gradient at rows first .. first + BLOCK − 1 inside the table."""
    entries = first + tl.arange(0, BLOCK)
    inside = (entries >= 0) & (entries < n_entries)
    tl.atomic_add(DTABLE + along(entries, s_tn)[:, None] + offs[None, :], grad,
                  mask=inside[:, None] & (offs[None, :] < WIDTH))


@triton.jit
def _pairs(from_lower, from_upper, BLOCK: tl.constexpr):
    """(BLOCK, BLOCK) pair values from a window's two (BLOCK, BLOCK) halves: pair (i, j) reads window index
    i − j + BLOCK − 1 (the paper's relative shift)."""
    offs = tl.arange(0, BLOCK)
    at = offs[:, None] - offs[None, :] + BLOCK - 1
    return tl.where(at < BLOCK, tl.gather(from_lower, tl.minimum(at, BLOCK - 1), 1),
                    tl.gather(from_upper, tl.maximum(at - BLOCK, 0), 1))


@triton.jit
def _halves(pairs, BLOCK: tl.constexpr):
    """The inverse of ``_pairs``: (BLOCK, BLOCK) pair values into the window's lower and upper halves, zeros where
    a row has no pair at that offset."""
    offs = tl.arange(0, BLOCK)
    key_of_lower = offs[:, None] - offs[None, :] + BLOCK - 1  # row i's key at the lower half's row r
    key_of_upper = offs[:, None] - offs[None, :] - 1  # ... and at the upper half's
    lower = tl.where(key_of_lower < BLOCK, tl.gather(pairs, tl.minimum(key_of_lower, BLOCK - 1), 1), 0.0)
    upper = tl.where(key_of_upper >= 0, tl.gather(pairs, tl.maximum(key_of_upper, 0), 1), 0.0)
    return lower, upper


@triton.jit
def _key_tile(content, lookup, start_n, base, K, V, s_kt, s_vt, TABLE, s_tn, rows, q_pos, q_len, k_len, n_entries,
              scale_log2, offs_d, offs_dv, HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK: tl.constexpr,
              LOOKUPS: tl.constexpr, DOT: tl.constexpr):
    """A query tile against the keys from ``start_n``, its offsets from ``base``: (keys, k (BLOCK, BLOCK_D),
    v (BLOCK, BLOCK_DV), the base-2 logits (−inf where not allowed)); ``LOOKUPS``: the tile reads table rows."""
    cols = start_n + tl.arange(0, BLOCK)
    in_keys, k_tile, v_tile = key_value_tiles(K, V, cols, k_len, s_kt, s_vt, offs_d, offs_dv, HEAD_DIM, VALUE_DIM)
    s = dot(content, tl.trans(k_tile), DOT)
    if LOOKUPS:
        lower = _window_half(TABLE, s_tn, base, offs_d, n_entries, HEAD_DIM, BLOCK).to(lookup.dtype)
        upper = _window_half(TABLE, s_tn, base + BLOCK, offs_d, n_entries, HEAD_DIM, BLOCK).to(lookup.dtype)
        s += _pairs(dot(lookup, tl.trans(lower), DOT), dot(lookup, tl.trans(upper), DOT), BLOCK)
    allowed = (cols[None, :] <= q_pos[:, None]) & in_keys[None, :] & (rows < q_len)[:, None]
    return cols, in_keys, k_tile, v_tile, tl.where(allowed, s * scale_log2, float("-inf"))


@triton.jit
def _forward_span(acc, m_i, sums, content, lookup, K, V, s_kt, s_vt, TABLE, s_tn, VALUES, s_vn, rows, q_pos, q_len,
                  k_len, n_entries, base_0, scale_log2, offs_d, offs_dv, start, end, HEAD_DIM: tl.constexpr,
                  VALUE_DIM: tl.constexpr, BLOCK: tl.constexpr, LOOKUPS: tl.constexpr, HAS_VALUES: tl.constexpr,
                  DOT: tl.constexpr):
    """The online softmax over key tiles start .. end − 1."""
    for tile in range(start, end):
        base = base_0 - tile * BLOCK
        cols, in_keys, k_tile, v_tile, s = _key_tile(
            content, lookup, tile * BLOCK, base, K, V, s_kt, s_vt, TABLE, s_tn, rows, q_pos, q_len, k_len,
            n_entries, scale_log2, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK, LOOKUPS, DOT)
        acc, m_i, sums, p = softmax_step(acc, m_i, sums, s, v_tile, DOT)
        if LOOKUPS and HAS_VALUES:
            p_lower, p_upper = _halves(p, BLOCK)
            lower = _window_half(VALUES, s_vn, base, offs_dv, n_entries, VALUE_DIM, BLOCK).to(v_tile.dtype)
            upper = _window_half(VALUES, s_vn, base + BLOCK, offs_dv, n_entries, VALUE_DIM, BLOCK).to(v_tile.dtype)
            acc += dot(p_lower.to(v_tile.dtype), lower, DOT) + dot(p_upper.to(v_tile.dtype), upper, DOT)
    return acc, m_i, sums


@triton.jit
def forward(Q, K, V, TABLE, VALUES, FLOOR, SHIFTS, OUT, LSE, s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_th,
             s_tn, s_vth, s_vn, s_ob, s_oh, s_ot, heads, group, q_len, k_len, n_entries, scale_log2,
             HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
             BLOCK: tl.constexpr, HAS_VALUES: tl.constexpr, DOT: tl.constexpr):
    """OUT (B, H, Tq, Dv), FLOOR (Dv,) added, and LSE (B·H, Tq), each row's base-2 log-sum-exp."""
    b, h, start_m, rows, q_pos, offs_d, offs_dv, content, lookup, tiles = _query_tile(
        Q, SHIFTS, s_qb, s_qh, s_qt, heads, q_len, k_len, HEAD_DIM, BLOCK_D, BLOCK_DV, BLOCK)
    K_, V_ = K + b * s_kb + (h // group) * s_kh, V + b * s_vb + (h // group) * s_vh
    TABLE_, VALUES_ = TABLE + h * s_th, VALUES + h * s_vth
    first_near, base_0 = _spans(start_m, k_len - q_len, tiles, n_entries, BLOCK)
    m_i = tl.full([BLOCK], float("-inf"), tl.float32)
    sums = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, BLOCK_DV], tl.float32)
    acc, m_i, sums = _forward_span(  # the key tiles past the table's offsets, then those that read it
        acc, m_i, sums, content, lookup, K_, V_, s_kt, s_vt, TABLE_, s_tn, VALUES_, s_vn, rows, q_pos, q_len, k_len,
        n_entries, base_0, scale_log2, offs_d, offs_dv, 0, first_near, HEAD_DIM, VALUE_DIM, BLOCK, False, HAS_VALUES,
        DOT)
    acc, m_i, sums = _forward_span(
        acc, m_i, sums, content, lookup, K_, V_, s_kt, s_vt, TABLE_, s_tn, VALUES_, s_vn, rows, q_pos, q_len, k_len,
        n_entries, base_0, scale_log2, offs_d, offs_dv, first_near, tiles, HEAD_DIM, VALUE_DIM, BLOCK, True,
        HAS_VALUES, DOT)
    in_queries = rows < q_len
    in_values = offs_dv < VALUE_DIM
    floor = tl.load(FLOOR + offs_dv, mask=in_values, other=0.0)
    out = acc / tl.where(in_queries, sums, 1.0)[:, None] + floor[None, :]
    tl.store(OUT + b * s_ob + h * s_oh + along(rows, s_ot)[:, None] + offs_dv[None, :], out.to(OUT.dtype.element_ty),
             mask=in_queries[:, None] & in_values[None, :])
    tl.store(LSE + (b * heads + h) * q_len + rows, m_i + tl.math.log2(tl.where(in_queries, sums, 1.0)),
             mask=in_queries)


@triton.jit
def _backward_span(d_content, d_lookup, carried, carried_values, content, lookup, grad, lse, delta, K, V, DK, DV,
                   TABLE, DTABLE, VALUES, DVALUES, s_kt, s_vt, s_dkt, s_dvt, s_tn, s_vn, rows, q_pos, q_len, k_len,
                   n_entries, base_0, scale, scale_log2, offs_d, offs_dv, start, end, HEAD_DIM: tl.constexpr,
                   VALUE_DIM: tl.constexpr, BLOCK: tl.constexpr, LOOKUPS: tl.constexpr, HAS_VALUES: tl.constexpr,
                   DOT: tl.constexpr):
    """The gradients over key tiles start .. end − 1: dc and dl kept, dk, dv and the tables' added (each table half
    once complete; ``carried``: the last tile's lower halves, the next tile's upper)."""
    for tile in range(start, end):
        base = base_0 - tile * BLOCK
        cols, in_keys, k_tile, v_tile, s = _key_tile(
            content, lookup, tile * BLOCK, base, K, V, s_kt, s_vt, TABLE, s_tn, rows, q_pos, q_len, k_len,
            n_entries, scale_log2, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK, LOOKUPS, DOT)
        p = tl.math.exp2(s - lse[:, None])
        dp = dot(grad, tl.trans(v_tile), DOT)
        if LOOKUPS and HAS_VALUES:
            lower = _window_half(VALUES, s_vn, base, offs_dv, n_entries, VALUE_DIM, BLOCK).to(grad.dtype)
            upper = _window_half(VALUES, s_vn, base + BLOCK, offs_dv, n_entries, VALUE_DIM, BLOCK).to(grad.dtype)
            dp += _pairs(dot(grad, tl.trans(lower), DOT), dot(grad, tl.trans(upper), DOT), BLOCK)
            p_lower, p_upper = _halves(p.to(grad.dtype), BLOCK)
            _add_half(DVALUES, s_vn, base + BLOCK, dot(tl.trans(p_upper), grad, DOT) + carried_values, offs_dv,
                      n_entries, VALUE_DIM, BLOCK)
            carried_values = dot(tl.trans(p_lower), grad, DOT)
        ds = p * (dp - delta[:, None])  # the logits' gradient over scale
        d_content += dot(ds.to(k_tile.dtype), k_tile, DOT)
        key_rows = in_keys[:, None]
        tl.atomic_add(DK + along(cols, s_dkt)[:, None] + offs_d[None, :],
                      dot(tl.trans(ds.to(content.dtype)), content, DOT) * scale,
                      mask=key_rows & (offs_d[None, :] < HEAD_DIM))
        tl.atomic_add(DV + along(cols, s_dvt)[:, None] + offs_dv[None, :], dot(tl.trans(p.to(grad.dtype)), grad, DOT),
                      mask=key_rows & (offs_dv[None, :] < VALUE_DIM))
        if LOOKUPS:
            lower = _window_half(TABLE, s_tn, base, offs_d, n_entries, HEAD_DIM, BLOCK).to(lookup.dtype)
            upper = _window_half(TABLE, s_tn, base + BLOCK, offs_d, n_entries, HEAD_DIM, BLOCK).to(lookup.dtype)
            d_lower, d_upper = _halves(ds.to(lookup.dtype), BLOCK)
            d_lookup += dot(d_lower, lower, DOT) + dot(d_upper, upper, DOT)
            _add_half(DTABLE, s_tn, base + BLOCK, (dot(tl.trans(d_upper), lookup, DOT) + carried) * scale, offs_d,
                      n_entries, HEAD_DIM, BLOCK)
            carried = dot(tl.trans(d_lower), lookup, DOT)
    return d_content, d_lookup, carried, carried_values


@triton.jit
def backward(Q, K, V, TABLE, VALUES, SHIFTS, DO, LSE, DELTA, DQ, DK, DV, DTABLE, DVALUES, DSHIFTS,
              s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_th, s_tn, s_vth, s_vn, s_dob, s_doh, s_dot,
              s_dqb, s_dqh, s_dqt, s_dkb, s_dkh, s_dkt, s_dvb, s_dvh, s_dvt,
              heads, group, q_len, k_len, n_entries, scale, scale_log2, HEAD_DIM: tl.constexpr,
              VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr,
              HAS_VALUES: tl.constexpr, DOT: tl.constexpr):
    """DQ (B, H, Tq, Dh) in q's dtype; DK, DV, DTABLE, DVALUES and DSHIFTS (2, H, Dh) float32, added to."""
    b, h, start_m, rows, q_pos, offs_d, offs_dv, content, lookup, tiles = _query_tile(
        Q, SHIFTS, s_qb, s_qh, s_qt, heads, q_len, k_len, HEAD_DIM, BLOCK_D, BLOCK_DV, BLOCK)
    in_queries, grad, lse, delta = output_grads(DO, LSE, DELTA, s_dob, s_doh, s_dot, b, h, heads, rows, q_len,
                                                offs_dv, VALUE_DIM)
    kv_head = h // group
    K_, V_ = K + b * s_kb + kv_head * s_kh, V + b * s_vb + kv_head * s_vh
    DK_, DV_ = DK + b * s_dkb + kv_head * s_dkh, DV + b * s_dvb + kv_head * s_dvh
    TABLE_, DTABLE_, VALUES_, DVALUES_ = TABLE + h * s_th, DTABLE + h * s_th, VALUES + h * s_vth, DVALUES + h * s_vth
    first_near, base_0 = _spans(start_m, k_len - q_len, tiles, n_entries, BLOCK)
    d_content = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    d_lookup = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    carried = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    carried_values = tl.zeros([BLOCK, BLOCK_DV], tl.float32)
    d_content, d_lookup, carried, carried_values = _backward_span(  # past the table's offsets, then the rest
        d_content, d_lookup, carried, carried_values, content, lookup, grad, lse, delta, K_, V_, DK_, DV_, TABLE_,
        DTABLE_, VALUES_, DVALUES_, s_kt, s_vt, s_dkt, s_dvt, s_tn, s_vn, rows, q_pos, q_len, k_len, n_entries,
        base_0, scale, scale_log2, offs_d, offs_dv, 0, first_near, HEAD_DIM, VALUE_DIM, BLOCK, False, HAS_VALUES,
        DOT)
    d_content, d_lookup, carried, carried_values = _backward_span(
        d_content, d_lookup, carried, carried_values, content, lookup, grad, lse, delta, K_, V_, DK_, DV_, TABLE_,
        DTABLE_, VALUES_, DVALUES_, s_kt, s_vt, s_dkt, s_dvt, s_tn, s_vn, rows, q_pos, q_len, k_len, n_entries,
        base_0, scale, scale_log2, offs_d, offs_dv, first_near, tiles, HEAD_DIM, VALUE_DIM, BLOCK, True, HAS_VALUES,
        DOT)
    last_base = base_0 - (tiles - 1) * BLOCK  # the diagonal tile reads offset 0: it always reads the table
    _add_half(DTABLE_, s_tn, last_base, carried * scale, offs_d, n_entries, HEAD_DIM, BLOCK)
    if HAS_VALUES:
        _add_half(DVALUES_, s_vn, last_base, carried_values, offs_dv, n_entries, VALUE_DIM, BLOCK)
    in_width = offs_d < HEAD_DIM
    tl.atomic_add(DSHIFTS + h * HEAD_DIM + offs_d, tl.sum(d_content, 0) * scale, mask=in_width)
    tl.atomic_add(DSHIFTS + (heads + h) * HEAD_DIM + offs_d, tl.sum(d_lookup, 0) * scale, mask=in_width)
    tl.store(DQ + b * s_dqb + h * s_dqh + along(rows, s_dqt)[:, None] + offs_d[None, :],
             ((d_content + d_lookup) * scale).to(DQ.dtype.element_ty), mask=in_queries[:, None] & in_width[None, :])
