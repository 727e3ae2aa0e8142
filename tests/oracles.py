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


def paper_alibi_slopes(n: int) -> list[float]:
    """ALiBi's get_slopes, as printed in the paper's repository README."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_alibi_slopes(2 * closest)[0::2][: n - closest]
