"""The rate chooser: a grid that grows past its edge while the best rate sits there, and says when it still does."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.experiments.rate_grid import check_grid, choose_rate, rate_key


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
    ((1e-3, 0.0), "--lrs must be a number > 0.0, got 0.0"),
    ((1e-3, -1e-3), "--lrs must be a number > 0.0"),
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
    with pytest.raises(ValueError, match=r"^--finetune-lrs must be a number > 0.0, got -1.0$"):
        choose_rate((1e-3, -1.0), Recorder(1e-3), name="--finetune-lrs")


def test_by_default_a_grid_grows_at_most_twice():
    chosen = choose_rate((1e-4, 1e-3), Recorder(best=1.0))
    assert chosen["widened"] == pytest.approx([1e-2, 1e-1]) and chosen["at_edge"] is True
