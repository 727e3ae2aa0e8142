"""What one tile of ``tiles_jit``'s programs adds for the position terms: its base-2 logits with the bias and token
values (``tile_logits``), and the pieces of their gradients (diagonal sums of a table, sums against the formulas'
derivatives); and what every tile kernel shares: its products (``dot``), its place in the grid (``program_tile``),
int64 row offsets (``along``), one key tile of the online softmax (``softmax_step``), and its loads of a key/value
tile (``key_value_tiles``) and of what a query tile's backward reads (``output_grads``). The bias kinds (BIAS) and
product modes (DOT) are ``tiles_jit``'s.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def along(index, stride):
    """Element offsets index·stride in int64: a token-major (B, T, H, Dh) tensor's rows pass 2^31 elements once
    T·H·Dh does (2^20 tokens of 32 heads of 64), where int32 products would wrap."""
    return index.to(tl.int64) * stride


@triton.jit
def program_tile(length, heads, BLOCK: tl.constexpr):
    """This program's first row of its tile of ``length`` rows (tiles of BLOCK), its batch row and its head (these
    two in int64, for offsets). The grid has one axis, over (batch row, head, tile) with the tiles fastest: CUDA
    caps a grid's second and third axes at 65,535, which batch rows times heads would pass."""
    tiles = tl.cdiv(length, BLOCK)
    program = tl.program_id(0)
    row = program // tiles  # b·heads + h
    return program % tiles * BLOCK, (row // heads).to(tl.int64), (row % heads).to(tl.int64)


@triton.jit
def softmax_step(acc, m_i, sums, s, v_tile, DOT: tl.constexpr):
    """One key tile of the online softmax, from its base-2 logits s (BLOCK_M, BLOCK_N), −inf where a pair may not
    attend: (acc (BLOCK_M, BLOCK_DV), the running maximum and the running sum (BLOCK_M,), each rescaled to the new
    maximum and added to; the tile's weights p against that maximum)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees no key yet
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    return acc * alpha[:, None] + dot(p.to(v_tile.dtype), v_tile, DOT), m_new, sums * alpha + tl.sum(p, 1), p


@triton.jit
def key_value_tiles(K, V, cols, k_len, s_kt, s_vt, offs_d, offs_dv, HEAD_DIM: tl.constexpr,
                    VALUE_DIM: tl.constexpr):
    """Keys ``cols`` of one key/value head: (whether each lies within Tk, k (BLOCK_N, BLOCK_D), v (BLOCK_N,
    BLOCK_DV)), zeros past Tk and past the widths. K and V point at the head's first row."""
    in_keys = cols < k_len
    k_tile = tl.load(K + along(cols, s_kt)[:, None] + offs_d[None, :],
                     mask=in_keys[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    v_tile = tl.load(V + along(cols, s_vt)[:, None] + offs_dv[None, :],
                     mask=in_keys[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
    return in_keys, k_tile, v_tile


@triton.jit
def output_grads(DO, LSE, DELTA, s_dob, s_doh, s_dot, b, h, heads, rows, q_len, offs_dv, VALUE_DIM: tl.constexpr):
    """What a query tile's backward reads of its rows: (whether each lies within Tq, dO (BLOCK, BLOCK_DV), the
    base-2 log-sum-exp (+inf past Tq: weights 0) and D = dO·out (BLOCK,)). LSE and DELTA are (B·H, Tq)."""
    in_queries = rows < q_len
    grad = tl.load(DO + b * s_dob + h * s_doh + along(rows, s_dot)[:, None] + offs_dv[None, :],
                   mask=in_queries[:, None] & (offs_dv[None, :] < VALUE_DIM), other=0.0)
    row = (b * heads + h) * q_len + rows
    lse = tl.load(LSE + row, mask=in_queries, other=float("inf"))
    delta = tl.load(DELTA + row, mask=in_queries, other=0.0)
    return in_queries, grad, lse, delta


@triton.jit
def dot(a, b, DOT: tl.constexpr):
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
def _distance(offset, BIAS: tl.constexpr):
    """The formula biases' argument: o, or |o|, as float32 (exact to 2^24)."""
    if BIAS == 2:
        return offset.to(tl.float32)
    else:
        return tl.abs(offset).to(tl.float32)


@triton.jit
def _power(distance, exponent):
    """|o|^r2, 0 at o = 0."""
    return tl.where(distance > 0.0, tl.math.exp2(exponent * tl.math.log2(tl.maximum(distance, 1.0))), 0.0)


@triton.jit
def tile_logits(q, k_tile, q_pos, k_pos, cols, table, params, n_entries, lowest, flat_low, flat_high, q_side,
                 k_side, k_len, scale_log2, CAUSAL: tl.constexpr, MASKED: tl.constexpr, BIAS: tl.constexpr,
                 HAS_TOKENS: tl.constexpr, DOT: tl.constexpr):
    """One tile's base-2 logits (BLOCK_M, BLOCK_N) float32, −inf where a pair may not attend (``MASKED``: the tile
    may hold such pairs); each pair's table entry (clamped into the table) and the entry every pair of the tile
    shares (−1: none). ``table``: this head's row of the numbers the bias reads: its table of offsets, or FIRE's
    segments (``n_entries`` of them)."""
    s = dot(q, k_tile, DOT) * scale_log2
    offset = q_pos[:, None] - k_pos[None, :]
    entry = tl.minimum(tl.maximum(offset - lowest, 0), n_entries - 1)
    shared = -1
    if BIAS == 1:
        least = tl.min(q_pos, 0) - tl.max(k_pos, 0) - lowest
        most = tl.max(q_pos, 0) - tl.min(k_pos, 0) - lowest
        shared = tl.where(least >= flat_high, flat_high, tl.where(most <= flat_low, flat_low, -1))
        if DOT == 1:  # float32: a branch here made ptxas keep 32 registers and spill up to 7,680 bytes a thread
            s += tl.load(table + entry) * 1.4426950408889634
        elif shared >= 0:
            s += tl.load(table + shared) * 1.4426950408889634
        else:
            s += tl.load(table + entry) * 1.4426950408889634
    elif BIAS == 2 or BIAS == 3:
        s += tl.load(params) * 1.4426950408889634 * _distance(offset, BIAS)
    elif BIAS == 4:
        r2 = tl.load(params + 1)
        s -= tl.load(params) * 1.4426950408889634 * tl.log(1.0 + r2 * _distance(offset, BIAS))
    elif BIAS == 5:
        s -= tl.load(params) * 1.4426950408889634 * _power(_distance(offset, BIAS), tl.load(params + 1))
    elif BIAS == 6:
        x, _, _ = _fire_input(q_pos, k_pos, table, n_entries)
        s += _fire_bias(x, table, n_entries) * 1.4426950408889634
    if HAS_TOKENS:
        s += (q_side[:, None] - k_side[None, :]) * 1.4426950408889634
    if MASKED:
        allowed = cols[None, :] < k_len
        if CAUSAL:
            allowed &= offset >= 0
        s = tl.where(allowed, s, float("-inf"))
    return s, entry, shared


@triton.jit
def add_diagonal_sums(DTABLE, ds, base, n_entries, BLOCK: tl.constexpr):
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
def parameter_grads(ds, q_pos, k_pos, params, BIAS: tl.constexpr):
    """Σ_j ds · ∂bias/∂params[0] and ∂bias/∂params[1] for each row of one tile, for the formula biases."""
    distance = _distance(q_pos[:, None] - k_pos[None, :], BIAS)
    if BIAS == 4:
        r1, r2 = tl.load(params), tl.load(params + 1)
        grown = 1.0 + r2 * distance
        return tl.sum(-ds * tl.log(grown), 1), tl.sum(-ds * r1 * distance / grown, 1)
    elif BIAS == 5:
        r1, r2 = tl.load(params), tl.load(params + 1)
        powered = _power(distance, r2)
        return tl.sum(-ds * powered, 1), tl.sum(-ds * r1 * powered * tl.log(tl.maximum(distance, 1.0)), 1)
    else:
        return tl.sum(ds * distance, 1), tl.sum(ds * 0.0, 1)


@triton.jit
def _log1p(u):
    """log(1 + u) to float32's precision for small u too (the ratio corrects the rounding of 1 + u)."""
    grown = 1.0 + u
    return tl.where(grown == 1.0, u, tl.log(grown) * (u / tl.where(grown == 1.0, 1.0, grown - 1.0)))


@triton.jit
def _fire_input(q_pos, k_pos, fire, n_entries):
    """FIRE's x = ψ(|o|) / (ψ(max(q, L)) + ε), ψ(u) = log(1 + c·u), per pair (BLOCK_M, BLOCK_N); and the per-row
    denominator and max(q, L) for the gradients. ``fire``: [keys (P), slopes (P), intercepts (P), c, L]."""
    c = tl.load(fire + n_entries - 2)
    threshold = tl.load(fire + n_entries - 1)
    distance = tl.abs(q_pos[:, None] - k_pos[None, :]).to(tl.float32)
    normalizer = tl.maximum(q_pos.to(tl.float32), threshold)
    denominator = _log1p(c * normalizer) + 1e-6
    return _log1p(c * distance) * (1.0 / denominator)[:, None], denominator, normalizer  # a division per row


@triton.jit
def _segment(x, fire, keys):
    """#{r : fire[r] < x} per element of x: a branch-free binary search over the ``keys`` (a power of two) sorted
    keys, whose last is +inf, so it lands in 0 .. keys − 1 in log2(keys) steps."""
    segment = tl.zeros(x.shape, tl.int32)
    half = keys // 2
    while half > 0:
        segment += tl.where(tl.load(fire + segment + half - 1) < x, half, 0)
        half = half // 2
    return segment


@triton.jit
def _fire_range(x, fire, keys):
    """The least and the greatest segment of a tile's x (scalars): those of its least and greatest x."""
    ends = _segment(tl.where(tl.arange(0, 2) == 0, tl.min(x), tl.max(x)), fire, keys)  # (2,)
    return tl.min(ends), tl.max(ends)


@triton.jit
def _fire_bias(x, fire, n_entries):
    """slopes[s] · x + intercepts[s] per pair, s its segment: FIRE's MLP (``kernels.fire_segments``). From the
    tile's least segment on, each key inside the tile's range of x moves the pairs past it to the next segment: a
    tile far from the diagonal spans a narrow range of x and mostly holds none (one FMA per pair)."""
    keys = (n_entries - 2) // 3
    low, high = _fire_range(x, fire, keys)
    bias = tl.load(fire + keys + low) * x + tl.load(fire + 2 * keys + low)
    for r in range(low, high):
        past = tl.load(fire + keys + r + 1) * x + tl.load(fire + 2 * keys + r + 1)
        bias = tl.where(tl.load(fire + r) < x, past, bias)
    return bias


@triton.jit
def add_fire_grads(DFIRE, ds, q_pos, k_pos, fire, n_entries):
    """Add one tile's Σ ds and Σ ds · x per segment (the gradients of its intercept and slope) to this head's
    gradient row (two atomic adds per segment the tile spans); return its rows' Σ_j ds · ∂bias/∂c and ∂bias/∂L
    (BLOCK_M,) each, which the caller sums over its tiles. Each segment finds its pairs by two compares and sums
    them per row: a tile of each pair's segment and slope, kept across the segments, made the queries' backward
    spill 704 bytes a thread at bf16 width 64 (now 464; ``benchmarks/sm90.md``)."""
    keys = (n_entries - 2) // 3
    x, denominator, normalizer = _fire_input(q_pos, k_pos, fire, n_entries)
    c = tl.load(fire + n_entries - 2)
    threshold = tl.load(fire + n_entries - 1)
    distance = tl.abs(q_pos[:, None] - k_pos[None, :]).to(tl.float32)
    weighted = ds * x
    through_c = ds * (distance / (1.0 + c * distance))  # ds · ∂ψ(|o|)/∂c
    low, high = _fire_range(x, fire, keys)
    along = tl.zeros_like(denominator)  # Σ_j ds · ∂bias/∂x · x per row
    from_distance = tl.zeros_like(denominator)  # Σ_j ds · ∂bias/∂x · ∂ψ(|o|)/∂c per row
    for s in range(low, high + 1):  # segment s: the pairs with fire[s − 1] < x ≤ fire[s] (the last kink is +inf)
        lower_kink = tl.where(s > 0, tl.load(fire + tl.maximum(s - 1, 0)), float("-inf"))
        inside = (lower_kink < x) & (x <= tl.load(fire + s))
        weighted_rows = tl.sum(tl.where(inside, weighted, 0.0), 1)
        ds_rows = tl.sum(tl.where(inside, ds, 0.0), 1)
        tl.atomic_add(DFIRE + keys + s, tl.sum(weighted_rows))
        tl.atomic_add(DFIRE + 2 * keys + s, tl.sum(ds_rows))
        slope = tl.load(fire + keys + s)
        along += slope * weighted_rows
        from_distance += slope * tl.sum(tl.where(inside, through_c, 0.0), 1)
    grown = (normalizer / (1.0 + c * normalizer)) / denominator  # ∂ log(ψ(max(q, L)) + ε) / ∂c, per row
    chosen = tl.where(threshold > q_pos.to(tl.float32), 1.0, tl.where(threshold == q_pos.to(tl.float32), 0.5, 0.0))
    at_threshold = chosen * (c / (1.0 + c * normalizer)) / denominator  # a tie splits max's gradient, as torch's
    return from_distance / denominator - along * grown, -along * at_threshold
