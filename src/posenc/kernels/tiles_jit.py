"""The Triton programs behind ``tiles_triton``: a forward over key tiles, a key/value backward and a query backward,
the position terms formed inside each (BLOCK_M, BLOCK_N) tile of logits.

Logits are kept in base 2 (``scale_log2`` = scale · log2 e, each bias term times log2 e) so the softmax is exp2.
``BIAS`` picks the score bias of a pair at offset o = q_pos − k_pos:
  - TABLE: ``table[h, o − lowest]``; a tile whose entries all lie at or past ``flat_high`` (or at or before
    ``flat_low``), where every entry shares one value and one parameter (T5's last bucket), reads one scalar (in
    float32 it reads every pair's entry: the branch made ptxas spill) and adds one gradient sum;
  - LINEAR / LINEAR_ABS: ``a_h · o`` / ``a_h · |o|`` (ALiBi: a_h = −slope);
  - KERPLE_LOG / KERPLE_POWER: ``−r1_h · log(1 + r2_h·|o|)`` / ``−r1_h · |o|^r2_h``;
with ``params`` (H, 2) holding a_h or (r1_h, r2_h);
  - FIRE: its MLP of the interpolated distance x (``tiles_terms._fire_input``) as the linear segment x falls in
    (``kernels.fire_segments``: the table's row of this head holds the sorted kinks, slopes and intercepts); a tile
    visits only the kinks inside its range of x (far from the diagonal mostly none: one FMA per pair) and adds
    Σ ds and Σ ds · x per segment it spans; c's and L's gradients are added once per program.
Token values (FoX's c) add ``c_i − c_j``, each side taken relative to one float64 reference per program before it
is rounded to float32, so the float32 difference keeps its digits where it matters (near keys) however large c
grows.

Pointer arguments named in capitals are tensors; ``s_*`` are strides (0 broadcasts a batch of one).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles_terms import (add_diagonal_sums, add_fire_grads, along, dot, key_value_tiles, output_grads,
                          parameter_grads, program_tile, tile_logits)

NATIVE, IEEE, UPCAST = 0, 1, 2  # how ``tiles_terms.dot`` multiplies
NONE, TABLE, LINEAR, LINEAR_ABS, KERPLE_LOG, KERPLE_POWER, FIRE = 0, 1, 2, 3, 4, 5, 6  # BIAS


@triton.jit
def _key_tile(q, q_pos, q_side, reference, start_n, K, s_kt, KPOS, KVAL, table, params, n_entries, lowest,
              flat_low, flat_high, k_len, scale_log2, offs_d, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, MASKED: tl.constexpr, CONTIGUOUS: tl.constexpr, BIAS: tl.constexpr,
              HAS_TOKENS: tl.constexpr, DOT: tl.constexpr):
    """A query tile against the key tile from ``start_n``: (its keys, which lie within Tk, k (BLOCK_D, BLOCK_N),
    their positions, and ``tile_logits``' logits, entries and shared entry)."""
    cols = start_n + tl.arange(0, BLOCK_N)
    in_keys = cols < k_len
    k_tile = tl.load(K + along(cols, s_kt)[None, :] + offs_d[:, None],
                     mask=in_keys[None, :] & (offs_d[:, None] < HEAD_DIM), other=0.0)
    k_pos = cols if CONTIGUOUS else tl.load(KPOS + cols, mask=in_keys, other=0)
    k_side = (tl.load(KVAL + cols, mask=in_keys, other=0.0) - reference).to(tl.float32) if HAS_TOKENS else 0.0
    s, entry, shared = tile_logits(q, k_tile, q_pos, k_pos, cols, table, params, n_entries, lowest, flat_low,
                                   flat_high, q_side, k_side, k_len, scale_log2, CAUSAL, MASKED, BIAS, HAS_TOKENS,
                                   DOT)
    return cols, in_keys, k_tile, k_pos, s, entry, shared


@triton.jit
def _forward_span(acc, m_i, l_i, q, q_pos, q_side, reference, K, V, s_kt, s_vt, KPOS, KVAL, table, params,
                  n_entries, lowest, flat_low, flat_high, k_len, scale_log2, start, end, offs_d, offs_dv,
                  HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                  MASKED: tl.constexpr, CONTIGUOUS: tl.constexpr, BIAS: tl.constexpr, HAS_TOKENS: tl.constexpr,
                  DOT: tl.constexpr):
    """The online softmax over key tiles start, start + BLOCK_N, … < end. Its own lines, not
    ``tiles_terms.softmax_step``: that loads v before the weights, which changed 23 of these programs' registers
    for sm_90 with no GPU to time them."""
    for start_n in range(start, end, BLOCK_N):
        cols, in_keys, k_tile, k_pos, s, entry, shared = _key_tile(
            q, q_pos, q_side, reference, start_n, K, s_kt, KPOS, KVAL, table, params, n_entries, lowest, flat_low,
            flat_high, k_len, scale_log2, offs_d, HEAD_DIM, BLOCK_N, CAUSAL, MASKED, CONTIGUOUS, BIAS, HAS_TOKENS, DOT)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_tile = tl.load(V + along(cols, s_vt)[:, None] + offs_dv[None, :],
                         mask=in_keys[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(v_tile.dtype), v_tile, DOT)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _query_program(q_len, heads, group, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """What a program over one query tile of one (batch, head) works on: its first query, batch, head, key/value
    head, query rows and channel offsets."""
    start_m, b, h = program_tile(q_len, heads, BLOCK_M)
    return start_m, b, h, h // group, start_m + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)


@triton.jit
def _query_rows(Q, QPOS, QVAL, s_qt, start_m, offs_m, offs_d, q_len, shift, HEAD_DIM: tl.constexpr,
                CONTIGUOUS: tl.constexpr, HAS_TOKENS: tl.constexpr):
    """One query tile's q (BLOCK_M, BLOCK_D), positions, token values relative to the program's float64 reference,
    and the reference. Q, QPOS, QVAL point at this (batch, head)'s rows."""
    in_queries = offs_m < q_len
    q = tl.load(Q + along(offs_m, s_qt)[:, None] + offs_d[None, :],
                mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM),
                other=0.0)
    q_pos = offs_m + shift if CONTIGUOUS else tl.load(QPOS + offs_m, mask=in_queries, other=0)
    reference = tl.load(QVAL + tl.minimum(start_m, q_len - 1)) if HAS_TOKENS else 0.0
    q_side = (tl.load(QVAL + offs_m, mask=in_queries, other=0.0) - reference).to(tl.float32) if HAS_TOKENS else 0.0
    return q, q_pos, q_side, reference


@triton.jit
def _key_range(start_m, shift, k_len, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
               CONTIGUOUS: tl.constexpr):
    """(end, unmasked_end) of the key tiles a query tile visits: causally none past its last query; the tiles
    below unmasked_end hold only pairs that may attend (at explicit positions: none known)."""
    end = k_len
    unmasked_end = 0
    if CONTIGUOUS:
        if CAUSAL:
            end = tl.minimum(k_len, shift + start_m + BLOCK_M)
            unmasked_end = tl.maximum(0, (shift + start_m + 1) // BLOCK_N * BLOCK_N)
        else:
            unmasked_end = k_len // BLOCK_N * BLOCK_N
    return end, unmasked_end


@triton.jit
def forward(Q, K, V, OUT, LSE, TABLE, PARAMS, QPOS, KPOS, QVAL, KVAL,
            s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ob, s_oh, s_ot,
            s_table, s_qpb, s_kpb, s_qvb, s_qvh, s_kvb, s_kvh,
            heads, group, q_len, k_len, shift, lowest, n_entries, flat_low, flat_high, scale_log2,
            HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, CONTIGUOUS: tl.constexpr,
            BIAS: tl.constexpr, HAS_TOKENS: tl.constexpr, DOT: tl.constexpr):
    """OUT (B, H, Tq, Dv) and LSE (B·H, Tq), the base-2 log-sum-exp of each row (+inf for a row that sees no key)."""
    start_m, b, h, kv_head, offs_m, offs_d, offs_dv = _query_program(q_len, heads, group, BLOCK_M, BLOCK_D, BLOCK_DV)
    in_queries = offs_m < q_len
    q, q_pos, q_side, reference = _query_rows(Q + b * s_qb + h * s_qh, QPOS + b * s_qpb, QVAL + b * s_qvb + h * s_qvh,
                                              s_qt, start_m, offs_m, offs_d, q_len, shift, HEAD_DIM, CONTIGUOUS,
                                              HAS_TOKENS)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    end, unmasked_end = _key_range(start_m, shift, k_len, BLOCK_M, BLOCK_N, CAUSAL, CONTIGUOUS)
    K_, V_ = K + b * s_kb + kv_head * s_kh, V + b * s_vb + kv_head * s_vh
    KPOS_, KVAL_ = KPOS + b * s_kpb, KVAL + b * s_kvb + h * s_kvh
    TABLE_, PARAMS_ = TABLE + h * s_table, PARAMS + h * 2
    acc, m_i, l_i = _forward_span(acc, m_i, l_i, q, q_pos, q_side, reference, K_, V_, s_kt, s_vt, KPOS_, KVAL_,
                                  TABLE_, PARAMS_, n_entries, lowest, flat_low, flat_high, k_len, scale_log2, 0,
                                  unmasked_end, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK_N, CAUSAL, False,
                                  CONTIGUOUS, BIAS, HAS_TOKENS, DOT)
    acc, m_i, l_i = _forward_span(acc, m_i, l_i, q, q_pos, q_side, reference, K_, V_, s_kt, s_vt, KPOS_, KVAL_,
                                  TABLE_, PARAMS_, n_entries, lowest, flat_low, flat_high, k_len, scale_log2,
                                  unmasked_end, end, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK_N, CAUSAL, True,
                                  CONTIGUOUS, BIAS, HAS_TOKENS, DOT)
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    tl.store(OUT + b * s_ob + h * s_oh + along(offs_m, s_ot)[:, None] + offs_dv[None, :], out.to(OUT.dtype.element_ty),
             mask=in_queries[:, None] & (offs_dv[None, :] < VALUE_DIM))
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("inf"))  # +inf: every weight 0
    tl.store(LSE + (b * heads + h) * q_len + offs_m, lse, mask=in_queries)


@triton.jit
def _key_grads_span(dk, dv, d_values, k_tile, v_tile, k_pos, k_side, reference, cols, Q, DO, LSE, DELTA, QPOS,
                    QVAL, s_qt, s_dot, table, params, n_entries, lowest, flat_low, flat_high, q_len, k_len, shift,
                    scale_log2, start, end, offs_d, offs_dv,
                    HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr,
                    MASKED: tl.constexpr, CONTIGUOUS: tl.constexpr, BIAS: tl.constexpr, HAS_TOKENS: tl.constexpr,
                    TOKEN_GRAD: tl.constexpr, DOT: tl.constexpr):
    """dk, dv (and the keys' token-value gradient) over query tiles start, start + BLOCK_M, … < end. Unmasked
    tiles may hold keys past Tk: their rows of dk and dv are never stored. Query rows past Tq read lse = +inf, so
    their weights are 0. LSE, DELTA, QPOS, QVAL point at this (batch, head)'s rows."""
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        in_queries = rows < q_len
        q = tl.load(Q + along(rows, s_qt)[:, None] + offs_d[None, :],
                    mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        q_pos = rows + shift if CONTIGUOUS else tl.load(QPOS + rows, mask=in_queries, other=0)
        q_side = (tl.load(QVAL + rows, mask=in_queries, other=0.0) - reference).to(tl.float32) if HAS_TOKENS \
            else 0.0
        s, entry, shared = tile_logits(q, tl.trans(k_tile), q_pos, k_pos, cols, table, params, n_entries, lowest,
                                        flat_low, flat_high, q_side, k_side, k_len, scale_log2, CAUSAL, MASKED,
                                        BIAS, HAS_TOKENS, DOT)
        lse = tl.load(LSE + rows, mask=in_queries, other=float("inf"))
        p = tl.math.exp2(s - lse[:, None])  # (BLOCK_M, BLOCK_N); 0 where not allowed
        grad = tl.load(DO + along(rows, s_dot)[:, None] + offs_dv[None, :],
                       mask=in_queries[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
        dv += dot(tl.trans(p.to(grad.dtype)), grad, DOT)
        dp = dot(grad, tl.trans(v_tile), DOT)
        delta = tl.load(DELTA + rows, mask=in_queries, other=0.0)
        ds = p * (dp - delta[:, None])  # the gradient of the natural-unit logits
        dk += dot(tl.trans(ds.to(q.dtype)), q, DOT)
        if TOKEN_GRAD:
            d_values -= tl.sum(ds, 0)
    return dk, dv, d_values


@triton.jit
def backward_keys(Q, K, V, DO, LSE, DELTA, DK, DV, TABLE, PARAMS, QPOS, KPOS, QVAL, KVAL, DKVAL,
                  s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_dob, s_doh, s_dot,
                  s_dkb, s_dkh, s_dkt, s_dvb, s_dvh, s_dvt,
                  s_table, s_qpb, s_kpb, s_qvb, s_qvh, s_kvb, s_kvh,
                  heads, group, kv_heads, q_len, k_len, shift, lowest, n_entries, flat_low, flat_high, scale_log2,
                  scale, HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                  CONTIGUOUS: tl.constexpr, BIAS: tl.constexpr, HAS_TOKENS: tl.constexpr, TOKEN_GRAD: tl.constexpr,
                  DOT: tl.constexpr):
    """dk and dv of one key tile, summed over the query heads it serves (and −Σ_i ds, the keys' token values')."""
    start_n, b, kv_head = program_tile(k_len, kv_heads, BLOCK_N)
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_keys, k_tile, v_tile = key_value_tiles(K + b * s_kb + kv_head * s_kh, V + b * s_vb + kv_head * s_vh, cols,
                                              k_len, s_kt, s_vt, offs_d, offs_dv, HEAD_DIM, VALUE_DIM)
    k_pos = cols if CONTIGUOUS else tl.load(KPOS + b * s_kpb + cols, mask=in_keys, other=0)
    first = 0  # query tiles first .. unmasked_start − 1 may hold pairs that may not attend; the rest hold none
    unmasked_start = q_len
    if CONTIGUOUS:
        if CAUSAL:
            first = tl.maximum(0, start_n - shift) // BLOCK_M * BLOCK_M
            unmasked_start = tl.minimum(q_len, tl.cdiv(tl.maximum(0, start_n + BLOCK_N - 1 - shift), BLOCK_M)
                                        * BLOCK_M)
        else:
            unmasked_start = 0
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    for member in range(group):
        h = kv_head * group + member
        KVAL_ = KVAL + b * s_kvb + h * s_kvh
        reference = tl.load(KVAL_ + tl.minimum(start_n, k_len - 1)) if HAS_TOKENS else 0.0
        k_side = (tl.load(KVAL_ + cols, mask=in_keys, other=0.0) - reference).to(tl.float32) if HAS_TOKENS else 0.0
        d_values = tl.zeros([BLOCK_N], tl.float32)
        Q_, DO_ = Q + b * s_qb + h * s_qh, DO + b * s_dob + h * s_doh
        QVAL_, QPOS_ = QVAL + b * s_qvb + h * s_qvh, QPOS + b * s_qpb
        LSE_, DELTA_ = LSE + (b * heads + h) * q_len, DELTA + (b * heads + h) * q_len
        TABLE_, PARAMS_ = TABLE + h * s_table, PARAMS + h * 2
        dk, dv, d_values = _key_grads_span(
            dk, dv, d_values, k_tile, v_tile, k_pos, k_side, reference, cols, Q_, DO_, LSE_, DELTA_, QPOS_, QVAL_,
            s_qt, s_dot, TABLE_, PARAMS_, n_entries, lowest, flat_low, flat_high, q_len, k_len, shift, scale_log2,
            first, unmasked_start, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK_M, CAUSAL, True, CONTIGUOUS, BIAS,
            HAS_TOKENS, TOKEN_GRAD, DOT)
        dk, dv, d_values = _key_grads_span(
            dk, dv, d_values, k_tile, v_tile, k_pos, k_side, reference, cols, Q_, DO_, LSE_, DELTA_, QPOS_, QVAL_,
            s_qt, s_dot, TABLE_, PARAMS_, n_entries, lowest, flat_low, flat_high, q_len, k_len, shift, scale_log2,
            unmasked_start, q_len, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK_M, CAUSAL, False, CONTIGUOUS, BIAS,
            HAS_TOKENS, TOKEN_GRAD, DOT)
        if TOKEN_GRAD:
            tl.store(DKVAL + (b * heads + h) * k_len + cols, d_values, mask=in_keys)
    tl.store(DK + b * s_dkb + kv_head * s_dkh + along(cols, s_dkt)[:, None] + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=in_keys[:, None] & (offs_d[None, :] < HEAD_DIM))
    tl.store(DV + b * s_dvb + kv_head * s_dvh + along(cols, s_dvt)[:, None] + offs_dv[None, :],
             dv.to(DV.dtype.element_ty), mask=in_keys[:, None] & (offs_dv[None, :] < VALUE_DIM))


@triton.jit
def _query_grads_span(dq, d_values, low_rows, high_rows, first_rows, second_rows, q, grad, lse, delta, q_pos, q_side, reference, K, V,
                      KPOS, KVAL, s_kt, s_vt, table, dtable, params, n_entries, lowest, flat_low, flat_high, k_len,
                      shift, start_m, scale_log2, start, end, offs_d, offs_dv, HEAD_DIM: tl.constexpr,
                      VALUE_DIM: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr,
                      CONTIGUOUS: tl.constexpr, BIAS: tl.constexpr, TABLE_GRAD: tl.constexpr,
                      PARAM_GRAD: tl.constexpr, HAS_TOKENS: tl.constexpr, TOKEN_GRAD: tl.constexpr,
                      DOT: tl.constexpr):
    """dq (and the queries' token values', the table's and the parameters' gradients) over key tiles start,
    start + BLOCK, … < end. Per query row: ``low_rows`` and ``high_rows``, what the tiles that share entry flat_low
    (flat_high) add to it; ``first_rows`` and ``second_rows``, the two parameters' gradients (FIRE's c and L); the
    caller adds their sums to memory once per program."""
    for start_n in range(start, end, BLOCK):
        cols, in_keys, k_tile, k_pos, s, entry, shared = _key_tile(
            q, q_pos, q_side, reference, start_n, K, s_kt, KPOS, KVAL, table, params, n_entries, lowest, flat_low,
            flat_high, k_len, scale_log2, offs_d, HEAD_DIM, BLOCK, CAUSAL, MASKED, CONTIGUOUS, BIAS, HAS_TOKENS, DOT)
        v_tile = tl.load(V + along(cols, s_vt)[None, :] + offs_dv[:, None],
                         mask=in_keys[None, :] & (offs_dv[:, None] < VALUE_DIM), other=0.0)  # (BLOCK_DV, BLOCK)
        p = tl.math.exp2(s - lse[:, None])
        dp = dot(grad, v_tile, DOT)
        ds = p * (dp - delta[:, None])
        dq += dot(ds.to(k_tile.dtype), tl.trans(k_tile), DOT)
        if TOKEN_GRAD:
            d_values += tl.sum(ds, 1)
        if TABLE_GRAD and BIAS == 6:
            from_c, from_threshold = add_fire_grads(dtable, ds, q_pos, k_pos, table, n_entries)
            first_rows += from_c
            second_rows += from_threshold
        elif TABLE_GRAD:
            if shared >= 0:
                row_sums = tl.sum(ds, 1)
                low_rows += tl.where(shared == flat_low, row_sums, 0.0)
                high_rows += tl.where(shared == flat_low, 0.0, row_sums)
            elif CONTIGUOUS:
                add_diagonal_sums(dtable, ds, shift + start_m - start_n - lowest, n_entries, BLOCK)
            else:
                tl.atomic_add(dtable + entry, ds, mask=ds != 0.0)  # masked pairs and padding add nothing
        if PARAM_GRAD:
            first, second = parameter_grads(ds, q_pos, k_pos, params, BIAS)
            first_rows += first
            second_rows += second
    return dq, d_values, low_rows, high_rows, first_rows, second_rows


@triton.jit
def backward_queries(Q, K, V, DO, LSE, DELTA, DQ, TABLE, DTABLE, PARAMS, DPARAMS, QPOS, KPOS, QVAL, KVAL, DQVAL,
                     s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_dob, s_doh, s_dot,
                     s_dqb, s_dqh, s_dqt,
                     s_table, s_qpb, s_kpb, s_qvb, s_qvh, s_kvb, s_kvh,
                     heads, group, q_len, k_len, shift, lowest, n_entries, flat_low, flat_high, scale_log2, scale,
                     HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr, CONTIGUOUS: tl.constexpr,
                     BIAS: tl.constexpr, TABLE_GRAD: tl.constexpr, PARAM_GRAD: tl.constexpr,
                     HAS_TOKENS: tl.constexpr, TOKEN_GRAD: tl.constexpr, DOT: tl.constexpr):
    """dq of one query tile (and Σ_j ds for its token values, and the table's or parameters' gradients)."""
    start_m, b, h, kv_head, rows, offs_d, offs_dv = _query_program(q_len, heads, group, BLOCK, BLOCK_D, BLOCK_DV)
    q, q_pos, q_side, reference = _query_rows(Q + b * s_qb + h * s_qh, QPOS + b * s_qpb, QVAL + b * s_qvb + h * s_qvh,
                                              s_qt, start_m, rows, offs_d, q_len, shift, HEAD_DIM, CONTIGUOUS,
                                              HAS_TOKENS)
    in_queries, grad, lse, delta = output_grads(DO, LSE, DELTA, s_dob, s_doh, s_dot, b, h, heads, rows, q_len,
                                                offs_dv, VALUE_DIM)
    end, unmasked_end = _key_range(start_m, shift, k_len, BLOCK, BLOCK, CAUSAL, CONTIGUOUS)
    K_, V_ = K + b * s_kb + kv_head * s_kh, V + b * s_vb + kv_head * s_vh
    KPOS_, KVAL_ = KPOS + b * s_kpb, KVAL + b * s_kvb + h * s_kvh
    TABLE_, DTABLE_, PARAMS_ = TABLE + h * s_table, DTABLE + h * s_table, PARAMS + h * 2
    dq = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    d_values = tl.zeros([BLOCK], tl.float32)
    low_rows = tl.zeros([BLOCK], tl.float32)
    high_rows = tl.zeros([BLOCK], tl.float32)
    first_rows = tl.zeros([BLOCK], tl.float32)
    second_rows = tl.zeros([BLOCK], tl.float32)
    dq, d_values, low_rows, high_rows, first_rows, second_rows = _query_grads_span(
        dq, d_values, low_rows, high_rows, first_rows, second_rows, q, grad, lse, delta, q_pos, q_side, reference, K_, V_, KPOS_,
        KVAL_, s_kt, s_vt, TABLE_, DTABLE_, PARAMS_, n_entries, lowest, flat_low, flat_high, k_len, shift, start_m,
        scale_log2, 0, unmasked_end, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK, CAUSAL, False, CONTIGUOUS, BIAS,
        TABLE_GRAD, PARAM_GRAD, HAS_TOKENS, TOKEN_GRAD, DOT)
    dq, d_values, low_rows, high_rows, first_rows, second_rows = _query_grads_span(
        dq, d_values, low_rows, high_rows, first_rows, second_rows, q, grad, lse, delta, q_pos, q_side, reference, K_, V_, KPOS_,
        KVAL_, s_kt, s_vt, TABLE_, DTABLE_, PARAMS_, n_entries, lowest, flat_low, flat_high, k_len, shift, start_m,
        scale_log2, unmasked_end, end, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK, CAUSAL, True, CONTIGUOUS, BIAS,
        TABLE_GRAD, PARAM_GRAD, HAS_TOKENS, TOKEN_GRAD, DOT)
    tl.store(DQ + b * s_dqb + h * s_dqh + along(rows, s_dqt)[:, None] + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM))
    if TOKEN_GRAD:
        tl.store(DQVAL + (b * heads + h) * q_len + rows, d_values, mask=in_queries)
    if TABLE_GRAD:
        tl.atomic_add(DTABLE_ + tl.maximum(flat_low, 0), tl.sum(low_rows), mask=flat_low >= 0)
        tl.atomic_add(DTABLE_ + tl.minimum(flat_high, n_entries - 1), tl.sum(high_rows), mask=flat_high < n_entries)
    if TABLE_GRAD and BIAS == 6:  # FIRE's c and L
        tl.atomic_add(DTABLE_ + n_entries - 2, tl.sum(first_rows))
        tl.atomic_add(DTABLE_ + n_entries - 1, tl.sum(second_rows))
    if PARAM_GRAD:
        tl.atomic_add(DPARAMS + h * 2, tl.sum(first_rows))
        tl.atomic_add(DPARAMS + h * 2 + 1, tl.sum(second_rows))
