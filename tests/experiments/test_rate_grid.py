"""The rate chooser: a grid that grows past its edge while the best rate sits there, and says when it still does."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.experiments.rate_grid import check_grid, check_trained, choose_rate, inherit_rate, rate_key, sweeping_seeds


class Recorder:
    """A dev score by rate, recording each call: bits that fall to a minimum at ``best`` (in log rate)."""

    def __init__(self, best: float):
        self.best, self.calls = best, []

    def __call__(self, rate: float) -> float:
        self.calls.append(rate)
        return 2.0 + (math.log10(rate) - math.log10(self.best)) ** 2


def test_a_choice_inside_the_grid_adds_no_rate():
    score = Recorder(best=3e-4)
    chosen = choose_rate((1e-4, 3e-4, 1e-3), score)
    assert chosen["lr"] == 3e-4 and chosen["widened"] == [] and chosen["at_edge"] is False
    assert score.calls == [1e-4, 3e-4, 1e-3]
    assert list(chosen["scores"]) == ["0.0001", "0.0003", "0.001"]
    assert chosen["scores"]["0.0003"] == 2.0


def test_the_largest_rate_best_widens_upward_one_step_at_a_time_until_inside():
    score = Recorder(best=1e-2)
    chosen = choose_rate((1e-4, 1e-3), score, widenings=3)
    assert score.calls == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1])  # the grid's own ratio, 10, at that end
    assert chosen["lr"] == pytest.approx(1e-2) and chosen["at_edge"] is False
    assert chosen["widened"] == pytest.approx([1e-2, 1e-1])
    assert list(chosen["scores"]) == ["0.0001", "0.001", "0.01", "0.1"]


def test_the_smallest_rate_best_widens_downward_by_the_ratio_at_that_end():
    score = Recorder(best=1e-6)
    chosen = choose_rate((1e-4, 2e-4, 1e-3), score, widenings=1)
    assert score.calls == pytest.approx([1e-4, 2e-4, 1e-3, 5e-5])  # 1e-4 / (2e-4 / 1e-4)
    assert chosen["lr"] == pytest.approx(5e-5) and chosen["at_edge"] is True  # the one widening was not enough
    assert chosen["widened"] == pytest.approx([5e-5])


def test_no_widenings_keeps_the_grid_and_names_the_edge():
    score = Recorder(best=1.0)
    chosen = choose_rate((1e-3, 3e-3), score, widenings=0)
    assert score.calls == [1e-3, 3e-3] and chosen["lr"] == 3e-3 and chosen["at_edge"] is True


def test_one_rate_is_a_fixed_rate_not_a_choice():
    score = Recorder(best=1.0)
    chosen = choose_rate([1e-3], score)
    assert score.calls == [1e-3] and chosen == {"lr": 1e-3, "scores": {"0.001": score(1e-3)}, "widened": [],
                                                 "at_edge": False}


def test_ties_go_to_the_smaller_rate_and_the_grid_is_sorted_first():
    chosen = choose_rate((1e-3, 1e-4, 3e-4), lambda rate: 1.0 if rate > 1e-4 else 2.0, widenings=0)
    assert chosen["lr"] == 3e-4 and list(chosen["scores"]) == ["0.0001", "0.0003", "0.001"]


@pytest.mark.parametrize("rates, message", [
    ((), "--lrs needs at least one learning rate"),
    ((1e-3, 0.0), "--lrs must be a finite number > 0.0, got 0.0"),
    ((1e-3, -1e-3), "--lrs must be a finite number > 0.0"),
    ((1e-3, 0.001), "--lrs must not repeat a rate, got 0.001, 0.001"),
])
def test_bad_grids_are_refused_by_name(rates, message):
    with pytest.raises(ValueError, match=message):
        check_grid("--lrs", rates)


def test_negative_widenings_are_refused_by_name():
    with pytest.raises(ValueError, match="widenings must be an integer >= 0"):
        choose_rate((1e-3, 3e-3), Recorder(1e-3), widenings=-1)


def test_rate_key_is_the_folder_spelling():
    assert rate_key(3e-4) == "0.0003" and rate_key(1e-5) == "1e-05"


@settings(max_examples=60, deadline=None)
@given(best_exponent=st.floats(-7, 1), low_exponent=st.integers(-6, -2), points=st.integers(2, 4),
       widenings=st.integers(0, 6))
def test_a_choice_off_the_edge_has_worse_neighbours_on_both_sides(best_exponent, low_exponent, points, widenings):
    score = Recorder(best=10.0 ** best_exponent)
    rates = [10.0 ** (low_exponent + i / 2) for i in range(points)]
    chosen = choose_rate(rates, score, widenings=widenings)
    scored = sorted(float(rate) for rate in chosen["scores"])
    assert len(score.calls) == len(scored) == points + len(chosen["widened"]) <= points + widenings
    position = min(range(len(scored)), key=lambda i: abs(scored[i] - chosen["lr"]))
    assert chosen["at_edge"] == (position in (0, len(scored) - 1))
    if not chosen["at_edge"]:
        value = chosen["scores"][rate_key(chosen["lr"])]
        assert value <= min(chosen["scores"][rate_key(scored[position - 1])],
                            chosen["scores"][rate_key(scored[position + 1])])
    if len(chosen["widened"]) < widenings:  # it stopped early: because the choice came inside
        assert not chosen["at_edge"]


def test_choose_rate_names_its_grid_in_errors():
    with pytest.raises(ValueError, match="^learning rates needs at least one learning rate$"):
        choose_rate((), Recorder(1e-3))
    with pytest.raises(ValueError, match=r"^--finetune-lrs must be a finite number > 0.0, got -1.0$"):
        choose_rate((1e-3, -1.0), Recorder(1e-3), name="--finetune-lrs")


def test_by_default_a_grid_grows_at_most_twice():
    chosen = choose_rate((1e-4, 1e-3), Recorder(best=1.0))
    assert chosen["widened"] == pytest.approx([1e-2, 1e-1]) and chosen["at_edge"] is True


def sweep(scores: dict[str, float], lr: float, widened=(), at_edge=False) -> dict:
    return {"lr": lr, "scores": scores, "widened": list(widened), "at_edge": at_edge}


def test_a_later_seed_inherits_the_lowest_mean_over_the_rates_every_sweep_scored():
    # seed 0 alone prefers 1e-3, seed 1 alone 3e-3; means: 1e-3 (1.0 + 3.0) / 2 = 2.0, 3e-3 (2.0 + 1.5) / 2 = 1.75;
    # 1e-2 was scored by seed 1 only (a widening), so it is no candidate however low it is
    first = sweep({"0.001": 1.0, "0.003": 2.0}, 1e-3)
    second = sweep({"0.001": 3.0, "0.003": 1.5, "0.01": 0.5}, 1e-2, widened=[1e-2])
    inherited = inherit_rate((1e-3, 3e-3), [first, second], range(4, 6))
    assert inherited == {"lr": 3e-3, "inherited_from": [4, 5], "mean_scores": {"0.001": 2.0, "0.003": 1.75},
                         "at_edge": True}


def test_one_sweeping_seed_passes_on_its_own_choice_at_the_exact_rate_it_trained():
    widened = 1e-3 * 1e-3 / 3e-3  # 0.000333333..., written "0.000333333": the folder's key, not the rate
    first = sweep({"0.000333333": 0.5, "0.001": 1.0, "0.003": 2.0, "0.01": 3.0}, widened, widened=[widened])
    inherited = inherit_rate((1e-3, 3e-3, 1e-2), [first], range(0, 1))
    assert inherited["lr"] == widened and inherited["at_edge"] and inherited["inherited_from"] == [0]
    inside = inherit_rate((1e-3, 3e-3, 1e-2), [sweep({"0.001": 2.0, "0.003": 1.0, "0.01": 3.0}, 3e-3)], range(1))
    assert inside["lr"] == 3e-3 and not inside["at_edge"]


def test_tied_means_inherit_the_smaller_rate():
    tied = [sweep({"0.001": 1.0, "0.003": 2.0}, 1e-3), sweep({"0.001": 2.0, "0.003": 1.0}, 3e-3)]
    assert inherit_rate((1e-3, 3e-3), tied, range(2))["lr"] == 1e-3


def test_rates_are_ordered_by_value_not_by_how_they_print():
    # "1e-05" sorts after "0.01" as text; by value it is the smallest, so 1e-3 is inside the rates and no edge
    scores = {"1e-05": 2.0, "0.001": 1.0, "0.01": 3.0}
    inherited = inherit_rate((1e-5, 1e-3, 1e-2), [sweep(scores, 1e-3)], range(1))
    assert list(inherited["mean_scores"]) == ["1e-05", "0.001", "0.01"] and not inherited["at_edge"]


def test_one_shared_rate_is_no_edge():
    inherited = inherit_rate((1e-3,), [sweep({"0.001": 1.0}, 1e-3)], range(1))
    assert inherited["lr"] == 1e-3 and not inherited["at_edge"]


def test_inheriting_needs_a_sweep_per_seed_and_a_shared_rate():
    with pytest.raises(ValueError, match="one sweep per seed"):
        inherit_rate((1e-3,), [], range(1))
    with pytest.raises(ValueError, match="one sweep per seed, got 1 sweeps for seeds \\[0, 1\\]"):
        inherit_rate((1e-3,), [sweep({"0.001": 1.0}, 1e-3)], range(2))
    with pytest.raises(ValueError, match="share no rate"):
        inherit_rate((1e-3, 3e-3), [sweep({"0.001": 1.0}, 1e-3), sweep({"0.003": 1.0}, 3e-3)], range(2))


def test_the_sweeping_seeds_are_the_first_k_and_zero_means_every_seed():
    assert sweeping_seeds(3, 5, 0, (1e-3, 3e-3)) == range(3, 8)
    assert sweeping_seeds(3, 5, 2, (1e-3, 3e-3)) == range(3, 5)
    assert sweeping_seeds(0, 5, 5, (1e-3,)) == range(5)


@pytest.mark.parametrize("seeds, k, grid, message", [
    (5, -1, (1e-3,), r"^--lr-sweep-seeds must be an integer >= 0, got -1$"),
    (5, 6, (1e-3,), r"^--lr-sweep-seeds must be between 1 and --seeds \(5\), got 6$"),
    (5, 1, (), r"^--lr-sweep-seeds says which seeds sweep a grid of --lrs; give --lrs too$"),
])
def test_bad_sweeping_seeds_are_refused_by_name(seeds, k, grid, message):
    with pytest.raises(ValueError, match=message):
        sweeping_seeds(0, seeds, k, grid)


@pytest.mark.parametrize("diverged", [math.nan, math.inf])
def test_a_diverged_rate_ranks_last_wherever_it_sits_in_the_grid(diverged):
    scores = {1e-4: diverged, 1e-3: 2.5, 1e-2: 2.0, 1e-1: diverged}  # the smallest rate first: min() kept a NaN
    chosen = choose_rate(tuple(scores), scores.get, widenings=0)
    assert chosen["lr"] == 1e-2 and chosen["at_edge"] is False


def test_a_diverged_rate_past_the_edge_keeps_the_edges_choice():
    scores = {1e-3: 2.5, 1e-2: 2.0, 1e-1: math.nan}  # widened upward from 1e-2 once: 1e-1 diverges
    chosen = choose_rate((1e-3, 1e-2), lambda rate: scores[float(f"{rate:g}")], widenings=1)
    assert chosen["widened"] == pytest.approx([1e-1]) and chosen["lr"] == 1e-2 and chosen["at_edge"] is False


def test_every_rate_diverged_is_refused_with_each_score():
    with pytest.raises(ValueError, match=r"^every rate of --lrs diverged \(0\.1: nan, 1: inf\): try smaller rates$"):
        choose_rate((0.1, 1.0), {0.1: math.nan, 1.0: math.inf}.get, widenings=0, name="--lrs")


def test_an_inherited_rate_skips_a_diverged_mean():
    sweeps = [{"scores": {"0.001": math.nan, "0.01": 2.0}, "widened": []},
              {"scores": {"0.001": 1.0, "0.01": 2.1}, "widened": []}]
    assert inherit_rate((1e-3, 1e-2), sweeps, [0, 1])["lr"] == 1e-2


def test_a_run_trained_at_one_rate_is_refused_when_its_loss_diverged():
    assert check_trained("rope (seed 0)", {"final_loss": 2.0}, 1e-3) == {"final_loss": 2.0}
    for loss in (math.nan, math.inf):
        with pytest.raises(ValueError, match=rf"^rope \(seed 0\) diverged at learning rate 1e\+09 \(final training "
                                             rf"loss {loss}\): start a new run with a smaller --lr, or a grid"):
            check_trained("rope (seed 0)", {"final_loss": loss}, 1e9)
