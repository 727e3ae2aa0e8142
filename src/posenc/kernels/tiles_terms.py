"""What one tile of ``tiles_jit``'s programs adds for the position terms: its base-2 logits with the bias and token
values (``tile_logits``), and the pieces of their gradients (diagonal sums of a table, sums against the formulas'
derivatives). The bias kinds (BIAS) and product modes (DOT) are ``tiles_jit``'s.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
    MLP (``n_entries`` of them)."""
    s = dot(q, k_tile, DOT) * scale_log2
    offset = q_pos[:, None] - k_pos[None, :]
    entry = tl.minimum(tl.maximum(offset - lowest, 0), n_entries - 1)
    shared = -1
    if BIAS == 1:
        least = tl.min(q_pos, 0) - tl.max(k_pos, 0) - lowest
        most = tl.max(q_pos, 0) - tl.min(k_pos, 0) - lowest
        shared = tl.where(least >= flat_high, flat_high, tl.where(most <= flat_low, flat_low, -1))
        if shared >= 0:
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
        s += _fire_mlp(x, table, n_entries) * 1.4426950408889634
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
    denominator and max(q, L) for the gradients. ``fire``: [w1 (W), b1 (W), w2_h (W), b2_h, c, L], W = (N − 3) / 3."""
    width = (n_entries - 3) // 3
    c = tl.load(fire + 3 * width + 1)
    threshold = tl.load(fire + 3 * width + 2)
    distance = tl.abs(q_pos[:, None] - k_pos[None, :]).to(tl.float32)
    normalizer = tl.maximum(q_pos.to(tl.float32), threshold)
    denominator = _log1p(c * normalizer) + 1e-6
    return _log1p(c * distance) / denominator[:, None], denominator, normalizer


@triton.jit
def _fire_mlp(x, fire, n_entries):
    """b2_h + Σ_k w2_hk · relu(w1_k · x + b1_k), per pair."""
    width = (n_entries - 3) // 3
    bias = tl.zeros_like(x) + tl.load(fire + 3 * width)
    for unit in range(width):
        hidden = tl.maximum(tl.load(fire + unit) * x + tl.load(fire + width + unit), 0.0)
        bias += tl.load(fire + 2 * width + unit) * hidden
    return bias


@triton.jit
def add_fire_grads(DFIRE, ds, q_pos, k_pos, fire, n_entries):
    """Add one tile's Σ ds · ∂bias/∂(w1, b1, w2_h, b2_h, c, L) to this head's gradient row (atomic adds)."""
    width = (n_entries - 3) // 3
    x, denominator, normalizer = _fire_input(q_pos, k_pos, fire, n_entries)
    slope = tl.zeros_like(x)  # ∂bias/∂x per pair
    for unit in range(width):
        w1, w2 = tl.load(fire + unit), tl.load(fire + 2 * width + unit)
        before = w1 * x + tl.load(fire + width + unit)
        active = tl.where(before > 0.0, ds, 0.0)
        tl.atomic_add(DFIRE + unit, tl.sum(active * x) * w2)
        tl.atomic_add(DFIRE + width + unit, tl.sum(active) * w2)
        tl.atomic_add(DFIRE + 2 * width + unit, tl.sum(ds * tl.maximum(before, 0.0)))
        slope += tl.where(before > 0.0, w1 * w2, 0.0)
    tl.atomic_add(DFIRE + 3 * width, tl.sum(ds))
    c = tl.load(fire + 3 * width + 1)
    threshold = tl.load(fire + 3 * width + 2)
    distance = tl.abs(q_pos[:, None] - k_pos[None, :]).to(tl.float32)
    grown = (normalizer / (1.0 + c * normalizer)) / denominator  # ∂ log(ψ(max(q, L)) + ε) / ∂c, per row
    dx_dc = (distance / (1.0 + c * distance)) / denominator[:, None] - x * grown[:, None]
    chosen = tl.where(threshold > q_pos.to(tl.float32), 1.0, tl.where(threshold == q_pos.to(tl.float32), 0.5, 0.0))
    at_threshold = chosen * (c / (1.0 + c * normalizer)) / denominator  # a tie splits max's gradient, as torch's
    pulled = ds * slope
    tl.atomic_add(DFIRE + 3 * width + 1, tl.sum(pulled * dx_dc))
    tl.atomic_add(DFIRE + 3 * width + 2, tl.sum(-pulled * x * at_threshold[:, None]))
