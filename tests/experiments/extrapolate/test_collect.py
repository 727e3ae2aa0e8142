"""extrapolate's collector on synthetic evaluation files: every field of results.json computed by hand.

The evaluations are made-up per-window bits written where a run writes them; the best row of each column, the
paired differences, the first seed's extras and the run's compute time are each checked against what those
numbers say, so a collector that took another seed, row or column, or dropped a window, would fail."""

from pathlib import Path

import pytest
import torch

from posenc import storage
from posenc.experiments.extrapolate import ExperimentConfig
from posenc.experiments.extrapolate.collect import collect, compute_seconds, versus
from posenc.experiments.extrapolate.rows import parse_rows
from posenc.lm.data import Corpus, Split, Windows
from posenc.lm.leakage import train_overlap
from posenc.lm.runtime import provenance

FILES = ("a.py", "b.py", "b.py", "c.py")
#: the row's per-window bits at each length, before the seed's offset: rope best at 16, rope+yarn at 32
BITS = {"none": {"16": [3.0, 3.5, 4.0, 4.5], "32": None},
        "rope": {"16": [1.0, 1.5, 2.0, 2.5], "32": [4.0, 4.0, 5.0, 5.0]},
        "rope+yarn": {"16": [1.5, 2.0, 2.5, 3.0], "32": [2.0, 2.5, 3.0, 3.5]}}
SEED_OFFSET = {5: 0.0, 6: 0.5}


class _Runtime:
    label, world_size = "cpu (test)", 3


def _config(**overrides) -> ExperimentConfig:
    return ExperimentConfig.from_preset("smoke", encodings="none,rope,rope+yarn", seeds=2, seed=5, eval_factors=(1, 2),
                                        **overrides)


def _trainings(with_sweep: bool = False) -> dict:
    trainings = {}
    for trained, parameters in (("none", 100), ("rope", 200)):
        for seed in (5, 6):
            training = {"parameters": {"model": parameters + seed, "encoding": 0}, "wall_time_s": 10.0 * seed}
            if seed == 6:
                training["lr"] = 1e-3  # seed 5 ran before rates were recorded: the config's
            if with_sweep:
                training["sweep"] = {"lr": 1e-3, "at_edge": False, "scores": {"1e-3": 2.0}, "sweep_seconds": 100.0}
            trainings[f"{trained}-seed{seed}"] = training
    return trainings


def _write_evals(config: ExperimentConfig, out: Path) -> None:
    for name, lengths in BITS.items():
        for seed, offset in SEED_OFFSET.items():
            window_bits = {n: None if v is None else [b + offset for b in v] for n, v in lengths.items()}
            storage.write_json(out / "evals" / config.eval_tag / f"{name}-seed{seed}.json", {
                "row": name, "seed": seed, "window_bits": window_bits,
                "bits_per_byte": {n: None if v is None else sum(v) / len(v) for n, v in window_bits.items()},
                "errors": {"32": f"seed {seed}"}, "position_bits": {"seed": seed}, "wall_time_s": seed + 1.0})


def _collect(tmp_path, config=None, trainings=None) -> dict:
    config = config or _config()
    _write_evals(config, tmp_path)
    train = Split(torch.tensor(list(b"abcdefgh" * 8), dtype=torch.uint8), ("t.py",), (0,))
    test = Split(torch.zeros(200, dtype=torch.uint8), ("a.py", "b.py", "c.py"), (0, 50, 120))
    corpus = Corpus(train, train, test, {"sha256": "x", "source": "made up"})
    tokens = torch.tensor([list(b"abcdefghabcdefghabcdefghabcdefgh!")] * 2 + [[0] * 33] * 2)  # two windows in train
    windows = Windows(tokens, FILES, (0, 33, 66, 99))
    return collect(config, parse_rows(config.encodings), corpus, windows, tmp_path, _Runtime(),
                   trainings or _trainings(), 12.5)


def _mean(values) -> float:
    return sum(values) / len(values)


def test_each_cell_is_the_mean_over_both_seeds_and_every_window(tmp_path):
    rows = {row["name"]: row for row in _collect(tmp_path)["rows"]}
    for name, lengths in BITS.items():
        for n, values in lengths.items():
            row = rows[name]
            if values is None:
                assert row["bits_per_byte"][n] is None and row["interval"][n] is None and row["vs_best"][n] is None
                assert row["window_bits"][n] is None and row["bits_per_byte_std"][n] is None
                continue
            assert row["bits_per_byte"][n] == pytest.approx(_mean(values) + 0.25), (name, n)
            assert row["window_bits"][n] == pytest.approx([v + 0.25 for v in values])
            assert row["bits_per_byte_std"][n] == pytest.approx(torch.tensor([0.0, 0.5]).std().item())
            low, high = row["interval"][n]
            assert low < row["bits_per_byte"][n] < high
        assert row["per_seed"] == [{n: None if v is None else _mean(v) + o for n, v in lengths.items()}
                                   for o in SEED_OFFSET.values()]
        assert row["errors"] == {"32": "seed 5"} and row["position_bits"] == {"seed": 5}
        assert row["eval_wall_time_s"] == 6.5


