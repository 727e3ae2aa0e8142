"""Statistics for a handful of documents: the unit is the document, never a window or an answer inside it.

With 4 to 20 documents a percentile bootstrap claims too much (over 4 units it covers about 79% of the time for
a nominal 95%). Here, for per-document values a_i, b_i of two rows on the same documents:
- the **interval** of the mean difference d = a − b is Student's paired t: mean(d) ± t(n−1) · sd(d) / √n (exact
  coverage for normal differences; a test checks it by simulation at n = 4 and 16);
- the **p-value** is the exact sign-flip (permutation) test of "d is symmetric about zero": every one of the 2^n
  sign patterns for n ≤ ``EXACT_UP_TO``, else ``DRAWS`` seeded random patterns (with the observed one counted);
- a run's comparisons are **corrected together**: Holm's step-down p-values, and Bonferroni intervals at level
  1 − α/m beside the raw ones. A verdict is written only where the corrected interval excludes zero *and* Holm's
  p is below α: the t interval leans on normality, the sign-flip test does not (with 4 documents it can never
  go below p = 0.125, so 4 documents never carry a verdict).
Accuracies (retrieval) get a Wilson score interval per cell; rows are compared by their per-document accuracies.
"""

from __future__ import annotations

import math

import torch

ALPHA = 0.05
EXACT_UP_TO = 16
DRAWS = 1 << 16
SEED = 0


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0.0 or x >= 1.0:
        return max(0.0, min(1.0, x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side only
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))

    def guarded(value: float) -> float:
        return value if abs(value) > 1e-300 else 1e-300

    c, d = 1.0, 1.0 / guarded(1.0 - (a + b) * x / (a + 1))
    fraction = d
    for m in range(1, 400):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for term in (even, odd):
            d = 1.0 / guarded(1.0 + term * d)
            c = guarded(1.0 + term / c)
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * fraction / a


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / (df + t * t), df / 2, 0.5)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (bisection on ``t_cdf``, to 1e-12)."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    low, high = -1e6, 1e6
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
        if high - low < 1e-12:
            break
    return (low + high) / 2


def t_interval(values, level: float = 1 - ALPHA) -> tuple[float, float]:
    """Student's t interval of the mean of ``values`` (n ≥ 2); (mean, mean) when they are all equal."""
    x = torch.as_tensor(values, dtype=torch.float64)
    if x.ndim != 1 or x.numel() < 2:
        raise ValueError(f"a t interval needs at least 2 values, got {x.numel()}")
    half = t_quantile(1 - (1 - level) / 2, x.numel() - 1) * x.std().item() / math.sqrt(x.numel())
    return x.mean().item() - half, x.mean().item() + half


def sign_flip_p(differences) -> float:
    """Two-sided p of the sign-flip test that ``differences`` (n,) are symmetric about zero, statistic |mean|."""
    d = torch.as_tensor(differences, dtype=torch.float64)
    n = d.numel()
    observed = d.mean().abs().item()
    if n <= EXACT_UP_TO:
        patterns = torch.arange(1 << n)[:, None].bitwise_right_shift(torch.arange(n)).bitwise_and(1)
        means = ((1 - 2 * patterns).to(torch.float64) * d).mean(1).abs()
        return (means >= observed - 1e-12 * max(1.0, observed)).double().mean().item()
    generator = torch.Generator().manual_seed(SEED)
    signs = torch.randint(0, 2, (DRAWS, n), generator=generator).mul(2).sub(1).to(torch.float64)
    extreme = int(((signs * d).mean(1).abs() >= observed - 1e-12 * max(1.0, observed)).sum())
    return (1 + extreme) / (1 + DRAWS)


def holm(p_values: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values: the k-th smallest of m times (m − k + 1), running maximum, at most 1."""
    order = sorted(p_values, key=p_values.get)
    adjusted, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[name]))
        adjusted[name] = running
    return {name: adjusted[name] for name in p_values}


def paired(a, b, documents: list[str]) -> dict:
    """a − b over the same documents (negative: a is lower): the mean, the raw 95% t interval, the exact
    sign-flip p and the per-document differences. ``correct`` adds the run-wide corrections."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape or a.ndim != 1 or len(documents) != a.numel():
        raise ValueError(f"a paired difference needs one value per document in both rows, got {tuple(a.shape)}, "
                         f"{tuple(b.shape)} for {len(documents)} documents")
    d = a - b
    low, high = t_interval(d)
    return {"mean": d.mean().item(), "low": low, "high": high, "p": sign_flip_p(d), "n": d.numel(),
            "per_document": dict(zip(documents, d.tolist()))}


def correct(comparisons: dict[str, dict]) -> dict[str, dict]:
    """Each comparison with Holm's p ("p_holm") and the Bonferroni interval at 1 − α/m ("corrected": [low,
    high]) over the m comparisons given; a verdict ("verdict": True) only where that interval excludes zero and
    Holm's p is below α."""
    adjusted = holm({name: c["p"] for name, c in comparisons.items()})
    m = len(comparisons)
    out = {}
    for name, c in comparisons.items():
        low, high = t_interval(list(c["per_document"].values()), level=1 - ALPHA / m)
        out[name] = {**c, "p_holm": adjusted[name], "corrected": [low, high], "comparisons": m,
                     "verdict": not low <= 0 <= high and adjusted[name] < ALPHA}
    return out


def wilson(correct_count: int, total: int, level: float = 1 - ALPHA) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``correct_count`` / ``total``."""
    if total < 1 or not 0 <= correct_count <= total:
        raise ValueError(f"a proportion needs 0 <= correct <= total and total >= 1, got {correct_count}/{total}")
    z = -_normal_quantile((1 - level) / 2)
    p = correct_count / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return max(0.0, centre - half), min(1.0, centre + half)


def _normal_quantile(p: float) -> float:
    return math.sqrt(2) * torch.special.erfinv(torch.tensor(2 * p - 1, dtype=torch.float64)).item()
