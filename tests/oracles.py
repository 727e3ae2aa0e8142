"""Float64 references written from the papers' formulas, independently of posenc.

Loops over pairs and positions on purpose: slow, obvious, and sharing no code with
the library they check.
"""

from __future__ import annotations

import math

import torch


def sinusoid_loop(position: int, dim: int, base: float = 10000.0) -> list[float]:
    """PE(pos)[2i] = sin(pos / base^(2i/d)), PE(pos)[2i+1] = cos(...) (Vaswani et al.)."""
    out = []
    for i in range(dim // 2):
        angle = position / base ** (2 * i / dim)
        out += [math.sin(angle), math.cos(angle)]
    return out


def rotate_pairs(x: torch.Tensor, positions, inv_freq, layout: str) -> torch.Tensor:
    """Rotate each channel pair by an explicit 2x2 matrix. x: (T, Dh) float64."""
    x = x.double()
    out = x.clone()
    half = len(inv_freq)
    for t, position in enumerate(positions):
        for i, freq in enumerate(inv_freq):
            angle = float(position) * float(freq)
            rotation = torch.tensor(
                [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=torch.float64
            )
            a, b = (i, i + half) if layout == "half" else (2 * i, 2 * i + 1)
            out[t, [a, b]] = rotation @ x[t, [a, b]]
    return out


def naive_attention(q, k, v, bias=None, allowed=None, scale=None) -> torch.Tensor:
    """Softmax attention one query at a time. q: (Tq, Dh), k: (Tk, Dh), v: (Tk, Dv), bias/allowed (Tq, Tk)."""
    q, k, v = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    rows = []
    for i in range(q.shape[0]):
        logits = []
        for j in range(k.shape[0]):
            value = scale * float(q[i] @ k[j]) + (0.0 if bias is None else float(bias[i][j]))
            logits.append(value if allowed is None or allowed[i][j] else -math.inf)
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        total = sum(weights)
        rows.append(sum(w / total * v[j] for j, w in enumerate(weights)))
    return torch.stack(rows)


def dense_attention(q, k, v, *, scale, allowed=None, bias=None) -> torch.Tensor:
    """softmax(scale·q·kᵀ + bias) over the allowed keys, times v, batched as written; grouped key/value heads repeated.
    q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv); bias, allowed broadcast to (B, H, Tq, Tk)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    logits = scale * q @ k.transpose(-1, -2) + (0 if bias is None else bias)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    return logits.softmax(-1) @ v


def paper_alibi_slopes(n: int) -> list[float]:
    """ALiBi's get_slopes, as printed in the paper's repository README."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_alibi_slopes(2 * closest)[0::2][: n - closest]


def kerple_bias_loop(q_len: int, r1: list[float], r2: list[float], variant: str) -> torch.Tensor:
    """Kerple's log / power kernels as written in the paper, per head and pair. (H, T, T) float64."""
    out = torch.zeros(len(r1), q_len, q_len, dtype=torch.float64)
    for h in range(len(r1)):
        for i in range(q_len):
            for j in range(q_len):
                d = abs(i - j)
                out[h, i, j] = -r1[h] * (math.log(1 + r2[h] * d) if variant == "log" else d ** r2[h])
    return out


def sandwich_bias_loop(positions: list[int], heads: int, dim: int) -> torch.Tensor:
    """Sandwich: (p_i·p_j − d/2) / (8h/H) with sinusoids of width d, frequencies k = 1..d/2. (H, T, T)."""
    out = torch.zeros(heads, len(positions), len(positions), dtype=torch.float64)
    for h in range(heads):
        for a, i in enumerate(positions):
            for b, j in enumerate(positions):
                total = sum(math.cos((i - j) / 10000 ** (2 * k / dim)) for k in range(1, dim // 2 + 1))
                out[h, a, b] = (total - dim / 2) / (8 * (h + 1) / heads)
    return out


def fire_bias_loop(positions: list[int], c: float, threshold: float, w1, b1, w2, b2) -> torch.Tensor:
    """FIRE: f(ψ(i−j)/(ψ(max(L, i)) + 1e-6)), ψ(x) = log(|c·x| + 1), f = W2 relu(W1 x + b1) + b2. (H, T, T)."""
    heads = w2.shape[0]
    out = torch.zeros(heads, len(positions), len(positions), dtype=torch.float64)
    for a, i in enumerate(positions):
        for b, j in enumerate(positions):
            x = math.log(abs(c * (i - j)) + 1) / (math.log(abs(c * max(threshold, i)) + 1) + 1e-6)
            hidden = [max(0.0, float(w1[u, 0]) * x + float(b1[u])) for u in range(w1.shape[0])]
            for h in range(heads):
                out[h, a, b] = sum(float(w2[h, u]) * hidden[u] for u in range(len(hidden))) + float(b2[h])
    return out


def xpos_logits_loop(q: torch.Tensor, k: torch.Tensor, positions: list[int], theta: list[float], scale_base: float):
    """xPos (half layout): rotate pair c by p·θ_c and scale q by ζ_c^(p/γ), k by ζ_c^(−p/γ),
    from absolute positions as in the paper. q, k: (T, Dh) -> logits q'·k'ᵀ (T, T) float64."""
    half = q.shape[-1] // 2
    zeta = [(2 * c / q.shape[-1] + 0.4) / 1.4 for c in range(half)]

    def turn(x, sign):
        out = x.double().clone()
        for t, p in enumerate(positions):
            for c in range(half):
                angle, scale = p * theta[c], zeta[c] ** (sign * p / scale_base)
                a, b = float(x[t, c]), float(x[t, c + half])
                out[t, c] = scale * (a * math.cos(angle) - b * math.sin(angle))
                out[t, c + half] = scale * (b * math.cos(angle) + a * math.sin(angle))
        return out

    return turn(q, 1) @ turn(k, -1).T


def cope_logits_loop(q: torch.Tensor, k: torch.Tensor, table: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """CoPE's contextual-position term q_i·e[p_ij], one pair at a time, added to the scaled logits as the paper
    adds it: p_ij = Σ_{t between j and i} σ(q_i·k_t/√Dh), e[p] interpolated, clamped at the last row. (Tq, Tk),
    −inf where causality masks the pair."""
    q, k, table = q.double(), k.double(), table.double()
    dim, last = q.shape[-1], table.shape[0] - 1
    out = torch.full((q.shape[0], k.shape[0]), -math.inf, dtype=torch.float64)
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            if causal and j > i:
                continue
            span = range(j, i + 1) if j <= i else range(i, j + 1)
            p = min(sum(1 / (1 + math.exp(-float(q[i] @ k[t]) / math.sqrt(dim))) for t in span), last)
            low, high = math.floor(p), math.ceil(p)
            embedding = table[low] + (p - low) * (table[high] - table[low])
            out[i, j] = float(q[i] @ embedding)
    return out


def self_extend_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inv_freq, window: int, group,
                     layout: str = "half") -> torch.Tensor:
    """Self-Extend (Jin et al. 2024, eqs. for neighbour and grouped attention), causal, one head.

    Pair (i, j) with i − j < window: RoPE at positions i and j. Otherwise: the key at ⌊j/G⌋ and the query at
    ⌊i/G⌋ + window − ⌊window/G⌋ (ReRoPE when group is None: query at window, key at 0). q, k: (T, Dh), v (T, Dv).
    """
    length = q.shape[0]
    exact_q, exact_k = rotate_pairs(q, range(length), inv_freq, layout), rotate_pairs(k, range(length), inv_freq, layout)
    logits = torch.full((length, length), float("-inf"), dtype=torch.float64)
    for i in range(length):
        for j in range(i + 1):
            if i - j < window:
                logits[i, j] = exact_q[i] @ exact_k[j]
            else:
                qi = window if group is None else i // group + window - window // group
                kj = 0 if group is None else j // group
                far_q = rotate_pairs(q[i : i + 1], [qi], inv_freq, layout)[0]
                far_k = rotate_pairs(k[j : j + 1], [kj], inv_freq, layout)[0]
                logits[i, j] = far_q @ far_k
    weights = torch.softmax(logits / math.sqrt(q.shape[1]), dim=-1)
    return weights @ v.double()


def position_map_attention_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inv_freq, read_at,
                                logit_factor: float = 1.0) -> torch.Tensor:
    """Causal RoPE attention where pair (i, j) is read at the positions ``read_at(i, j) -> (query at, key at)``:
    the training-free extensions' position maps (STRING, DCA), one softmax per query, with loops.

    q: (1, H, T, Dh), k and v: (1, Hkv, T, Dh), unrotated, float64. Returns (1, H, T, Dh)."""
    heads, length, dim = q.shape[1], q.shape[2], q.shape[3]
    repeats = heads // k.shape[1]
    out = torch.zeros_like(q)
    for h in range(heads):
        for i in range(length):
            logits = []
            for j in range(i + 1):
                q_at, k_at = read_at(i, j)
                rotated_q = rotate_pairs(q[0, h, i][None], [q_at], inv_freq, "half")[0]
                rotated_k = rotate_pairs(k[0, h // repeats, j][None], [k_at], inv_freq, "half")[0]
                logits.append(rotated_q @ rotated_k / math.sqrt(dim) * logit_factor)
            out[0, h, i] = torch.softmax(torch.stack(logits), 0) @ v[0, h // repeats, : i + 1]
    return out
