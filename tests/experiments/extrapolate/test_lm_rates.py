"""``--lrs`` on ``posenc extrapolate`` (the LM): each trained encoding and seed trains at every rate (widened past
an edge), keeps the rate with the lowest dev bits per byte at the training length, and that rate's weights are the
checkpoint every row, and every later reader of the run, reads."""

import json
import math
from pathlib import Path

import pytest
import torch

from posenc import storage
from posenc.cli import main
from posenc.experiments import published
from posenc.experiments.extrapolate import ExperimentConfig, run
from posenc.experiments.extrapolate import stages
from posenc.experiments.extrapolate.rows import all_rows
from posenc.experiments.rate_grid import rate_key
from posenc.lm.data import load_corpus, sample_windows
from posenc.lm.model import LanguageModel


TEXT = Path(__file__).resolve().parents[3] / "src" / "posenc"  # a small folder of text: the package's sources


def smoke(**overrides) -> ExperimentConfig:
    return ExperimentConfig.from_preset("smoke", **{"encodings": "rope,rope+yarn,alibi", "device": "cpu",
                                                    "text": str(TEXT), "steps": 8, "lrs": (1e-3, 3e-3),
                                                    "lr_widenings": 1, **overrides})


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm-rates") / "run"
    return out, run(smoke(), out, log=lambda *_: None)


def dev_bits_by_hand(config: ExperimentConfig, encoding: str, weights) -> float:
    """Mean next-byte cross-entropy in bits over the dev windows, each window one sequence of the training length."""
    corpus = load_corpus(config.text, train_length=config.train_length, window=config.window_length,
                         windows=config.eval_windows)
    dev = sample_windows(corpus.dev, config.train_length, config.dev_windows)
    assert not set(dev.files) & set(corpus.test.files) and not set(dev.files) & set(corpus.train.files)
    model = LanguageModel(config.model_config(all_rows()[encoding], all_rows()[encoding].train_kwargs))
    model.load_state_dict(storage.load_weights(weights))
    with torch.no_grad():
        logits = model.eval()(dev.tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(), dev.tokens[:, 1:].flatten())
    return loss.item() / math.log(2)


@pytest.mark.parametrize("encoding", ["rope", "alibi"])
def test_every_rate_trains_and_the_best_on_dev_is_the_checkpoint(swept, encoding):
    out, _ = swept
    config, folder = smoke(), out / "checkpoints" / f"{encoding}-seed0"
    selection = json.loads((folder / "selection.json").read_text())
    grid = {lr: selection["scores"][lr] for lr in ("0.001", "0.003")}
    beyond = "0.000333333" if grid["0.001"] <= grid["0.003"] else "0.009"  # one grid step past the better edge
    assert list(selection["scores"]) == sorted([*grid, beyond], key=float)
    assert selection["widened"] == [float(beyond)] and selection["split"] == "dev"
    assert selection["dev_windows"] == config.dev_windows == 4 * 128 // 16
    for lr, bits in selection["scores"].items():  # each score is that rate's model on dev, recomputed by hand
        assert bits == pytest.approx(dev_bits_by_hand(config, encoding, folder / "rates" / f"lr{lr}" /
                                                      "model.safetensors"), rel=1e-5)
    best = min(selection["scores"], key=selection["scores"].get)
    assert selection["lr"] == float(best)
    assert selection["at_edge"] == (best in (min(selection["scores"], key=float), max(selection["scores"], key=float)))
    kept = storage.load_weights(folder / "rates" / f"lr{best}" / "model.safetensors")
    checkpoint = storage.load_weights(folder / "model.safetensors")
    assert kept.keys() == checkpoint.keys() and all(torch.equal(kept[k], checkpoint[k]) for k in kept)
    trained = json.loads((folder / "train.json").read_text())
    assert trained["lr"] == float(best) and trained["sweep"] == selection
    assert selection["sweep_seconds"] == pytest.approx(sum(
        json.loads((folder / "rates" / f"lr{lr}" / "train.json").read_text())["wall_time_s"]
        for lr in selection["scores"]))


def test_rows_report_the_rate_their_checkpoint_kept(swept):
    out, results = swept
    rows = {row["name"]: row for row in results["rows"]}
    for name, encoding in (("rope", "rope"), ("rope+yarn", "rope"), ("alibi", "alibi")):
        selection = json.loads((out / "checkpoints" / f"{encoding}-seed0" / "selection.json").read_text())
        assert rows[name]["learning_rates"] == [selection["lr"]] and rows[name]["rate_sweeps"] == [selection]
    # rope+yarn reads the same checkpoint as rope: at 1× (factor 1) the two score alike
    assert rows["rope+yarn"]["bits_per_byte"]["16"] == pytest.approx(rows["rope"]["bits_per_byte"]["16"], abs=1e-6)
    sweeps = sum(json.loads((out / "checkpoints" / f"{e}-seed0" / "selection.json").read_text())["sweep_seconds"]
                 for e in ("rope", "alibi"))
    evals = sum(row["eval_wall_time_s"] for row in results["rows"])
    assert results["wall_time_s"] == pytest.approx(sweeps + evals)  # every rate's training counts


def test_the_report_names_each_kept_rate_and_every_dev_score(swept):
    out, results = swept
    markdown = (out / "results.md").read_text()
    assert "| encoding | 1× (16) | 2× (32) | 4× (64) | 8× (128) | lr (dev) |" in markdown
    assert "## Learning rates, chosen on dev (bits per byte on dev windows at the training length)" in markdown
    for encoding in ("rope", "alibi"):
        selection = json.loads((out / "checkpoints" / f"{encoding}-seed0" / "selection.json").read_text())
        kept = "**{:.4f}**".format(selection["scores"][rate_key(selection["lr"])])
        line = next(line for line in markdown.splitlines() if line.startswith(f"| {encoding} | 0 |"))
        assert kept in line and all(f"{v:.4f}" in line for v in selection["scores"].values())


