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


@pytest.mark.parametrize("x, a, b, want", [
    (0.0, 2.0, 3.0, 0.0), (1.0, 2.0, 3.0, 1.0),  # the ends
    (0.3, 1.0, 1.0, 0.3),  # I_x(1, 1) = x
    (0.3, 4.0, 1.0, 0.3 ** 4), (0.8, 4.0, 1.0, 0.8 ** 4),  # I_x(a, 1) = x^a, on both sides of the switch
    (0.3, 1.0, 5.0, 1 - 0.7 ** 5), (0.9, 1.0, 5.0, 1 - 0.1 ** 5),  # I_x(1, b) = 1 − (1 − x)^b
    (0.25, 0.5, 0.5, 2 / math.pi * math.asin(0.5)),  # the arcsine law
    (0.6, 3.0, 3.0, 0.6 ** 3 * (10 - 15 * 0.6 + 6 * 0.36)),  # a polynomial: 10x³ − 15x⁴ + 6x⁵
])
def test_the_incomplete_beta_equals_its_closed_forms(x, a, b, want):
    assert documents._incomplete_beta(x, a, b) == pytest.approx(want, abs=1e-13)


@pytest.mark.parametrize("t", [-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0])
def test_t_cdf_equals_the_cauchy_and_two_degree_closed_forms(t):
    assert documents.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-13)
    assert documents.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-13)


@pytest.mark.parametrize("p, df", [(0.0, 3), (1.0, 3), (1.5, 3), (-0.1, 3), (0.5, 0), (0.975, -1)])
def test_t_quantile_refuses_p_outside_the_open_interval_and_df_below_one(p, df):
    with pytest.raises(ValueError, match=rf"t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}"):
        t_quantile(p, df)


def test_integers_and_large_values_are_read_in_float64():
    low, high = t_interval([1, 2, 3])  # integers: mean 2, sd 1
    assert (low, high) == pytest.approx((2 - 4.3026527 / math.sqrt(3), 2 + 4.3026527 / math.sqrt(3)), abs=1e-6)
    big = [1e8 + 1, 1e8 + 2, 1e8 + 3]  # float32 would round these to 1e8 and the interval to a point
    low, high = t_interval(big)
    assert high - low == pytest.approx(2 * 4.3026527 / math.sqrt(3), abs=1e-5)
    assert t_interval([1.0, 2.0]) == pytest.approx((1.5 - 12.7062047 / 2, 1.5 + 12.7062047 / 2), abs=1e-6)
    assert sign_flip_p([1, 2, 3]) == pytest.approx(2 / 8)
    assert sign_flip_p([1e8 + 1, -(1e8 + 2), 1e8 + 3]) == pytest.approx(sign_flip_p([1.0, -2.0, 3.0]))


def test_sixteen_documents_are_still_exact_and_seventeen_draw_reproducibly():
    assert sign_flip_p([1.0] * 16) == 2 / 2 ** 16  # exact: only the two all-same patterns
    d = torch.linspace(-0.3, 1.0, 17, dtype=torch.float64)
    patterns = torch.arange(1 << 17)[:, None].bitwise_right_shift(torch.arange(17)).bitwise_and(1)
    exact = (((1 - 2 * patterns).double() * d).mean(1).abs() >= d.mean().abs() - 1e-12).double().mean().item()
    drawn = sign_flip_p(d)
    assert drawn == sign_flip_p(d.tolist())  # seeded: the same p every call
    assert drawn == pytest.approx(exact, abs=3 * math.sqrt(exact / documents.DRAWS))
    signs = (torch.randint(0, 2, (documents.DRAWS, 17), generator=torch.Generator().manual_seed(documents.SEED))
             * 2 - 1).double()
    extreme = int(((signs * d).mean(1).abs() >= d.mean().abs() - 1e-12).sum())
    assert drawn == (1 + extreme) / (1 + documents.DRAWS)  # the observed pattern counted once


def test_holm_caps_at_one_and_paired_counts_and_checks_its_documents():
    assert holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}
    assert paired([1.0, 2.0, 4.0], [0.0, 0.0, 1.0], ["x", "y", "z"])["n"] == 3
    with pytest.raises(ValueError, match="one value per document"):
        paired([1.0, 2.0], [3.0, 4.0], ["only one"])


def test_a_verdict_reads_zero_not_one_and_names_the_family_size():
    near_one = {"mean": 1.0, "low": 0.9, "high": 1.1, "p": 2 / 2 ** 12,
                "per_document": {str(i): 1.0 + 0.05 * (-1) ** i for i in range(12)}}
    out = correct({"a − b": near_one})["a − b"]
    assert out["corrected"][0] < 1.0 < out["corrected"][1] and out["verdict"] is True and out["comparisons"] == 1


def test_wilson_for_one_answer_and_never_past_one():
    z = 1.959963984540054
    assert wilson(1, 1) == pytest.approx((1 / (1 + z * z), 1.0), abs=1e-12)
    assert wilson(0, 1) == pytest.approx((0.0, z * z / (1 + z * z)), abs=1e-12)
    assert all(wilson(n, n)[1] <= 1.0 and wilson(0, n)[0] >= 0.0 for n in range(1, 200))
