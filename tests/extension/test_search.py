import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.extension.search import (Candidate, SearchConfig, best_loss_per_generation, constrain, crossover,
                                       is_monotone, mutate, search)

F = 8
OPTIMUM = (1.0, 1.0, 1.5, 2.0, 3.0, 4.0, 4.0, 5.5)  # monotone, inside [1, max_factor]
SEEDS = [Candidate((4.0,) * F), Candidate(tuple(1.0 + 3.0 * i / (F - 1) for i in range(F))), Candidate((1.0,) * F)]


def distance(candidate: Candidate) -> float:
    return sum((a - b) ** 2 for a, b in zip(candidate.factors, OPTIMUM)) + 0.01 * abs(candidate.n_hat - 4)


def synthetic(candidates):
    return [distance(c) for c in candidates]


def config(**overrides):
    return SearchConfig(**{"population": 12, "generations": 12, "parents": 4, "max_factor": 6.0,
                           "n_hat_choices": (0, 2, 4, 8), "seed": 3, **overrides})


def all_candidates(state):
    return [Candidate.from_dict(c) for g in state["generations"] for c in g["candidates"]]


def test_search_moves_toward_a_known_optimum_and_never_leaves_the_constraints(tmp_path):
    state = search(synthetic, SEEDS, config(), tmp_path / "log.json", log=lambda *_: None)
    losses = best_loss_per_generation(state)
    assert losses[-1] < 0.25 * losses[0]  # far closer than the best seed
    assert all(b <= a for a, b in zip(losses, losses[1:]))  # elitism: the best never rises
    for candidate in all_candidates(state):
        assert is_monotone(candidate.factors, 6.0) and candidate.n_hat in (0, 2, 4, 8)
        if candidate not in SEEDS:  # seeds enter as given; the search's own proposals are on the 0.01 grid
            assert all(abs(f * 100 - round(f * 100)) < 1e-6 for f in candidate.factors)
    best = Candidate.from_dict(state["best"])
    assert state["best"]["loss"] == pytest.approx(distance(best))
    assert json.loads((tmp_path / "log.json").read_text()) == state
    assert all(g["candidates_per_s"] > 0 for g in state["generations"])


def test_the_first_generation_holds_the_seeds(tmp_path):
    state = search(synthetic, SEEDS, config(generations=1), tmp_path / "log.json", log=lambda *_: None)
    first = all_candidates(state)
    assert first[:3] == SEEDS and len(first) == 12 and len(set(first)) == 12


def test_same_seed_same_search_other_seed_other_search(tmp_path):
    a = search(synthetic, SEEDS, config(generations=4), tmp_path / "a.json", log=lambda *_: None)
    b = search(synthetic, SEEDS, config(generations=4), tmp_path / "b.json", log=lambda *_: None)
    c = search(synthetic, SEEDS, config(generations=4, seed=4), tmp_path / "c.json", log=lambda *_: None)
    assert all_candidates(a) == all_candidates(b)
    assert all_candidates(a) != all_candidates(c)


monotone_factors = st.lists(st.integers(100, 600), min_size=F, max_size=F).map(
    lambda xs: tuple(x / 100 for x in sorted(xs)))


@settings(max_examples=200, deadline=None)
@given(monotone_factors, monotone_factors, st.integers(0, 2**31), st.floats(0.05, 1.0))
def test_mutation_and_crossover_only_propose_monotone_candidates(a, b, seed, probability):
    import random

    rng = random.Random(seed)
    cfg = config(mutation_probability=probability)
    first, second = Candidate(a, 0), Candidate(b, 4)
    for child in (mutate(first, cfg, rng), mutate(second, cfg, rng), crossover(first, second, cfg, rng)):
        assert is_monotone(child.factors, cfg.max_factor), child
        assert len(child.factors) == F and child.n_hat in cfg.n_hat_choices


@given(st.lists(st.floats(-5, 20, allow_nan=False), min_size=1, max_size=12))
def test_constrain_gives_monotone_factors_in_range(values):
    assert is_monotone(constrain(values, 6.0), 6.0)


KILLABLE = """
import sys, time
sys.path.insert(0, {tests!r})
from tests.extension.test_search import SEEDS, config, synthetic
from posenc.extension.search import search
def slow(candidates):
    time.sleep(0.05)
    return synthetic(candidates)
search(slow, SEEDS, config(), {log!r}, log=lambda *_: None)
"""


def test_sigkill_mid_search_then_resume_gives_the_uninterrupted_result(tmp_path):
    reference = search(synthetic, SEEDS, config(), tmp_path / "reference.json", log=lambda *_: None)
    log = tmp_path / "killed.json"
    script = KILLABLE.format(tests=str(Path(__file__).parents[2]), log=str(log))
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and process.poll() is None:
        if log.exists() and len(json.loads(log.read_text())["generations"]) >= 3:
            break
        time.sleep(0.01)
    process.kill()
    process.wait()
    assert log.exists(), process.stderr.read().decode()[-2000:]
    done_before = len(json.loads(log.read_text())["generations"])
    assert done_before < 12, "the search finished before the kill; slow the objective down"
    evaluated = []

    def counting(candidates):
        evaluated.extend(candidates)
        return synthetic(candidates)

    resumed = search(counting, SEEDS, config(), log, log=lambda *_: None)
    assert resumed["best"] == reference["best"]
    assert all_candidates(resumed) == all_candidates(reference)
    assert not set(evaluated) & set(all_candidates({"generations": resumed["generations"][:done_before]}))


def test_a_damaged_or_foreign_log_is_named(tmp_path):
    log = tmp_path / "log.json"
    search(synthetic, SEEDS, config(generations=2), log, log=lambda *_: None)
    with pytest.raises(ValueError, match="another config"):
        search(synthetic, SEEDS, config(generations=2, seed=9), log, log=lambda *_: None)
    log.write_text(log.read_text()[:100])
    with pytest.raises(ValueError, match=f"search log {log} is damaged or truncated"):
        search(synthetic, SEEDS, config(generations=2), log, log=lambda *_: None)


@pytest.mark.parametrize("overrides, message", [
    ({"population": 3}, "search population must be an integer >= 4"),
    ({"parents": 12}, "must be fewer than the population"),
    ({"max_factor": 0.5}, "max_factor must be a finite number >= 1.0"),
    ({"n_hat_choices": (-1,)}, "n_hat_choices must be integers >= 0"),
])
def test_bad_search_settings(overrides, message):
    with pytest.raises(ValueError, match=message):
        config(**overrides)