def test_change_from_1x_pairs_each_row_with_its_own_first_column(tmp_path):
    rows = {row["name"]: row for row in _collect(tmp_path)["rows"]}
    assert rows["rope"]["change_from_1x"]["32"]["mean"] == pytest.approx(4.5 - 1.75)
    assert rows["rope+yarn"]["change_from_1x"]["32"]["mean"] == pytest.approx(2.75 - 2.25)
    assert rows["rope"]["change_from_1x"]["16"]["mean"] == 0 and rows["none"]["change_from_1x"]["32"] is None


def test_each_row_is_paired_with_the_best_row_of_its_column(tmp_path):
    rows = {row["name"]: row for row in _collect(tmp_path)["rows"]}
    assert {name: row["vs_best"]["16"]["best"] for name, row in rows.items()} == dict.fromkeys(rows, "rope")
    assert rows["rope+yarn"]["vs_best"]["32"]["best"] == rows["rope"]["vs_best"]["32"]["best"] == "rope+yarn"
    assert rows["rope"]["vs_best"]["16"]["mean"] == 0 and rows["rope+yarn"]["vs_best"]["32"]["mean"] == 0
    assert rows["none"]["vs_best"]["16"]["mean"] == pytest.approx(2.0)
    assert rows["rope+yarn"]["vs_best"]["16"]["mean"] == pytest.approx(0.5)
    assert rows["rope"]["vs_best"]["32"]["mean"] == pytest.approx(1.75)
    assert rows["rope"]["vs_best"]["32"]["seed_low"] <= 1.75 <= rows["rope"]["vs_best"]["32"]["seed_high"]


def test_versus_without_a_best_row_is_none():
    assert versus(None, [[1.0, 2.0]], {}, "16", [0, 1]) is None
    got = versus("b", [[1.0, 2.0]], {"b": {"16": [[0.5, 0.5]]}}, "16", [0, 1])
    assert got["best"] == "b" and got["mean"] == pytest.approx(1.0)


def test_training_fields_come_from_each_rows_checkpoint(tmp_path):
    rows = {row["name"]: row for row in _collect(tmp_path)["rows"]}
    assert rows["none"]["parameters"] == {"model": 105, "encoding": 0}  # the first seed's training
    assert rows["rope+yarn"]["parameters"] == {"model": 205, "encoding": 0}  # its trained encoding's
    assert rows["rope+yarn"]["learning_rates"] == [3e-3, 1e-3]  # the smoke preset's rate where none is recorded
    assert rows["rope"]["train_wall_time_s"] == 55.0 and rows["rope"]["rate_sweeps"] is None
    assert [rows[n]["trained_encoding"] for n in ("none", "rope", "rope+yarn")] == ["none", "rope", "rope"]
    assert rows["rope+yarn"]["description"].startswith("the RoPE checkpoint with YaRN")


def test_the_run_level_fields(tmp_path):
    config = _config()
    results = _collect(tmp_path, config)
    assert results["config"] == config.to_dict() and results["train_length"] == 16
    assert results["eval_lengths"] == [16, 32] and results["protocol"] == "non-overlapping windows"
    assert results["device"] == "cpu (test)" and results["processes"] == 3 and results["this_invocation_s"] == 12.5
    assert results["wall_time_s"] == pytest.approx(4 * 55.0 + 3 * 6.5)  # trainings plus each row's evaluations
    assert results["windows"]["count"] == 4 and results["windows"]["files"] == 3
    assert results["train_overlap"]["in_train"] == 0.5
    assert results["train_overlap"] == train_overlap(Split(torch.tensor(list(b"abcdefgh" * 8), dtype=torch.uint8),
                                                           ("t.py",), (0,)), Windows(
        torch.tensor([list(b"abcdefghabcdefghabcdefghabcdefgh!")] * 2 + [[0] * 33] * 2), FILES, (0, 33, 66, 99)))
    assert results["corpus"] == {"sha256": "x", "source": "made up"} and results["provenance"] == provenance()
    assert [row["name"] for row in results["rows"]] == ["none", "rope", "rope+yarn"]


def test_a_rate_grid_and_a_stride_show_in_the_results(tmp_path):
    config = _config(lrs=(1e-3, 3e-3), eval_stride=8)
    results = _collect(tmp_path, config, _trainings(with_sweep=True))
    assert results["protocol"] == "sliding windows, stride 8"
    assert results["rows"][1]["rate_sweeps"] == [_trainings(True)["rope-seed5"]["sweep"]] * 2
    assert results["wall_time_s"] == pytest.approx(4 * 100.0 + 3 * 6.5)  # every rate's training, not the kept one's


def test_compute_seconds_counts_every_rate_of_a_grid():
    assert compute_seconds({"wall_time_s": 7.0}) == 7.0
    assert compute_seconds({"wall_time_s": 7.0, "sweep": {"sweep_seconds": 30.0}}) == 30.0
    assert compute_seconds({"wall_time_s": 7.0, "sweep": {"lr": 1e-3, "inherited_from": [0]}}) == 7.0  # trained once


def test_a_column_no_row_can_score_has_no_best_row(tmp_path):
    config = ExperimentConfig.from_preset("smoke", encodings="none", seeds=2, seed=5, eval_factors=(1, 2))
    none = _collect(tmp_path, config)["rows"][0]
    assert none["vs_best"]["32"] is None and none["vs_best"]["16"]["best"] == "none"
    assert none["bits_per_byte"]["32"] is None
