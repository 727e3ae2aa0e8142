"""The task experiment's collector on synthetic evaluation files: each row's cells, dev means and training
fields computed by hand, with recall's answers grouped by the sequence that asked them."""

import pytest

from posenc import storage
from posenc.experiments import intervals
from posenc.experiments.tasks import TaskConfig
from posenc.experiments.tasks.collect import cells, collect, means, sequences
from posenc.experiments.tasks.config import DEV_SEED, TEST_SEED


def _config(task="copy", **overrides) -> TaskConfig:
    return TaskConfig.from_preset(task, "smoke", **{"encodings": "none,rope+randomized", "device": "cpu", "seeds": 2,
                                                    "seed": 3, "eval_sequences": 4, **overrides})


def _items(config: TaskConfig, length: int, right: list[float]) -> list[float]:
    """Each sequence's items all ``right[sequence]``."""
    per_sequence = config.task_spec.scored_per_sequence(length)
    return [right[item // per_sequence] for item in range(per_sequence * config.eval_sequences)]


#: per row and seed, the share right of each of the four sequences, at every length
RIGHT = {("none", 3): [1.0, 1.0, 0.0, 0.0], ("none", 4): [1.0, 0.0, 0.0, 0.0],
         ("rope+randomized", 3): [1.0, 1.0, 1.0, 0.0], ("rope+randomized", 4): [1.0, 1.0, 1.0, 1.0]}


def _write(config: TaskConfig, out, old_row: str | None = None) -> None:
    for (name, seed), right in RIGHT.items():
        scores = {str(n): _items(config, n, right) for n in config.eval_lengths}
        record = {"row": name, "seed": seed, "exact_match": scores,
                  "dev_exact_match": {n: [1.0 - v for v in values] for n, values in scores.items()}}
        if name == old_row:
            del record["dev_exact_match"]  # an evaluation made before dev sequences existed
        storage.write_json(out / "evals" / f"{name}-seed{seed}.json", record)


def _trainings(with_sweep=False) -> dict:
    trainings = {}
    for name in ("none", "rope+randomized"):
        for seed in (3, 4):
            trainings[f"{name}-seed{seed}"] = {"wall_time_s": 10.0 + seed, **({"lr": 1e-3} if seed == 4 else {}),
                                               **({"sweep": {"seed": seed}} if with_sweep else {})}
    return trainings


@pytest.mark.parametrize("task", ["copy", "recall"])
def test_each_cell_is_the_share_right_over_seeds_and_sequences(task, tmp_path):
    config = _config(task)
    _write(config, tmp_path)
    results = collect(config, tmp_path, _trainings(), 4.5)
    none, rope = results["rows"]
    for n in map(str, config.eval_lengths):
        assert none["exact_match"][n]["mean"] == pytest.approx(0.375)  # (0.5 + 0.25) / 2
        assert none["exact_match"][n]["per_seed"] == pytest.approx([0.5, 0.25])
        assert rope["exact_match"][n]["mean"] == pytest.approx(0.875)
        assert none["dev_exact_match"][n] == pytest.approx(0.625) and rope["dev_exact_match"][n] == pytest.approx(0.125)
        groups = sequences(config, n, len(_items(config, int(n), [0.0] * 4)))
        assert none["exact_match"][n] == intervals.cell(
            [_items(config, int(n), RIGHT[("none", s)]) for s in (3, 4)], groups)
    assert (none["encoding"], none["randomized_positions"]) == ("none", False)
    assert (rope["name"], rope["encoding"], rope["randomized_positions"]) == ("rope+randomized", "rope", True)
    assert not (tmp_path / "results.json").exists()  # the report writes it, beside results.md


def test_recall_cells_resample_sequences_not_answers():
    config = _config("recall")
    length = config.eval_lengths[-1]
    asked = config.task_spec.scored_per_sequence(length)
    assert asked > 1
    assert sequences(config, str(length), asked * 4) == [item // asked for item in range(asked * 4)]
    one = cells(config, [{str(n): _items(config, n, [1.0, 0.0, 1.0, 0.0]) for n in config.eval_lengths}])
    by_answer = intervals.cell([_items(config, length, [1.0, 0.0, 1.0, 0.0])], list(range(asked * 4)))
    assert one[str(length)] != by_answer and one[str(length)]["mean"] == by_answer["mean"] == 0.5
    assert one[str(length)]["high"] - one[str(length)]["low"] > by_answer["high"] - by_answer["low"]
    with pytest.raises(ValueError, match=f"expected {asked} for each of 4 sequences"):
        sequences(config, str(length), asked * 4 + 1)


def test_a_length_with_no_items_is_none_in_cells_and_means():
    config = _config()
    first, last = map(str, config.eval_lengths[:1] + config.eval_lengths[-1:])
    scores = {str(n): _items(config, n, [1.0, 0.0, 0.0, 0.0]) for n in config.eval_lengths}
    scores[last] = None
    assert cells(config, [scores, scores])[last] is None and means(config, [scores])[last] is None
    assert means(config, [scores, {**scores, first: [0.5] * 4}])[first] == pytest.approx((0.25 + 0.5) / 2)


def test_training_fields_and_run_fields(tmp_path):
    config = _config()
    _write(config, tmp_path, old_row="none")
    results = collect(config, tmp_path, _trainings(), 4.5)
    none, rope = results["rows"]
    assert none["dev_exact_match"] is None and rope["dev_exact_match"] is not None
    assert none["train_seconds"] == [13.0, 14.0] and rope["learning_rates"] == [config.lr, 1e-3]
    assert none["rate_sweeps"] is None
    assert results["task"] == "copy" and results["task_spec"] == str(config.task_spec)
    assert results["seeds"] == 2 and results["train_length"] == config.train_length == 8
    assert results["eval_lengths"] == config.eval_lengths and results["config"] == config.to_dict()
    assert results["splits"] == {"dev": {"sequences": 4, "generator_seed": f"{DEV_SEED} + length"},
                                 "test": {"sequences": 4, "generator_seed": f"{TEST_SEED} + length"}}
    assert results["interval"].startswith("95% bootstrap over the 4 test sequences per length")
    assert results["wall_time_s"] == 4.5 and "commit" in results["provenance"]


def test_a_rate_grid_keeps_each_seeds_sweep(tmp_path):
    config = _config(lrs=(1e-3, 3e-3))
    _write(config, tmp_path)
    rows = collect(config, tmp_path, _trainings(with_sweep=True), 1.0)["rows"]
    assert rows[1]["rate_sweeps"] == [{"seed": 3}, {"seed": 4}]
