"""``posenc task``: the smoke run end to end, resume, the scorer through the pipeline, bad input."""

import argparse
import json

import pytest
import torch

from posenc.cli import main
from posenc.experiments.tasks import TaskConfig, run, task_rows
from posenc.experiments.tasks import collect, stages
from posenc.experiments.tasks.config import DEV_SEED, TEST_SEED
from posenc.lm.runtime import provenance, provenance_line
from posenc.lm.tasks import CopyTask
from tests.lm.test_tasks import copy_solver

ROWS = "none,learned,alibi,rope+randomized"


def smoke(task="copy", **overrides):
    return TaskConfig.from_preset(task, "smoke", **{"encodings": ROWS, "device": "cpu", **overrides})


@pytest.mark.parametrize("task", ["copy", "recall"])
def test_smoke_run_writes_table_figure_and_resumes(task, tmp_path):
    out = tmp_path / task
    results = run(smoke(task), out, log=lambda *_: None)
    assert [row["name"] for row in results["rows"]] == ROWS.split(",")
    assert results["eval_lengths"] == [8, 16, 32, 64]
    learned = results["rows"][1]["exact_match"]
    assert learned["8"] is not None and learned["16"] is None  # no table rows past the training length
    cell = results["rows"][0]["exact_match"]["64"]
    assert 0 <= cell["low"] <= cell["mean"] <= cell["high"] <= 1
    assert results["rows"][3]["randomized_positions"] and not results["rows"][2]["randomized_positions"]
    for name in ("results.json", "results.md", "tasks.png", "config.json"):
        assert (out / name).exists()
    assert "| rope+randomized |" in (out / "results.md").read_text()
    assert results["splits"] == {"dev": {"sequences": 32, "generator_seed": "2000003 + length"},
                                 "test": {"sequences": 32, "generator_seed": "1000003 + length"}}
    assert "## Dev sequences" in (out / "results.md").read_text()
    for row in results["rows"]:  # dev is scored where test is, on other sequences
        assert [v is None for v in row["dev_exact_match"].values()] == [c is None for c in row["exact_match"].values()]
    messages = []
    again = run(smoke(task), out, resume=True, log=messages.append)
    assert sum("already trained" in m for m in messages) == 4
    assert again["rows"] == json.loads((out / "results.json").read_text())["rows"]
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        run(smoke(task), out, log=lambda *_: None)
    with pytest.raises(ValueError, match=r"differs in \['steps'\]"):
        run(smoke(task, steps=21), out, resume=True, log=lambda *_: None)


def test_the_pipeline_scores_a_perfect_copier_1_and_one_wrong_token_0(tmp_path):
    """The evaluation scores whole sequences: a model right everywhere gets 1.0 at every length,
    one wrong token in each sequence gets 0.0."""
    config = smoke(encodings="none")
    task = config.task_spec

    class Copier(torch.nn.Module):
        def __init__(self, wrong: bool):
            super().__init__()
            self.wrong = wrong

        def forward(self, tokens):
            logits = copy_solver(tokens, task)
            if self.wrong:  # the last scored token of every row
                logits[:, -1] = logits[:, -1].roll(1, dims=-1)
            return logits

    for wrong, expected in ((False, 1.0), (True, 0.0)):
        out = tmp_path / str(wrong)
        stages._evaluate(config, "copier", Copier(wrong), 0, out, type("R", (), {"device": "cpu"})(), lambda *_: None)
        written = json.loads((out / "evals" / "copier-seed0.json").read_text())
        for scores in (written["exact_match"], written["dev_exact_match"]):
            assert all(values == [expected] * config.eval_sequences for values in scores.values())
    assert isinstance(task, CopyTask)


