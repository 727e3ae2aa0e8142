"""Attention with the score bias inside its Triton tiles, forward and backward (CUDA; CPU under TRITON_INTERPRET=1).

The flash-attention scheme (an online softmax over key tiles; the backward recomputes each tile's weights from one
log-sum-exp per row), with two position terms formed per tile from O(T) inputs, never a (B, H, Tq, Tk) tensor:

- an **offset table**: ``bias[b, h, i, j] = table[h, q_pos_i − k_pos_j − lowest]`` (ALiBi, Sandwich, Kerple, T5 and
  FIRE below its threshold, as ``PositionalEncoding.offset_table`` gives them). Its gradient is reduced per table
  entry inside the backward: at contiguous positions a tile's offsets are constant along its diagonals, so each
  tile adds its diagonal sums (two gathers, 2·BLOCK atomic adds); at explicit positions each pair adds its own.
  Autograd then carries the (H, N) gradient into the encoding's parameters.
- **token values**: ``c[b, h, q_i] − c[b, h, k_j]`` (FoX's cumulative log forget gates), the difference formed in
  float64 per pair, its gradient two row/column sums.

Masks: causal (``k_pos <= q_pos``), at contiguous positions (queries the last Tq of keys 0..Tk−1: a training step,
a prefill, a KV-cache step) with the tiles above the diagonal skipped, or at explicit positions (B or 1, T) with
every tile visited. Grouped-query attention reads each key/value head for its H/Hkv query heads; the key/value
backward loops over the group, so no repeated k or v exists. Products accumulate in float32 (``ieee`` for float32
inputs: no TF32); the bias, softmax and token differences are float32/float64 whatever the inputs' dtype. A row
with no allowed key returns zeros.

Shapes: B batch, H query heads, Hkv key/value heads, Tq/Tk query/key lengths, Dh head width, Dv value width, N
table entries.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e): the kernels work in base 2
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


NATIVE, IEEE, UPCAST = 0, 1, 2  # how ``_dot`` multiplies: see ``_Terms.flags``


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    """a @ b accumulated in float32: tensor cores in the inputs' dtype (NATIVE), exact float32 products for float32
    inputs (IEEE: no TF32), or both operands widened to float32 first (UPCAST: the interpreter, whose products of
    bfloat16 tiles are wrong in Triton 3.9; the operands were already rounded to bfloat16)."""
    if DOT == 2:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif DOT == 1:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _tile_logits(q, k_tile, q_pos, k_pos, cols, table, n_entries, lowest, q_values, k_values, k_len, scale_log2,
                 CAUSAL: tl.constexpr, MASKED: tl.constexpr, HAS_TABLE: tl.constexpr, HAS_TOKENS: tl.constexpr,
                 DOT: tl.constexpr):
    """One tile's logits in base 2, (BLOCK_M, BLOCK_N) float32, −inf where a pair may not attend (``MASKED``: the
    tile may hold such pairs), and the table index of each pair."""
    s = _dot(q, k_tile, DOT) * scale_log2
    entry = q_pos[:, None] - k_pos[None, :] - lowest
    if HAS_TABLE:
        entry = tl.minimum(tl.maximum(entry, 0), n_entries - 1)  # a masked pair may lie outside the table
        s += tl.load(table + entry).to(tl.float32) * 1.4426950408889634
    if HAS_TOKENS:
        s += (q_values[:, None] - k_values[None, :]).to(tl.float32) * 1.4426950408889634
    if MASKED:
        allowed = cols[None, :] < k_len
        if CAUSAL:
            allowed &= k_pos[None, :] <= q_pos[:, None]
        s = tl.where(allowed, s, float("-inf"))
    return s, entry


@triton.jit
def _forward_span(acc, m_i, l_i, q, q_pos, q_values, K, V, k_row, v_row, KPOS, k_pos_row, k_tokens, table,
                  n_entries, lowest, k_len, scale_log2, start, end, offs_n, offs_d, offs_dv,
                  HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                  MASKED: tl.constexpr, CONTIGUOUS: tl.constexpr, HAS_TABLE: tl.constexpr,
                  HAS_TOKENS: tl.constexpr, DOT: tl.constexpr):
    """The online softmax over key tiles start, start + BLOCK_N, … < end."""
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        in_keys = cols < k_len
        k_tile = tl.load(K + cols[None, :] * k_row + offs_d[:, None],
                         mask=in_keys[None, :] & (offs_d[:, None] < HEAD_DIM), other=0.0)
        if CONTIGUOUS:
            k_pos = cols
        else:
            k_pos = tl.load(KPOS + k_pos_row + cols, mask=in_keys, other=0)
        k_values = tl.load(k_tokens + cols, mask=in_keys, other=0.0) if HAS_TOKENS else 0.0
        s, entry = _tile_logits(q, k_tile, q_pos, k_pos, cols, table, n_entries, lowest, q_values, k_values, k_len,
                                scale_log2, CAUSAL, MASKED, HAS_TABLE, HAS_TOKENS, DOT)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_tile = tl.load(V + cols[:, None] * v_row + offs_dv[None, :],
                         mask=in_keys[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v_tile.dtype), v_tile, DOT)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _forward(Q, K, V, OUT, LSE, TABLE, QPOS, KPOS, QVAL, KVAL,
             s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_ob, s_oh, s_ot,
             s_table, s_qpb, s_kpb, s_qvb, s_qvh, s_kvb, s_kvh,
             heads, group, q_len, k_len, shift, lowest, n_entries, scale_log2,
             HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, CONTIGUOUS: tl.constexpr,
             HAS_TABLE: tl.constexpr, HAS_TOKENS: tl.constexpr, DOT: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    b = tl.program_id(1) // heads
    h = tl.program_id(1) % heads
    kv_head = h // group
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_queries = offs_m < q_len
    q = tl.load(Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qt + offs_d[None, :],
                mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    if CONTIGUOUS:
        q_pos = offs_m + shift
    else:
        q_pos = tl.load(QPOS + b * s_qpb + offs_m, mask=in_queries, other=0)
    q_values = tl.load(QVAL + b * s_qvb + h * s_qvh + offs_m, mask=in_queries, other=0.0) if HAS_TOKENS else 0.0
    table = TABLE + h * s_table
    k_tokens = KVAL + b * s_kvb + h * s_kvh
    K_ = K + b * s_kb + kv_head * s_kh
    V_ = V + b * s_vb + kv_head * s_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    end = k_len
    unmasked_end = 0
    if CONTIGUOUS:
        if CAUSAL:
            end = tl.minimum(k_len, shift + start_m + BLOCK_M)
            unmasked_end = tl.maximum(0, (shift + start_m + 1) // BLOCK_N * BLOCK_N)  # tiles wholly at or below
        else:
            unmasked_end = k_len // BLOCK_N * BLOCK_N
    acc, m_i, l_i = _forward_span(acc, m_i, l_i, q, q_pos, q_values, K_, V_, s_kt, s_vt, KPOS, b * s_kpb, k_tokens,
                                  table, n_entries, lowest, k_len, scale_log2, 0, unmasked_end, offs_n, offs_d,
                                  offs_dv, HEAD_DIM, VALUE_DIM, BLOCK_N, CAUSAL, False, CONTIGUOUS, HAS_TABLE,
                                  HAS_TOKENS, DOT)
    acc, m_i, l_i = _forward_span(acc, m_i, l_i, q, q_pos, q_values, K_, V_, s_kt, s_vt, KPOS, b * s_kpb, k_tokens,
                                  table, n_entries, lowest, k_len, scale_log2, unmasked_end, end, offs_n, offs_d,
                                  offs_dv, HEAD_DIM, VALUE_DIM, BLOCK_N, CAUSAL, True, CONTIGUOUS, HAS_TABLE,
                                  HAS_TOKENS, DOT)
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    tl.store(OUT + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_dv[None, :], out.to(OUT.dtype.element_ty),
             mask=in_queries[:, None] & (offs_dv[None, :] < VALUE_DIM))
    lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("inf"))  # +inf: every weight 0
    tl.store(LSE + tl.program_id(1) * q_len + offs_m, lse, mask=in_queries)


@triton.jit
def _key_grads_span(dk, dv, d_values, k_tile, v_tile, k_pos, k_values, cols, Q, DO, LSE, DELTA, QPOS, QVAL,
                    s_qt, s_dot, q_pos_row, lse_row, table, n_entries, lowest, q_len, k_len, shift, scale_log2,
                    start, end, offs_d, offs_dv,
                    HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr,
                    MASKED: tl.constexpr, CONTIGUOUS: tl.constexpr, HAS_TABLE: tl.constexpr,
                    HAS_TOKENS: tl.constexpr, TOKEN_GRAD: tl.constexpr, DOT: tl.constexpr):
    """dk, dv (and the keys' token-value gradient) over query tiles start, start + BLOCK_M, … < end. Unmasked
    (``MASKED`` False) tiles may hold keys past Tk: their rows of dk and dv are never stored. Query rows past Tq
    read lse = +inf, so their weights are 0."""
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        in_queries = rows < q_len
        q = tl.load(Q + rows[:, None] * s_qt + offs_d[None, :],
                    mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
        if CONTIGUOUS:
            q_pos = rows + shift
        else:
            q_pos = tl.load(QPOS + q_pos_row + rows, mask=in_queries, other=0)
        q_values = tl.load(QVAL + rows, mask=in_queries, other=0.0) if HAS_TOKENS else 0.0
        s, entry = _tile_logits(q, tl.trans(k_tile), q_pos, k_pos, cols, table, n_entries, lowest, q_values,
                                k_values, k_len, scale_log2, CAUSAL, MASKED, HAS_TABLE, HAS_TOKENS, DOT)
        lse = tl.load(LSE + lse_row + rows, mask=in_queries, other=float("inf"))
        p = tl.math.exp2(s - lse[:, None])  # (BLOCK_M, BLOCK_N); 0 where not allowed
        grad = tl.load(DO + rows[:, None] * s_dot + offs_dv[None, :],
                       mask=in_queries[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
        dv += _dot(tl.trans(p.to(grad.dtype)), grad, DOT)
        dp = _dot(grad, tl.trans(v_tile), DOT)
        delta = tl.load(DELTA + lse_row + rows, mask=in_queries, other=0.0)
        ds = p * (dp - delta[:, None])  # the gradient of the natural-unit logits
        dk += _dot(tl.trans(ds.to(q.dtype)), q, DOT)
        if TOKEN_GRAD:
            d_values -= tl.sum(ds, 0)
    return dk, dv, d_values


@triton.jit
def _backward_keys(Q, K, V, DO, LSE, DELTA, DK, DV, TABLE, QPOS, KPOS, QVAL, KVAL, DKVAL,
                   s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_dob, s_doh, s_dot,
                   s_dkb, s_dkh, s_dkt, s_dvb, s_dvh, s_dvt,
                   s_table, s_qpb, s_kpb, s_qvb, s_qvh, s_kvb, s_kvh,
                   heads, group, kv_heads, q_len, k_len, shift, lowest, n_entries, scale_log2, scale,
                   HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, CONTIGUOUS: tl.constexpr,
                   HAS_TABLE: tl.constexpr, HAS_TOKENS: tl.constexpr, TOKEN_GRAD: tl.constexpr,
                   DOT: tl.constexpr):
    """dk and dv of one key tile, summed over the query heads it serves (and −Σ_i ds for the keys' token values)."""
    start_n = tl.program_id(0) * BLOCK_N
    b = tl.program_id(1) // kv_heads
    kv_head = tl.program_id(1) % kv_heads
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_keys = cols < k_len
    k_tile = tl.load(K + b * s_kb + kv_head * s_kh + cols[:, None] * s_kt + offs_d[None, :],
                     mask=in_keys[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)  # (BLOCK_N, BLOCK_D)
    v_tile = tl.load(V + b * s_vb + kv_head * s_vh + cols[:, None] * s_vt + offs_dv[None, :],
                     mask=in_keys[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)  # (BLOCK_N, BLOCK_DV)
    if CONTIGUOUS:
        k_pos = cols
    else:
        k_pos = tl.load(KPOS + b * s_kpb + cols, mask=in_keys, other=0)
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
        k_values = tl.load(KVAL + b * s_kvb + h * s_kvh + cols, mask=in_keys, other=0.0) if HAS_TOKENS else 0.0
        d_values = tl.zeros([BLOCK_N], tl.float32)
        Q_ = Q + b * s_qb + h * s_qh
        DO_ = DO + b * s_dob + h * s_doh
        QVAL_ = QVAL + b * s_qvb + h * s_qvh
        lse_row = (b * heads + h) * q_len
        dk, dv, d_values = _key_grads_span(
            dk, dv, d_values, k_tile, v_tile, k_pos, k_values, cols, Q_, DO_, LSE, DELTA, QPOS, QVAL_, s_qt, s_dot,
            b * s_qpb, lse_row, TABLE + h * s_table, n_entries, lowest, q_len, k_len, shift, scale_log2, first,
            unmasked_start, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK_M, CAUSAL, True, CONTIGUOUS, HAS_TABLE,
            HAS_TOKENS, TOKEN_GRAD, DOT)
        dk, dv, d_values = _key_grads_span(
            dk, dv, d_values, k_tile, v_tile, k_pos, k_values, cols, Q_, DO_, LSE, DELTA, QPOS, QVAL_, s_qt, s_dot,
            b * s_qpb, lse_row, TABLE + h * s_table, n_entries, lowest, q_len, k_len, shift, scale_log2,
            unmasked_start, q_len, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK_M, CAUSAL, False, CONTIGUOUS,
            HAS_TABLE, HAS_TOKENS, TOKEN_GRAD, DOT)
        if TOKEN_GRAD:
            tl.store(DKVAL + (b * heads + h) * k_len + cols, d_values, mask=in_keys)
    tl.store(DK + b * s_dkb + kv_head * s_dkh + cols[:, None] * s_dkt + offs_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=in_keys[:, None] & (offs_d[None, :] < HEAD_DIM))
    tl.store(DV + b * s_dvb + kv_head * s_dvh + cols[:, None] * s_dvt + offs_dv[None, :],
             dv.to(DV.dtype.element_ty), mask=in_keys[:, None] & (offs_dv[None, :] < VALUE_DIM))


@triton.jit
def _add_diagonal_sums(DTABLE, ds, base, n_entries, BLOCK: tl.constexpr):
    """Add a square tile's diagonal sums to the table gradient: pair (i, j) reads entry base + i − j."""
    i = tl.arange(0, BLOCK)[:, None]
    t = tl.arange(0, BLOCK)[None, :]
    below = i - t  # column of the pair on diagonal i − j = t
    lower = tl.gather(ds, tl.maximum(below, 0), 1)
    lower_sums = tl.sum(tl.where(below >= 0, lower, 0.0), 0)
    above = i + t  # column of the pair on diagonal i − j = −t
    upper = tl.gather(ds, tl.minimum(above, BLOCK - 1), 1)
    upper_sums = tl.sum(tl.where((above < BLOCK) & (t >= 1), upper, 0.0), 0)
    step = tl.arange(0, BLOCK)
    tl.atomic_add(DTABLE + base + step, lower_sums, mask=(base + step >= 0) & (base + step < n_entries))
    tl.atomic_add(DTABLE + base - step, upper_sums,
                  mask=(step >= 1) & (base - step >= 0) & (base - step < n_entries))


@triton.jit
def _query_grads_span(dq, d_values, q, grad, lse, delta, q_pos, q_values, K, V, KPOS, k_pos_row, KVAL, s_kt, s_vt,
                      table, dtable, n_entries, lowest, k_len, shift, start_m, scale_log2, start, end, offs_d,
                      offs_dv, HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK: tl.constexpr,
                      CAUSAL: tl.constexpr, MASKED: tl.constexpr, CONTIGUOUS: tl.constexpr,
                      HAS_TABLE: tl.constexpr, TABLE_GRAD: tl.constexpr, HAS_TOKENS: tl.constexpr,
                      TOKEN_GRAD: tl.constexpr, DOT: tl.constexpr):
    """dq (and the queries' token-value and the table's gradients) over key tiles start, start + BLOCK, … < end."""
    for start_n in range(start, end, BLOCK):
        cols = start_n + tl.arange(0, BLOCK)
        in_keys = cols < k_len
        k_tile = tl.load(K + cols[None, :] * s_kt + offs_d[:, None],
                         mask=in_keys[None, :] & (offs_d[:, None] < HEAD_DIM), other=0.0)  # (BLOCK_D, BLOCK)
        v_tile = tl.load(V + cols[None, :] * s_vt + offs_dv[:, None],
                         mask=in_keys[None, :] & (offs_dv[:, None] < VALUE_DIM), other=0.0)  # (BLOCK_DV, BLOCK)
        if CONTIGUOUS:
            k_pos = cols
        else:
            k_pos = tl.load(KPOS + k_pos_row + cols, mask=in_keys, other=0)
        k_values = tl.load(KVAL + cols, mask=in_keys, other=0.0) if HAS_TOKENS else 0.0
        s, entry = _tile_logits(q, k_tile, q_pos, k_pos, cols, table, n_entries, lowest, q_values, k_values, k_len,
                                scale_log2, CAUSAL, MASKED, HAS_TABLE, HAS_TOKENS, DOT)
        p = tl.math.exp2(s - lse[:, None])
        dp = _dot(grad, v_tile, DOT)
        ds = p * (dp - delta[:, None])
        dq += _dot(ds.to(k_tile.dtype), tl.trans(k_tile), DOT)
        if TOKEN_GRAD:
            d_values += tl.sum(ds, 1)
        if TABLE_GRAD:
            if CONTIGUOUS:
                _add_diagonal_sums(dtable, ds, shift + start_m - start_n - lowest, n_entries, BLOCK)
            else:
                tl.atomic_add(dtable + entry, ds, mask=ds != 0.0)  # masked pairs and padding add nothing
    return dq, d_values


@triton.jit
def _backward_queries(Q, K, V, DO, LSE, DELTA, DQ, TABLE, DTABLE, QPOS, KPOS, QVAL, KVAL, DQVAL,
                      s_qb, s_qh, s_qt, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt, s_dob, s_doh, s_dot,
                      s_dqb, s_dqh, s_dqt,
                      s_table, s_qpb, s_kpb, s_qvb, s_qvh, s_kvb, s_kvh,
                      heads, group, q_len, k_len, shift, lowest, n_entries, scale_log2, scale,
                      HEAD_DIM: tl.constexpr, VALUE_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_DV: tl.constexpr, BLOCK: tl.constexpr, CAUSAL: tl.constexpr,
                      CONTIGUOUS: tl.constexpr, HAS_TABLE: tl.constexpr, TABLE_GRAD: tl.constexpr,
                      HAS_TOKENS: tl.constexpr, TOKEN_GRAD: tl.constexpr, DOT: tl.constexpr):
    """dq of one query tile (and Σ_j ds for its token values, and the table's gradient)."""
    start_m = tl.program_id(0) * BLOCK
    b = tl.program_id(1) // heads
    h = tl.program_id(1) % heads
    kv_head = h // group
    rows = start_m + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_queries = rows < q_len
    q = tl.load(Q + b * s_qb + h * s_qh + rows[:, None] * s_qt + offs_d[None, :],
                mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    grad = tl.load(DO + b * s_dob + h * s_doh + rows[:, None] * s_dot + offs_dv[None, :],
                   mask=in_queries[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
    row = (b * heads + h) * q_len + rows
    lse = tl.load(LSE + row, mask=in_queries, other=float("inf"))
    delta = tl.load(DELTA + row, mask=in_queries, other=0.0)
    if CONTIGUOUS:
        q_pos = rows + shift
    else:
        q_pos = tl.load(QPOS + b * s_qpb + rows, mask=in_queries, other=0)
    q_values = tl.load(QVAL + b * s_qvb + h * s_qvh + rows, mask=in_queries, other=0.0) if HAS_TOKENS else 0.0
    end = k_len
    unmasked_end = 0  # key tiles 0 .. unmasked_end − 1 hold only pairs that may attend
    if CONTIGUOUS:
        if CAUSAL:
            end = tl.minimum(k_len, shift + start_m + BLOCK)
            unmasked_end = tl.maximum(0, (shift + start_m + 1) // BLOCK * BLOCK)
        else:
            unmasked_end = k_len // BLOCK * BLOCK
    K_ = K + b * s_kb + kv_head * s_kh
    V_ = V + b * s_vb + kv_head * s_vh
    KVAL_ = KVAL + b * s_kvb + h * s_kvh
    dq = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    d_values = tl.zeros([BLOCK], tl.float32)
    dq, d_values = _query_grads_span(
        dq, d_values, q, grad, lse, delta, q_pos, q_values, K_, V_, KPOS, b * s_kpb, KVAL_, s_kt, s_vt,
        TABLE + h * s_table, DTABLE + h * s_table, n_entries, lowest, k_len, shift, start_m, scale_log2, 0,
        unmasked_end, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK, CAUSAL, False, CONTIGUOUS, HAS_TABLE, TABLE_GRAD,
        HAS_TOKENS, TOKEN_GRAD, DOT)
    dq, d_values = _query_grads_span(
        dq, d_values, q, grad, lse, delta, q_pos, q_values, K_, V_, KPOS, b * s_kpb, KVAL_, s_kt, s_vt,
        TABLE + h * s_table, DTABLE + h * s_table, n_entries, lowest, k_len, shift, start_m, scale_log2,
        unmasked_end, end, offs_d, offs_dv, HEAD_DIM, VALUE_DIM, BLOCK, CAUSAL, True, CONTIGUOUS, HAS_TABLE,
        TABLE_GRAD, HAS_TOKENS, TOKEN_GRAD, DOT)
    tl.store(DQ + b * s_dqb + h * s_dqh + rows[:, None] * s_dqt + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=in_queries[:, None] & (offs_d[None, :] < HEAD_DIM))
    if TOKEN_GRAD:
        tl.store(DQVAL + row, d_values, mask=in_queries)


def serves(q: Tensor) -> bool:
    """Whether the kernel runs on q's device and dtype here: CUDA (or CPU tensors under ``TRITON_INTERPRET=1``, which
    the tests set), float16/bfloat16/float32, eager (not inside a ``torch.compile`` graph)."""
    interpreted = q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return (q.is_cuda or interpreted) and q.dtype in DTYPES and not torch.compiler.is_compiling()


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool = True,
                    table: Tensor | None = None, lowest: int = 0, token_values: Tensor | None = None,
                    q_pos: Tensor | None = None, k_pos: Tensor | None = None) -> Tensor:
    """``softmax(scale·q·kᵀ + table[h, q_pos_i − k_pos_j − lowest] + c_i − c_j)·v``, the position terms inside
    the tiles.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv); H a multiple of Hkv; float16, bfloat16 or
            float32.
        scale: the logit scale.
        causal: keys after their query (k_pos > q_pos) are masked.
        table: (H, N) float bias of offsets lowest .. lowest + N − 1, covering every offset an allowed pair
            reaches; None: no bias. Its gradient flows back (float32).
        token_values: (B or 1, H, Tk) float (FoX's c = cumsum log f), queries being the last Tq keys; differences
            are formed in float64. Its gradient flows back.
        q_pos, k_pos: (B or 1, Tq) and (B or 1, Tk) int64 explicit positions; None for both: queries at the last
            Tq of keys 0..Tk−1 (then the tiles above a causal diagonal are skipped).
    Returns:
        (B, H, Tq, Dv) in q's dtype, laid out token-major as SDPA returns it.
    """
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    if (q_pos is None) != (k_pos is None):
        raise ValueError("pass both q_pos and k_pos, or neither (contiguous positions)")
    if q_pos is not None and token_values is not None:
        raise ValueError("token_values take the queries as the last Tq keys: leave q_pos and k_pos out")
    if table is not None and (table.dim() != 2 or table.shape[0] != heads or table.shape[1] < 1):
        raise ValueError(f"table must be (H, N) = ({heads}, N >= 1), got {tuple(table.shape)}")
    q_values = k_values = None
    if token_values is not None:
        if token_values.dim() != 3 or token_values.shape[0] not in (1, batch) or (
                token_values.shape[1:] != (heads, k_len)) or q_len > k_len:
            raise ValueError(f"token_values must be (B or 1, H, Tk) = ({batch}, {heads}, {k_len}) with Tq <= Tk, "
                             f"got {tuple(token_values.shape)}")
        values = token_values.to(torch.float64)
        q_values, k_values = values[..., k_len - q_len:], values
    positions = [None, None] if q_pos is None else [p.to(torch.int64).contiguous() for p in (q_pos, k_pos)]
    table = None if table is None else table.to(torch.float32).contiguous()
    return _TiledAttention.apply(q, k, v, table, q_values, k_values, *positions,
                                 int(lowest), causal, float(scale))


def _blocks(q: Tensor) -> tuple[int, int, int, int, int]:
    """(forward BLOCK_M, forward BLOCK_N, backward BLOCK, warps, pipeline stages) for q's device and head width;
    small tiles under the interpreter, so a test at a few dozen tokens crosses tiles."""
    if q.device.type == "cpu":
        return 16, 16, 16, 1, 1
    wide = q.shape[-1] > 64
    return 128, 64, 64, 8 if wide else 4, 2 if wide else 3


def _last_unit(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class _TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, q_values, k_values, q_pos, k_pos, lowest, causal, scale):
        q, k, v = (_last_unit(x) for x in (q, k, v))
        batch, heads, q_len, _ = q.shape
        out = q.new_empty(batch, q_len, heads, v.shape[-1]).transpose(1, 2)  # token-major, as SDPA returns it
        lse = torch.empty(batch * heads, q_len, device=q.device, dtype=torch.float32)
        terms = _Terms(q, k, v, table, q_values, k_values, q_pos, k_pos, lowest, causal, scale)
        block_m, block_n, _, warps, stages = _blocks(q)
        _forward[(triton.cdiv(q_len, block_m), batch * heads)](
            q, k, v, out, lse, *terms.pointers(), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *out.stride()[:3], *terms.strides(), heads, terms.group, *terms.sizes(), BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=warps, num_stages=stages, **terms.flags())
        ctx.save_for_backward(q, k, v, out, lse, table, q_values, k_values, q_pos, k_pos)
        ctx.settings = (lowest, causal, scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, table, q_values, k_values, q_pos, k_pos = ctx.saved_tensors
        terms = _Terms(q, k, v, table, q_values, k_values, q_pos, k_pos, *ctx.settings)
        grad_out = _last_unit(grad_out)
        delta = (grad_out.float() * out.float()).sum(-1).contiguous()  # (B, H, Tq): Σ_d dout·out
        batch, heads, q_len = q.shape[:3]
        kv_heads, k_len = k.shape[1], k.shape[2]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        d_table = torch.zeros_like(table) if ctx.needs_input_grad[3] else None
        token_grad = q_values is not None and (ctx.needs_input_grad[4] or ctx.needs_input_grad[5])
        d_q_values = lse.new_empty(batch, heads, q_len) if token_grad else None
        d_k_values = lse.new_empty(batch, heads, k_len) if token_grad else None
        _, _, block, warps, stages = _blocks(q)
        common = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3])
        launch = dict(num_warps=warps, num_stages=stages, TOKEN_GRAD=token_grad, **terms.flags())
        _backward_keys[(triton.cdiv(k_len, block), batch * kv_heads)](
            q, k, v, grad_out, lse, delta, dk, dv, *terms.pointers(), terms.or_stand_in(d_k_values), *common,
            *dk.stride()[:3], *dv.stride()[:3], *terms.strides(), heads, terms.group, kv_heads, *terms.sizes(),
            terms.scale, BLOCK_M=block, BLOCK_N=block, **launch)
        table_pointer, *rest = terms.pointers()
        _backward_queries[(triton.cdiv(q_len, block), batch * heads)](
            q, k, v, grad_out, lse, delta, dq, table_pointer, terms.or_stand_in(d_table), *rest,
            terms.or_stand_in(d_q_values), *common, *dq.stride()[:3], *terms.strides(), heads, terms.group,
            *terms.sizes(), terms.scale, BLOCK=block, TABLE_GRAD=d_table is not None, **launch)
        return dq, dk, dv, d_table, d_q_values, d_k_values, None, None, None, None, None


class _Terms:
    """The position terms of one call, as the kernels take them: pointers (a stand-in for an absent term, never
    read), strides, sizes and compile-time flags."""

    def __init__(self, q, k, v, table, q_values, k_values, q_pos, k_pos, lowest, causal, scale):
        self.q, self.q_values, self.k_values = q, q_values, k_values
        self.has_table = table is not None
        self.table = table if table is not None else q.new_zeros(1, 1, dtype=torch.float32)
        self.q_pos, self.k_pos, self.lowest, self.causal, self.scale = q_pos, k_pos, lowest, causal, scale
        self.group = q.shape[1] // k.shape[1]
        self.q_len, self.k_len, self.value_dim = q.shape[2], k.shape[2], v.shape[-1]

    def or_stand_in(self, x: Tensor | None) -> Tensor:
        return self.table if x is None else x

    def pointers(self) -> tuple:
        """TABLE, QPOS, KPOS, QVAL, KVAL."""
        return (self.table, *(self.or_stand_in(x) for x in (self.q_pos, self.k_pos, self.q_values, self.k_values)))

    def strides(self) -> tuple[int, ...]:
        """The table's row stride, the positions' batch strides, the token values' batch and head strides (0 for a
        batch of one, broadcast)."""
        def batch(x):
            return 0 if x is None or x.shape[0] == 1 else x.stride(0)

        def head(x):
            return 0 if x is None else x.stride(1)
        return (self.table.stride(0), batch(self.q_pos), batch(self.k_pos), batch(self.q_values),
                head(self.q_values), batch(self.k_values), head(self.k_values))

    def sizes(self) -> tuple:
        """q_len, k_len, shift (Tk − Tq), lowest, N, the base-2 logit scale."""
        return (self.q_len, self.k_len, self.k_len - self.q_len, self.lowest, self.table.shape[1],
                self.scale * LOG2E)

    def flags(self) -> dict:
        head_dim = self.q.shape[-1]
        return dict(HEAD_DIM=head_dim, VALUE_DIM=self.value_dim, BLOCK_D=triton.next_power_of_2(head_dim),
                    BLOCK_DV=triton.next_power_of_2(self.value_dim), CAUSAL=self.causal,
                    CONTIGUOUS=self.q_pos is None, HAS_TABLE=self.has_table,
                    HAS_TOKENS=self.q_values is not None, DOT=self.dot())

    def dot(self) -> int:
        if self.q.dtype == torch.float32:
            return IEEE
        return UPCAST if self.q.device.type == "cpu" and self.q.dtype == torch.bfloat16 else NATIVE
