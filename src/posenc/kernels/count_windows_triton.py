"""CoPE's table inside Triton tiles, in windows of W consecutive rows (``counts_triton``'s tiles; W is the tile's
size): the table logits Z = q·eᵀ that a tile's pairs read (``looked_up``), and the gradient they send back to q and
the table (``to_table``). A tile's pairs read rows ⌊p⌋ and ⌈p⌉ of their counts p; each window starts at the next row
some pair reads, so the windows jump rows that no pair reads and the table may have any number of rows P.

Shapes: BLOCK query rows by BLOCK keys per tile (the pairs' ⌊p⌋, ⌈p⌉ and p − ⌊p⌋ are (BLOCK, BLOCK)), W = BLOCK
table rows per window, Dh head width.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles_terms import dot


@triton.jit
def window_rows(TABLE, start, n_rows, offs_w, offs_d, HEAD_DIM: tl.constexpr):
    """The table's rows start .. start + W − 1 (W, BLOCK_D), zero past P, and whether each is within P."""
    index = start + offs_w
    inside = index < n_rows
    return tl.load(TABLE + index[:, None] * HEAD_DIM + offs_d[None, :],
                   mask=inside[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0), inside


@triton.jit
def wide_dot(a, b, dtype, DOT: tl.constexpr):
    """a @ b in float32 keeping a float32 operand's digits: exact float32 products where q is float32 (IEEE);
    on 16-bit tensor cores each float32 operand split into a high and a low part in ``dtype`` (q's), three products
    at most, about 16 bits kept. Rounding the table's rows to bf16 instead moved bf16 outputs by 1.2–2.3e-2 of their
    largest magnitude (split: 1.9–2.4e-3); rounding dZ moved the table's gradient by 4.4–5.0e-3 (split: 2.6–2.7e-3).
    Entries past fp16's range overflow in fp16."""
    if DOT == 1:
        return dot(a, b, DOT)
    a_high, b_high = a.to(dtype), b.to(dtype)
    product = dot(a_high, b_high, DOT)
    if a.dtype == tl.float32:
        product += dot((a - a_high.to(tl.float32)).to(dtype), b_high, DOT)
    if b.dtype == tl.float32:
        product += dot(a_high, (b - b_high.to(tl.float32)).to(dtype), DOT)
    return product


@triton.jit
def next_read(low, high, allowed, after):
    """The smallest table row ≥ ``after`` that an allowed pair reads (its ⌊p⌋ or ⌈p⌉); 2^31 − 1 if none does."""
    return tl.min(tl.where(allowed & (high >= after), tl.where(low >= after, low, high), 2147483647))


@triton.jit
def looked_up(q, TABLE, low, high, allowed, first, last, n_rows, offs_w, offs_d, HEAD_DIM: tl.constexpr,
               BLOCK_W: tl.constexpr, DOT: tl.constexpr):
    """Z[⌊p⌋] and Z[⌈p⌉] − Z[⌊p⌋] of each allowed pair (BLOCK, BLOCK) float32, Z over windows of W rows, each from
    the next row some pair reads."""
    at_low = tl.zeros(low.shape, tl.float32)
    at_high = tl.zeros(low.shape, tl.float32)
    start = first
    while start <= last:
        window, _ = window_rows(TABLE, start, n_rows, offs_w, offs_d, HEAD_DIM)
        z = wide_dot(q, tl.trans(window), q.dtype, DOT)  # (BLOCK, W)
        low_here = (low >= start) & (low < start + BLOCK_W)
        high_here = (high >= start) & (high < start + BLOCK_W)
        at_low = tl.where(low_here, tl.gather(z, tl.where(low_here, low - start, 0), 1), at_low)
        at_high = tl.where(high_here, tl.gather(z, tl.where(high_here, high - start, 0), 1), at_high)
        start = next_read(low, high, allowed, start + BLOCK_W)
    return at_low, at_high - at_low


@triton.jit
def keys_reading_from(low, rows, LOG_BLOCK: tl.constexpr):
    """(BLOCK, W) int32: for query row i and table row ``rows[i, w]``, how many of the tile's keys have ⌊p_ij⌋ ≥ it.
    ⌊p⌋ never rises along the keys, so those keys come first: a binary search, log2(BLOCK) + 1 gathers."""
    found = tl.zeros(rows.shape, tl.int32)
    for level in tl.static_range(LOG_BLOCK):  # steps of BLOCK/2, BLOCK/4, .., 1 keys
        probe = tl.gather(low, found + ((1 << (LOG_BLOCK - 1 - level)) - 1), 1)
        found += (probe >= rows).to(tl.int32) << (LOG_BLOCK - 1 - level)
    return found + (tl.gather(low, found, 1) >= rows).to(tl.int32)


@triton.jit
def over_first_keys(running, keys):
    """(BLOCK, W): each row's sum over its first ``keys[i, w]`` keys, from its running sums over the keys (BLOCK,
    BLOCK). In arithmetic, not a select: Triton 3.9 could not move a select's booleans into the products' layout."""
    return tl.gather(running, tl.maximum(keys - 1, 0), 1) * tl.minimum(keys, 1).to(tl.float32)


@triton.jit
def to_table(dq, ds, low, high, fraction, allowed, first, last, q, TABLE, DTABLE, n_rows, offs_w, offs_d,
              HEAD_DIM: tl.constexpr, BLOCK_W: tl.constexpr, LOG_BLOCK: tl.constexpr, DOT: tl.constexpr):
    """dq + dZ·e, and DTABLE += dZᵀ·q (float32, atomically), over the windows ``looked_up`` read, where dZ_ic =
    Σ_j ds_ij·((1 − frac_ij)·[⌊p_ij⌋ = c] + frac_ij·[⌊p_ij⌋ = c − 1]) (a masked pair's ds is 0; ⌈p⌉ = ⌊p⌋ + 1
    where frac > 0). With the keys whose ⌊p⌋ ≥ c first (``keys_reading_from``), each sum is a difference of running
    sums over the keys: about 25 gathers per window, where a pass per table row read cost about 11·BLOCK² operations
    per row."""
    on_low, on_high = tl.cumsum(ds * (1.0 - fraction), 1), tl.cumsum(ds * fraction, 1)  # running sums over the keys
    start = first
    while start <= last:
        rows = tl.broadcast_to(start + offs_w[None, :], low.shape)  # (BLOCK, W): the window's table rows
        from_row_below = keys_reading_from(low, rows - 1, LOG_BLOCK)
        from_row = keys_reading_from(low, rows, LOG_BLOCK)
        from_row_above = keys_reading_from(low, rows + 1, LOG_BLOCK)
        d_window = (over_first_keys(on_low, from_row) - over_first_keys(on_low, from_row_above)
                    + over_first_keys(on_high, from_row_below) - over_first_keys(on_high, from_row))
        window, inside = window_rows(TABLE, start, n_rows, offs_w, offs_d, HEAD_DIM)
        dq += wide_dot(d_window, window, q.dtype, DOT)
        tl.atomic_add(DTABLE + (start + offs_w)[:, None] * HEAD_DIM + offs_d[None, :],
                      wide_dot(tl.trans(d_window), q, q.dtype, DOT),
                      mask=inside[:, None] & (offs_d[None, :] < HEAD_DIM))
        start = next_read(low, high, allowed, start + BLOCK_W)
    return dq