def test_resume_trains_nothing_and_restores_a_lost_checkpoint(swept, monkeypatch):
    out, results = swept
    folder = out / "checkpoints" / "alibi-seed0"
    (folder / "model.safetensors").unlink()  # killed after the choice, before the kept weights were copied
    (folder / "train.json").unlink()
    monkeypatch.setattr(stages, "train", lambda *a, **k: pytest.fail("a resumed sweep trained again"))
    again = run(smoke(), out, resume=True, log=lambda *_: None)
    assert [row["bits_per_byte"] for row in again["rows"]] == [row["bits_per_byte"] for row in results["rows"]]
    assert (folder / "model.safetensors").exists()


def test_a_changed_grid_is_refused_and_a_run_from_before_grids_resumes(swept, tmp_path, monkeypatch):
    out, _ = swept
    with pytest.raises(ValueError, match=r"differs in \['lrs'\]"):
        run(smoke(lrs=(1e-3, 1e-2)), out, resume=True, log=lambda *_: None)
    with pytest.raises(ValueError, match=r"differs in \['lr_widenings', 'lrs'\]"):
        run(smoke(lrs=(), lr_widenings=2), out, resume=True, log=lambda *_: None)
    old = tmp_path / "old"
    plain = smoke(lrs=(), lr_widenings=2, steps=2, encodings="alibi")
    run(plain, old, log=lambda *_: None)
    pinned = json.loads((old / "config.json").read_text())
    for key in ("lrs", "lr_widenings"):  # a config.json written before the grid existed
        del pinned[key]
    (old / "config.json").write_text(json.dumps(pinned))
    assert "lrs" not in plain.training_dict() and "lr_widenings" not in plain.training_dict()
    monkeypatch.setattr(stages, "train", lambda *a, **k: pytest.fail("a finished run trained again"))
    resumed = run(plain, old, resume=True, log=lambda *_: None)
    assert resumed["rows"][0]["learning_rates"] == [plain.lr] and resumed["rows"][0]["rate_sweeps"] is None


@pytest.mark.parametrize("args, message", [
    (["--lrs", "1e-3,0.001"], "--lrs must not repeat a rate"),
    (["--lrs", "1e-3", "--lr-widenings", "-1"], "--lr-widenings must be an integer >= 0"),
    (["--lr-widenings", "1"], "--lr-widenings widens a grid of --lrs; give --lrs too"),
    (["--lrs", "1e-3", "--seeds", "2", "--lr-sweep-seeds", "3"], "--lr-sweep-seeds must be between 1 and --seeds (2)"),
    (["--lr-sweep-seeds", "1"], "--lr-sweep-seeds says which seeds sweep a grid of --lrs; give --lrs too"),
])
def test_bad_rate_flags_fail_in_one_line_before_any_work(tmp_path, capsys, args, message):
    assert main(["extrapolate", "--preset", "smoke", "--text", str(TEXT), *args, "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert not (tmp_path / "x").exists()


def test_the_docs_table_of_rates_is_generated_and_refuses_a_run_without_a_grid(swept, tmp_path):
    out, results = swept
    text = published.render("extrapolate-rates", results)
    rates = {key for encoding in ("rope", "alibi") for key in json.loads(
        (out / "checkpoints" / f"{encoding}-seed0" / "selection.json").read_text())["scores"]}
    assert text.startswith("| encoding | seed | " + " | ".join(sorted(rates, key=float)) + " | kept |\n")
    assert text.count("\n") == 2 + 2  # header, rule, one line per trained encoding and seed
    plain = run(smoke(lrs=(), lr_widenings=2, steps=2, encodings="alibi"), tmp_path / "plain", log=lambda *_: None)
    with pytest.raises(ValueError, match="generated table extrapolate-rates: its results file ran without --lrs"):
        published.render("extrapolate-rates", plain)


def test_with_lr_sweep_seeds_a_later_seed_trains_once_at_the_inherited_rate(tmp_path):
    out = tmp_path / "inherit"
    config = smoke(encodings="alibi", seeds=2, lr_sweep_seeds=1, lr_widenings=0, steps=4)
    results = run(config, out, log=lambda *_: None)
    first = json.loads((out / "checkpoints" / "alibi-seed0" / "selection.json").read_text())
    second = out / "checkpoints" / "alibi-seed1"
    inherited = json.loads((second / "selection.json").read_text())
    assert inherited == {"lr": first["lr"], "inherited_from": [0], "mean_scores": first["scores"],
                         "at_edge": first["at_edge"]}
    assert [p.name for p in (second / "rates").iterdir()] == [f"lr{rate_key(first['lr'])}"]  # one training
    kept = storage.load_weights(second / "rates" / f"lr{rate_key(first['lr'])}" / "model.safetensors")
    checkpoint = storage.load_weights(second / "model.safetensors")
    assert all(torch.equal(kept[k], checkpoint[k]) for k in kept)
    row = results["rows"][0]
    assert row["learning_rates"] == [first["lr"]] * 2 and row["rate_sweeps"] == [first, inherited]
    assert [line.split(" | ")[1] for line in published.render("extrapolate-rates", results).splitlines()[2:]] == ["0"]
    assert config.training_dict()["lr_sweep_seeds"] == 1 and "lr_sweep_seeds" not in smoke().training_dict()
    with pytest.raises(ValueError, match=r"differs in \['lr_sweep_seeds'\]"):
        run(smoke(encodings="alibi", seeds=2, lr_widenings=0, steps=4), out, resume=True, log=lambda *_: None)
