"""Intervals: the bootstrap on cases with known answers, paired differences, clustering by file."""

import math

import pytest
import torch

from posenc.experiments import intervals


def test_a_constant_has_a_zero_width_interval():
    low, high = intervals.bootstrap_interval([2.5] * 40, list(range(40)))
    assert low == high == 2.5


def test_the_interval_of_a_mean_matches_the_normal_theory_width():
    """n iid draws: the bootstrap's 95% interval of the mean is mean ± 1.96·σ/√n to within a few percent."""
    values = torch.randn(2000, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3 + 1
    low, high = intervals.bootstrap_interval(values, list(range(2000)), resamples=4000)
    expected = 1.96 * values.std(unbiased=False).item() / math.sqrt(2000)
    assert (high - low) / 2 == pytest.approx(expected, rel=0.08)
    assert (low + high) / 2 == pytest.approx(values.mean().item(), abs=0.02)


def test_two_values_give_the_exact_bootstrap_distribution():
    """Values 0 and 1, one each: the resampled mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4."""
    low, high = intervals.bootstrap_interval([0.0, 1.0], [0, 1], resamples=4000)
    assert (low, high) == (0.0, 1.0)
    low, high = intervals.bootstrap_interval([0.0, 1.0], [0, 1], resamples=4000, level=0.4)
    assert low == high == 0.5


def test_resampling_files_widens_the_interval_of_correlated_windows():
    """Ten windows per file that share the file's level: by file, the interval reflects 20 files, not 200 windows."""
    generator = torch.Generator().manual_seed(0)
    levels = torch.randn(20, generator=generator, dtype=torch.float64)
    values = levels.repeat_interleave(10) + 0.01 * torch.randn(200, generator=generator, dtype=torch.float64)
    files = [f"f{i // 10}" for i in range(200)]
    by_file, unit = intervals.units(files)
    assert unit == "20 files" and by_file[:11] == [0] * 10 + [1]
    low_f, high_f = intervals.bootstrap_interval(values, by_file)
    low_w, high_w = intervals.bootstrap_interval(values, list(range(200)))
    assert (high_f - low_f) > 2.5 * (high_w - low_w)


def test_few_files_are_still_the_unit_and_say_so():
    """Windows are never resampled one by one: with few files the interval stays over files, labelled."""
    groups, unit = intervals.units(["a", "a", "b", "c", "a"])
    assert groups == [0, 0, 1, 2, 0] and unit == "3 files, too few to cover 95%"
    assert intervals.units(["a", "a"]) == ([0, 0], "1 file, too few to cover 95%")


def test_windows_of_few_files_get_the_interval_of_their_files_not_of_their_windows():
    """Two files, one of low and one of high windows: resampling files draws all-low or all-high resamples
    (a quarter each), so the interval spans both levels; resampling 40 windows would shrink it tenfold."""
    values = [0.0] * 20 + [1.0] * 20
    groups, _ = intervals.units(["low"] * 20 + ["high"] * 20)
    assert intervals.bootstrap_interval(values, groups) == (0.0, 1.0)
    low, high = intervals.bootstrap_interval(values, list(range(40)))
    assert high - low < 0.4


def test_the_paired_difference_is_the_difference_of_the_means_with_a_tighter_interval():
    generator = torch.Generator().manual_seed(2)
    shared = torch.randn(300, generator=generator, dtype=torch.float64) * 2  # window difficulty, common to both rows
    a = shared + 0.10 + 0.05 * torch.randn(300, generator=generator, dtype=torch.float64)
    b = shared + 0.05 * torch.randn(300, generator=generator, dtype=torch.float64)
    groups = list(range(300))
    difference = intervals.paired_difference(a, b, groups)
    assert difference["mean"] == pytest.approx(a.mean().item() - b.mean().item(), abs=1e-12)
    assert difference["low"] > 0.09 - 0.02 and difference["high"] < 0.11 + 0.02
    low_a, high_a = intervals.bootstrap_interval(a, groups)
    assert difference["high"] - difference["low"] < (high_a - low_a) / 5
    assert not intervals.covers_zero(difference)


def test_paired_refuses_different_windows():
    with pytest.raises(ValueError, match="the same windows"):
        intervals.paired_difference([1.0, 2.0], [1.0], [0, 1])


def test_cells_average_seeds_per_window_and_report_their_spread():
    seeds = [[1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 6.0]]
    cell = intervals.cell(seeds, [0, 1, 2, 3])
    assert cell["mean"] == pytest.approx(3.5)
    assert cell["seed_std"] == pytest.approx(math.sqrt(2))  # seed means 2.5 and 4.5
    assert intervals.cell([[1.0], None], [0]) is None
    assert intervals.paired(seeds, [[0.0] * 4, [1.0] * 4], [0, 1, 2, 3])["mean"] == pytest.approx(3.0)


def test_position_bands_bracket_each_bin_mean():
    position = {"length": 4, "bin_edges": [0, 2, 4], "bits": [1.5, 3.0],
                "window_bits": [[1.0, 2.0], [2.0, 4.0], [1.5, 3.0]]}
    bands = intervals.position_bands(position, ["a", "b", "c"])
    assert bands["bits"] == [1.5, 3.0]
    assert all(lo <= mean <= hi for lo, mean, hi in zip(bands["low"], bands["bits"], bands["high"]))
    assert bands["low"][0] >= 1.0 and bands["high"][1] <= 4.0


def test_exactly_min_files_files_are_resampled_by_file():
    groups, unit = intervals.units([f"f{i}" for i in range(intervals.MIN_FILES)])
    assert unit == f"{intervals.MIN_FILES} files" and groups == list(range(intervals.MIN_FILES))


def test_means_are_taken_in_float64():
    """1e8 ± 0.25 is not representable in float32: a float32 mean would lose the 0.5."""
    values = [1e8 + 0.25, 1e8 + 0.75]
    assert intervals.summary(values, [0, 1])["mean"] == 1e8 + 0.5
    assert intervals.paired_difference(values, [1e8, 1e8], [0, 1])["mean"] == 0.5
    assert intervals.paired_difference([1e8, 1e8], values, [0, 1])["mean"] == -0.5
    assert intervals.seed_mean([values, values]) == values
    assert intervals.cell([values], [0, 1])["mean"] == 1e8 + 0.5


def test_the_bootstrap_is_deterministic_for_a_seed_and_checks_its_input():
    values = torch.randn(50, generator=torch.Generator().manual_seed(4)).tolist()
    first = intervals.bootstrap_interval(values, list(range(50)))
    torch.manual_seed(123)  # the global generator must not matter
    assert intervals.bootstrap_interval(values, list(range(50))) == first
    assert intervals.bootstrap_interval(values, list(range(50)), seed=1) != first
    assert intervals.bootstrap_interval([3.0], [0]) == (3.0, 3.0)
    for bad_values, bad_groups in (([1.0, 2.0], [0]), ([[1.0], [2.0]], [0, 1]), ([], [])):
        with pytest.raises(ValueError, match="equal-length 1-D sequences"):
            intervals.bootstrap_interval(bad_values, bad_groups)


@pytest.mark.parametrize("low, high, covers", [(0.0, 0.0, True), (0.0, 0.2, True), (-0.2, 0.0, True),
                                               (0.5, 2.0, False), (-2.0, -0.5, False), (0.001, 0.2, False)])
def test_covers_zero_at_its_edges(low, high, covers):
    assert intervals.covers_zero({"low": low, "high": high}) is covers


def test_one_seed_has_no_spread_and_a_missing_seed_no_cell():
    assert intervals.cell([[1.0, 2.0, 4.0]], [0, 1, 2])["seed_std"] == 0.0
    assert intervals.paired([[1.0]], [None], [0]) is None
    assert intervals.paired([None], [[1.0]], [0]) is None


def test_the_spread_over_seeds_is_taken_in_float64():
    cell = intervals.cell([[1e8 + 0.25], [1e8 + 0.75]], [0])
    assert cell["seed_std"] == pytest.approx(0.5 / math.sqrt(2), rel=1e-9)


def test_position_bands_keep_the_bins_they_describe():
    position = {"length": 4, "bin_edges": [0, 2, 4], "bits": [1.0, 2.0], "window_bits": [[1.0, 2.0]]}
    bands = intervals.position_bands(position, ["a"])
    assert bands == {"length": 4, "bin_edges": [0, 2, 4], "bits": [1.0, 2.0], "low": [1.0, 2.0], "high": [1.0, 2.0]}
    assert intervals.position_bands(None, ["a"]) is None


def test_one_seed_is_the_plain_bootstrap_over_groups():
    """The crossed bootstrap with one seed draws the same groups, in the same order, as the plain one did."""
    values = torch.randn(40, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    groups = [i // 4 for i in range(40)]
    generator = torch.Generator().manual_seed(intervals.BOOTSTRAP_SEED)
    sums = torch.zeros(10, dtype=torch.float64).index_add_(0, torch.tensor(groups), values)
    draws = torch.randint(0, 10, (intervals.RESAMPLES, 10), generator=generator)
    means = sums[draws].sum(1) / (4.0 * 10)
    expected = torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    assert list(intervals.crossed_interval(values[None], groups)) == expected
    assert intervals.bootstrap_interval(values, groups) == intervals.crossed_interval(values[None], groups)


def seeds_that_disagree():
    """Three seeds' differences on 30 windows of 30 files: per-seed means −0.006, −0.142 and −0.063 (the spread
    one seed hid in the README's 'YaRN leads at 8×'), each window within ±0.01 of its seed's mean."""
    noise = torch.linspace(-0.01, 0.01, 30, dtype=torch.float64)
    return [(mean + noise).tolist() for mean in (-0.006, -0.142, -0.063)], list(range(30))


def test_seeds_that_disagree_widen_the_interval_and_their_t_interval_carries_no_verdict():
    per_seed, groups = seeds_that_disagree()
    zeros = [[0.0] * 30] * 3
    difference = intervals.paired(per_seed, zeros, groups)
    assert difference["mean"] == pytest.approx(-0.070333, abs=1e-6)
    assert difference["per_seed"] == pytest.approx([-0.006, -0.142, -0.063])
    means = torch.tensor([-0.006, -0.142, -0.063], dtype=torch.float64)
    half = 4.302652729911275 * means.std().item() / math.sqrt(3)  # t(0.975, 2 df)
    assert (difference["seed_low"], difference["seed_high"]) == pytest.approx((-0.070333 - half, -0.070333 + half),
                                                                              abs=1e-6)
    assert difference["seed_low"] < -0.2 and difference["seed_high"] > 0.05  # about [−0.24, +0.10]
    averaged_first = intervals.paired_difference(intervals.seed_mean(per_seed), [0.0] * 30, groups)
    assert not intervals.covers_zero(averaged_first)  # what the old cells said: −0.070 [−0.072, −0.068]
    assert difference["high"] - difference["low"] > 10 * (averaged_first["high"] - averaged_first["low"])
    assert not intervals.supported(difference) and intervals.supported(averaged_first)
    agreeing = intervals.paired([[m - 0.1 for m in seed] for seed in per_seed], per_seed, groups)
    assert "seed_low" in agreeing and intervals.supported(agreeing)  # every seed −0.1 exactly


def test_cells_of_several_seeds_carry_each_seeds_mean_and_their_t_interval():
    cell = intervals.cell([[1.0, 2.0], [3.0, 4.0], [2.0, 3.0]], [0, 1])
    assert cell["per_seed"] == [1.5, 3.5, 2.5]
    assert (cell["seed_low"], cell["seed_high"]) == pytest.approx((2.5 - 4.302652729911275 / math.sqrt(3),
                                                                   2.5 + 4.302652729911275 / math.sqrt(3)))
    assert "seed_low" not in intervals.cell([[1.0, 2.0]], [0, 1])
