"""``--lrs`` on the synthetic tasks: each row and seed trains at every rate (widened past an edge), keeps the rate
whose model has the lowest dev loss at the training length, and is evaluated with that rate's weights."""

import json
import math

import pytest
import torch

from posenc import storage
from posenc.cli import main
from posenc.experiments import published
from posenc.experiments.tasks import TaskConfig, run
from posenc.experiments.tasks import stages
from posenc.experiments.tasks.config import DEV_SEED, TEST_SEED
from posenc.lm.model import LanguageModel
from tests.lm.test_tasks import copy_solver

CPU = type("Runtime", (), {"device": "cpu"})()


def smoke(**overrides):
    return TaskConfig.from_preset("copy", "smoke", **{"encodings": "alibi", "device": "cpu", "steps": 6,
                                                       "lrs": (1e-3, 3e-3), "lr_widenings": 1, **overrides})


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("rates") / "run"
    return out, run(smoke(), out, log=lambda *_: None)


def test_every_rate_trains_the_best_on_dev_is_kept_and_evaluated(swept):
    out, results = swept
    folder = out / "checkpoints" / "alibi-seed0"
    selection = json.loads((folder / "selection.json").read_text())
    grid = {lr: selection["scores"][lr] for lr in ("0.001", "0.003")}
    beyond = "0.000333333" if grid["0.001"] <= grid["0.003"] else "0.009"  # one grid step past the better edge
    assert list(selection["scores"]) == sorted([*grid, beyond], key=float)
    for lr, loss in selection["scores"].items():  # each score is that rate's model's dev loss
        model = LanguageModel(smoke().model_config("alibi", False))
        model.load_state_dict(storage.load_weights(folder / f"lr{lr}" / "model.safetensors"))
        assert stages._scored_loss(smoke(), model.eval(), DEV_SEED, CPU) == pytest.approx(loss, rel=1e-6)
    best = min(selection["scores"], key=selection["scores"].get)
    assert selection["lr"] == pytest.approx(float(best), rel=1e-5) and selection["at_edge"] == (best == beyond)
    row = results["rows"][0]
    assert row["learning_rates"] == [selection["lr"]] and row["rate_sweeps"][0]["scores"] == selection["scores"]
    chosen = json.loads((folder / f"lr{best}" / "train.json").read_text())
    assert row["train_seconds"] == [chosen["wall_time_s"]]  # the chosen model's own training, not the sweep's
    assert selection["sweep_seconds"] > chosen["wall_time_s"]
    # the evaluation read the chosen rate's weights: re-score them and compare with the written test cells
    model = LanguageModel(smoke().model_config("alibi", False))
    model.load_state_dict(storage.load_weights(folder / f"lr{best}" / "model.safetensors"))
    again = stages._exact_match(smoke(), model.eval(), TEST_SEED, CPU, "check")
    written = json.loads((out / "evals" / "alibi-seed0.json").read_text())["exact_match"]
    assert again == written
    edge = " (edge)" if selection["at_edge"] else ""
    assert f"| {selection['lr']:g}{edge} |" in (out / "results.md").read_text()
    assert "lr (dev)" in (out / "results.md").read_text()


def test_the_rate_table_shows_every_dev_loss_with_the_kept_one_bold_and_needs_a_grid(swept, tmp_path):
    out, results = swept
    selection = json.loads((out / "checkpoints" / "alibi-seed0" / "selection.json").read_text())
    lines = published.render("tasks-rates", results).splitlines()
    assert lines[0] == "| encoding | seed | " + " | ".join(selection["scores"]) + " | kept |"
    cells = [f"**{v:.4f}**" if float(k) == pytest.approx(selection["lr"]) else f"{v:.4f}"
             for k, v in selection["scores"].items()]
    assert lines[2:] == ["| alibi | 0 | " + " | ".join(cells) + f" | {selection['lr']:g}"
                         + (" (edge)" if selection["at_edge"] else "") + " |"]
    assert "## Learning rates, chosen on dev" in (out / "results.md").read_text()
    plain = run(smoke(lrs=(), lr_widenings=2, steps=2), tmp_path / "plain", log=lambda *_: None)
    with pytest.raises(ValueError, match="generated table tasks-rates: its results file ran without --lrs"):
        published.render("tasks-rates", plain)
    assert "## Learning rates" not in (tmp_path / "plain" / "results.md").read_text()


def test_resume_trains_nothing_again_and_a_changed_grid_is_refused(swept):
    out, results = swept
    messages = []
    again = run(smoke(), out, resume=True, log=messages.append)
    assert not any("trained in" in m for m in messages) and again["rows"] == results["rows"]
    with pytest.raises(ValueError, match=r"differs in \['lrs'\]"):
        run(smoke(lrs=(1e-3, 1e-2)), out, resume=True, log=lambda *_: None)
    with pytest.raises(ValueError, match=r"differs in \['lr_widenings'\]"):
        run(smoke(lr_widenings=0), out, resume=True, log=lambda *_: None)