def test_cli_task_flags(tmp_path, capsys):
    assert main(["task", "copy", "--preset", "smoke", "--out", str(tmp_path / "run"), "--device", "cpu"]) == 0
    assert "Exact match on copy" in capsys.readouterr().out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    rows = [row["name"] for row in results["rows"]]
    assert results["provenance"] == provenance()  # versions, commit and CPU
    assert provenance_line(results["provenance"]) in (tmp_path / "run" / "results.md").read_text()
    assert rows == list(task_rows())  # the default rows: every encoding and rope+randomized
    with pytest.raises(SystemExit):  # text is extrapolate's: a synthetic task makes its own sequences
        main(["task", "copy", "--preset", "smoke", "--text", "x.txt"])
    assert "unrecognized arguments: --text x.txt" in capsys.readouterr().err
    for args, message in [
        (["--encodings", "rope+magic"], "unknown row 'rope\\+magic'"),
        (["--train-length", "7"], "copy needs an even length"),
        (["--steps", "0"], "--steps must be an integer >= 1, got 0"),
        (["--layers", "-1"], "--layers must be an integer >= 1, got -1"),
        (["--eval-factors", "0,2"], "--eval-factors must be integers >= 1, got 0,2"),
    ]:
        assert main(["task", "copy", "--preset", "smoke", "--out", str(tmp_path / "x"), *args]) == 2
        assert message.replace("\\", "") in capsys.readouterr().err  # one line, before any work
        assert not (tmp_path / "x").exists()


def test_recall_answers_are_resampled_by_their_sequence():
    """A recall sequence's answers share it: the cell's bootstrap draws sequences. Half the sequences all right and
    half all wrong is a mean of 0.5 over n sequences, not over n × asked answers: the interval is about as wide as
    a coin over the sequences (±1.96·0.5/√n), not √asked times narrower."""
    config = smoke("recall", encodings="none")
    length, sequences = 32, config.eval_sequences
    asked = config.task_spec.scored_per_sequence(length)
    assert asked > 1 and config.task_spec.scored_per_sequence(length) == config.task_spec.asked(length)
    groups = collect.sequences(config, str(length), asked * sequences)
    assert groups[: asked + 1] == [0] * asked + [1] and groups[-1] == sequences - 1
    right = [float(sequence % 2 == 0) for sequence in groups]
    cell = collect.intervals.cell([right], groups)
    half_width = 1.96 * 0.5 / sequences**0.5
    assert cell["mean"] == 0.5 and cell["high"] - cell["low"] > 1.5 * half_width
    with pytest.raises(ValueError, match="expected 8 for each of"):
        collect.sequences(config, str(length), asked * sequences - 1)
    assert CopyTask().scored_per_sequence(length) == 1


def test_dev_and_test_ask_different_sequences_and_an_old_run_has_no_dev():
    """The two splits' generators differ, so a model tuned on dev is never scored on what it was tuned by; an
    evaluation file from before dev sequences existed still collects, with no dev values and no dev table."""
    config = smoke("recall", encodings="none")
    task = config.task_spec
    dev, test = (task.batch(16, 4, torch.Generator().manual_seed(seed + 16), full=True)[0]
                 for seed in (DEV_SEED, TEST_SEED))
    assert not torch.equal(dev, test)
    scores = {str(n): [1.0] * (task.scored_per_sequence(n) * config.eval_sequences) for n in config.eval_lengths}
    assert collect.means(config, [scores, {**scores, "8": [0.0] * len(scores["8"])}])["8"] == 0.5
    from posenc.experiments.tasks import report
    old = {"train_length": 8, "eval_lengths": [8], "rows": [{"name": "none", "dev_exact_match": None}]}
    assert report.dev_rows(old) is None


def test_layout_rows_train_their_local_and_global_layers(tmp_path):
    """A layout is a row like an encoding (and with randomized positions, whose windows then come from the positions,
    not the block kernel): two layers, the first local with a quarter of the training length, the last global."""
    config = smoke(encodings="swa+global,irope+randomized", num_layers=2)
    gemma = config.model_config("swa+global", False)
    assert gemma.encoding == "rope" and gemma.encoding_kwargs == {"base": 1_000_000.0}
    assert gemma.layers == ({"encoding": "rope", "encoding_kwargs": {}, "window": 2}, {})
    assert config.model_config("irope", True).layers[0]["chunk"] == 2
    results = run(config, tmp_path, log=lambda *_: None)
    assert [row["name"] for row in results["rows"]] == ["swa+global", "irope+randomized"]
    assert all(0 <= row["exact_match"]["64"]["mean"] <= 1 for row in results["rows"])


def test_task_rows_named_all_or_default_are_every_row_and_others_are_kept():
    from posenc.experiments.tasks import command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    for word in ("all", "default"):
        assert command.config_of(parser.parse_args(["copy", "--encodings", word])).encodings == ",".join(task_rows())
    assert command.config_of(parser.parse_args(["recall", "--encodings", "rope,alibi"])).encodings == "rope,alibi"
