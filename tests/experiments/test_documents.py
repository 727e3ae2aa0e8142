"""Statistics over a handful of documents: t quantiles and coverage, the exact sign-flip test, Holm, Wilson."""

import itertools
import math

import pytest
import torch

from posenc.experiments import documents
from posenc.experiments.documents import correct, holm, paired, sign_flip_p, t_interval, t_quantile, wilson


@pytest.mark.parametrize("p, df, want", [(0.975, 1, 12.7062047), (0.975, 3, 3.1824463), (0.975, 15, 2.1314495),
                                         (0.995, 7, 3.4994833), (0.9875, 15, 2.4899), (0.5, 4, 0.0),
                                         (0.025, 3, -3.1824463)])
def test_t_quantiles_match_the_table(p, df, want):
    assert t_quantile(p, df) == pytest.approx(want, abs=2e-4)


def test_t_interval_is_mean_plus_minus_t_times_the_standard_error():
    low, high = t_interval([1.0, 2.0, 3.0, 6.0])  # mean 3, sd sqrt(14/3), n 4
    half = 3.1824463 * math.sqrt(14 / 3) / 2
    assert (low, high) == pytest.approx((3 - half, 3 + half), abs=1e-6)
    with pytest.raises(ValueError, match="at least 2 values"):
        t_interval([1.0])


@pytest.mark.parametrize("n", [4, 16])
def test_the_t_interval_covers_the_true_mean_95_percent_of_the_time(n):
    generator = torch.Generator().manual_seed(n)
    draws = torch.randn(3000, n, generator=generator, dtype=torch.float64) * 0.3 + 0.1
    t = t_quantile(0.975, n - 1)
    half = t * draws.std(1) / math.sqrt(n)
    covered = ((draws.mean(1) - half <= 0.1) & (0.1 <= draws.mean(1) + half)).double().mean().item()
    assert 0.935 <= covered <= 0.965  # 3000 draws: the binomial sd of a 95% rate is 0.004


def test_a_percentile_bootstrap_over_four_documents_covers_less_which_is_why_it_went():
    from posenc.experiments.intervals import bootstrap_interval

    generator = torch.Generator().manual_seed(0)
    covered = 0
    for _ in range(200):
        values = torch.randn(4, generator=generator, dtype=torch.float64)
        low, high = bootstrap_interval(values, [0, 1, 2, 3], resamples=400)
        covered += low <= 0 <= high
    assert covered / 200 < 0.88


def test_sign_flip_p_is_exact_for_small_n():
    assert sign_flip_p([1.0, 2.0, 3.0, 4.0]) == pytest.approx(2 / 16)  # only all-plus and all-minus are as extreme
    assert sign_flip_p([1.0, -1.0, 1.0, -1.0]) == 1.0
    d = torch.tensor([0.5, -0.2, 0.9, 0.4, 0.1])
    means = [abs(sum(s * x for s, x in zip(signs, d.tolist())) / 5) for signs in itertools.product([1, -1], repeat=5)]
    want = sum(m >= abs(d.mean().item()) - 1e-12 for m in means) / 32
    assert sign_flip_p(d) == pytest.approx(want)


def test_sign_flip_p_draws_past_the_exact_limit_and_keeps_its_size_under_the_null():
    n = documents.EXACT_UP_TO + 2
    assert sign_flip_p([1.0] * n) == pytest.approx(1 / (1 + documents.DRAWS), rel=0.5)
    generator = torch.Generator().manual_seed(1)
    rejections = sum(sign_flip_p(torch.randn(8, generator=generator)) < 0.05 for _ in range(300))
    assert rejections / 300 <= 0.08


def test_holm_by_hand():
    # sorted p: 0.01 (x3), 0.03 (x2), 0.04 (x1) -> 0.03, 0.06, max(0.06, 0.04) = 0.06
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"a": 0.6, "b": 0.5}) == {"a": 1.0, "b": 1.0}


def test_wilson_by_hand():
    assert wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson(0, 16) == pytest.approx((0.0, 0.1936), abs=1e-4)
    with pytest.raises(ValueError, match="0 <= correct <= total"):
        wilson(5, 4)


def test_paired_keeps_pairs_and_the_sign_and_correct_widens_and_gates_the_verdict():
    docs = [f"d{i}" for i in range(6)]
    a = [2.0, 2.1, 2.2, 2.3, 2.4, 2.5]
    b = [2.5, 2.5, 2.5, 2.5, 2.5, 2.5]
    c = paired(a, b, docs)
    assert c["mean"] == pytest.approx(-0.25) and c["per_document"]["d0"] == pytest.approx(-0.5)
    assert c["per_document"]["d5"] == pytest.approx(0.0)
    assert c["p"] == pytest.approx(4 / 64)  # all five non-zero signs as observed or all flipped, the zero either way
    family = correct({"x": c, "y": paired(b, a, docs)})
    assert family["y"]["mean"] == pytest.approx(0.25)  # b − a: the other sign
    for name in family:
        low, high = family[name]["corrected"]
        assert low < family[name]["low"] and family[name]["high"] < high
        assert family[name]["p_holm"] == pytest.approx(2 * 4 / 64)
        assert family[name]["verdict"] is False  # Holm p 0.125 is not below 0.05, whatever t says
    with pytest.raises(ValueError, match="one value per document"):
        paired(a, b[:5], docs)


def test_sixteen_documents_that_agree_carry_a_verdict_through_the_correction():
    docs = [f"d{i}" for i in range(16)]
    generator = torch.Generator().manual_seed(0)
    a = (2.0 + 0.05 * torch.randn(16, generator=generator, dtype=torch.float64)).tolist()
    b = (2.3 + 0.05 * torch.randn(16, generator=generator, dtype=torch.float64)).tolist()
    family = correct({f"c{i}": paired(a, b, docs) for i in range(12)})
    assert all(c["verdict"] and c["p_holm"] < 0.05 and c["corrected"][1] < 0 for c in family.values())
