"""Round-robin timing on a clock the test moves: every ratio and quartile a bench table prints, computed by hand."""

import types

import pytest
import torch

from posenc.bench import timing
from posenc.bench.timing import round_robin


class Clock:
    """``perf_counter`` for ``timing``: each contender call moves it by that call's made-up duration (seconds)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def contender(self, durations: list[float], calls: list[int]):
        def call():
            calls.append(1)
            self.now += durations[len(calls) - 1]
        return call


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    return clock


def test_round_robin_calls_one_of_each_contender_per_round_and_names_a_missing_baseline(clock):
    calls = []
    a, b = clock.contender([1.0] * 4, []), clock.contender([2.0] * 4, [])
    timed = round_robin({"a": lambda: (calls.append("a"), a()), "b": lambda: (calls.append("b"), b())}, baseline="a",
                        rounds=3, device=torch.device("cpu"), warmup=0)
    assert calls == ["a", "b"] * 3
    assert (timed["a"]["ratio"], timed["b"]["ratio"]) == (1.0, 2.0)
    with pytest.raises(ValueError, match=r"^baseline 'c' is not one of the contenders \['a'\]$"):
        round_robin({"a": lambda: None}, baseline="c", rounds=1, device=torch.device("cpu"))


def test_the_ratio_is_the_median_of_each_rounds_ratio_and_its_spread_the_quartiles(clock):
    """Per-round ratios 0.5, 1.5, 1, 2: median 1.25 and quartiles 0.625, 1.875 (the exclusive method), where the
    ratio of medians would be 3.5 / 3. Durations are binary fractions, so every value is exact."""
    base_calls, other_calls = [], []
    baseline = clock.contender([9.0, 2.0, 2.0, 4.0, 4.0], base_calls)  # the warm-up call (9 s) is not timed
    other = clock.contender([9.0, 1.0, 3.0, 4.0, 8.0], other_calls)
    timed = round_robin({"base": baseline, "other": other}, baseline="base", rounds=4, device=torch.device("cpu"))
    assert len(base_calls) == len(other_calls) == 5
    assert timed["base"] == {"ms": 3000.0, "ratio": 1.0, "ratio_low": 1.0, "ratio_high": 1.0}
    assert timed["other"] == {"ms": 3500.0, "ratio": 1.25, "ratio_low": 0.625, "ratio_high": 1.875}


def test_warm_up_calls_each_contender_that_many_times_before_any_round(clock):
    calls = {"a": [], "b": []}
    contenders = {name: clock.contender([1.0] * 2 + [0.5, 0.25], calls[name]) for name in calls}
    timed = round_robin(contenders, baseline="a", rounds=2, device=torch.device("cpu"), warmup=2)
    assert len(calls["a"]) == len(calls["b"]) == 4
    assert timed["b"]["ms"] == 375.0  # the median of the two timed calls, 0.5 and 0.25 s; warm-up not among them


def test_one_round_is_its_own_spread(clock):
    timed = round_robin({"a": clock.contender([0.0, 2.0], []), "b": clock.contender([0.0, 1.0], [])}, baseline="a",
                        rounds=1, device=torch.device("cpu"))
    assert timed["b"] == {"ms": 1000.0, "ratio": 0.5, "ratio_low": 0.5, "ratio_high": 0.5}


def test_a_gpu_call_is_timed_between_two_synchronizations(clock, monkeypatch):
    """On a GPU a call returns once its kernels are queued: without a synchronize before and after each call, the
    timing would be of the launches."""
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: events.append(("sync", device)))
    call = clock.contender([0.0, 1.0, 1.0], [])
    round_robin({"a": lambda: (events.append("call"), call())}, baseline="a", rounds=2, device=torch.device("cuda", 1))
    sync = ("sync", torch.device("cuda", 1))
    assert events == ["call"] + [sync, "call", sync] * 2  # the warm-up call is not timed: no synchronize around it