def test_a_run_from_before_rate_grids_resumes_at_its_one_rate(tmp_path):
    out = tmp_path / "old"
    config = smoke(lrs=(), lr_widenings=2, steps=2)
    run(config, out, log=lambda *_: None)
    pinned = json.loads((out / "config.json").read_text())
    for key in ("lrs", "lr_widenings"):
        del pinned[key]
    (out / "config.json").write_text(json.dumps(pinned))
    messages = []
    results = run(config, out, resume=True, log=messages.append)
    assert "alibi (seed 0, lr 0.003): already trained, skipping" in messages
    assert results["rows"][0]["learning_rates"] == [3e-3] and results["rows"][0]["rate_sweeps"] is None
    assert (out / "checkpoints" / "alibi-seed0" / "model.safetensors").exists()  # the one-rate layout


def test_the_dev_loss_is_the_cross_entropy_of_the_scored_tokens_only():
    config = smoke()
    task = config.task_spec

    class Copier(torch.nn.Module):
        def __init__(self, scale: float):
            super().__init__()
            self.scale = scale

        def forward(self, tokens):
            return self.scale * copy_solver(tokens, task)

    # all-zero logits: ln(vocab) on every scored token; unscored positions (all zero here too) must not count
    assert stages._scored_loss(config, Copier(0.0), DEV_SEED, CPU) == pytest.approx(math.log(task.vocab_size))
    # a sure copier: the right symbol at logit s, the others 0 -> −log(e^s / (e^s + V − 1)) per scored token
    s, vocab = 5.0, task.vocab_size
    expected = -math.log(math.exp(s) / (math.exp(s) + vocab - 1))
    assert stages._scored_loss(config, Copier(s), DEV_SEED, CPU) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("args, message", [
    (["--task", "copy", "--lrs", "1e-3,0.001"], "--lrs must not repeat a rate"),
    (["--task", "copy", "--lrs", "1e-3", "--lr-widenings", "-1"], "--lr-widenings must be an integer >= 0"),
    (["--task", "copy", "--lr-widenings", "1"], "--lr-widenings widens a grid of --lrs; give --lrs too"),
    (["--task", "copy", "--lrs", "1e-3", "--seeds", "2", "--lr-sweep-seeds", "3"],
     "--lr-sweep-seeds must be between 1 and --seeds (2), got 3"),
    (["--task", "recall", "--lr-sweep-seeds", "1"], "--lr-sweep-seeds says which seeds sweep a grid of --lrs"),
    (["--lrs", "1e-3", "--lr-sweep-seeds", "-1"], "--lr-sweep-seeds must be an integer >= 0, got -1"),
])
def test_bad_rate_flags_fail_before_any_work(tmp_path, capsys, args, message):
    assert main(["extrapolate", "--preset", "smoke", *args, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_with_lr_sweep_seeds_later_seeds_train_once_at_the_rate_the_sweeping_seeds_chose(tmp_path):
    out = tmp_path / "inherit"
    config = smoke(seeds=3, lr_sweep_seeds=1, lr_widenings=0, steps=4)
    messages = []
    results = run(config, out, log=messages.append)
    first = json.loads((out / "checkpoints" / "alibi-seed0" / "selection.json").read_text())
    assert sorted(first["scores"]) == ["0.001", "0.003"]
    for seed in (1, 2):  # one training each, at seed 0's rate, and no sweep of their own
        folder = out / "checkpoints" / f"alibi-seed{seed}"
        assert [p.name for p in folder.iterdir()] == [f"lr{first['lr']:g}"] and not (folder / "selection.json").exists()
    assert sum("trained in" in m for m in messages) == 2 + 2
    row = results["rows"][0]
    assert row["learning_rates"] == [first["lr"]] * 3
    assert [s.get("inherited_from") for s in row["rate_sweeps"]] == [None, [0], [0]]
    assert row["rate_sweeps"][1]["mean_scores"] == first["scores"]
    assert [line.split(" | ")[1] for line in published.render("tasks-rates", results).splitlines()[2:]] == ["0"]
    # the seeds that inherit are trained as a plain run at that rate trains them, to the last weight
    run(smoke(lrs=(), lr=first["lr"], seeds=2, seed=1, steps=4), tmp_path / "plain", log=lambda *_: None)
    for seed in (1, 2):
        inherited = storage.load_weights(out / "checkpoints" / f"alibi-seed{seed}" / f"lr{first['lr']:g}"
                                         / "model.safetensors")
        plain = storage.load_weights(tmp_path / "plain" / "checkpoints" / f"alibi-seed{seed}" / "model.safetensors")
        assert inherited.keys() == plain.keys() and all(torch.equal(inherited[k], plain[k]) for k in plain)
    with pytest.raises(ValueError, match=r"differs in \['lr_sweep_seeds'\]"):
        run(smoke(seeds=3, lr_sweep_seeds=2, lr_widenings=0, steps=4), out, resume=True, log=lambda *_: None)
