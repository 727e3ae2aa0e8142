"""extend's stages around the training they call: the run it reads its RoPE checkpoints from, which files the
from-scratch stage writes, reads back on resume and removes, what it passes to training, and which seed's LongRoPE
factors the export takes. Training itself is stood in for (``tests/experiments/extend/test_extend.py`` runs it end to
end)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from posenc import storage
from posenc.experiments.extend import searching, tuning
from posenc.experiments import extrapolate
from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.plan import Plan, _read_run
from posenc.extension.methods import method_scaling
from posenc.lm.model import LanguageModel
from posenc.lm.runtime import Runtime
from tests.experiments.extend.test_collect import smoke_plan


def _plan(out: Path, eval_stride: int | None = None) -> Plan:
    return smoke_plan(from_scratch=True, eval_stride=eval_stride, out=out)


class StandInTraining:
    """Records what ``train`` was asked and leaves a checkpoint file behind, as the real one does mid-run."""

    def __init__(self):
        self.calls, self.leaves_checkpoint = [], True

    def __call__(self, model, data, config, *, checkpoint, **kwargs):
        self.calls.append({"model": model, "config": config, "checkpoint": checkpoint, **kwargs})
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        if self.leaves_checkpoint:
            checkpoint.write_bytes(b"partial")
        return {"wall_time_s": 2.0}


def test_from_scratch_trains_once_at_the_target_and_keeps_only_the_weights(tmp_path, monkeypatch):
    p = _plan(tmp_path)
    training = StandInTraining()
    monkeypatch.setattr(tuning, "train", training)
    runtime = Runtime(torch.device("cpu"), torch.bfloat16, rank=0, world_size=1)
    logged = []
    metrics = tuning.train_from_scratch(p, 3, runtime, logged.append)
    (call,) = training.calls
    folder = tmp_path / "scratch" / "seed3"
    assert call["checkpoint"] == folder / "last.pt" and not (folder / "last.pt").exists()
    assert call["config"] == tuning.scratch_config(p, 3) and call["model"].config.max_positions == 128
    assert call["autocast_dtype"] == torch.bfloat16 and (call["rank"], call["world_size"]) == (0, 1)
    assert call["label"] == "train rope @ 128 from scratch (seed 3)"
    config = call["config"]
    assert metrics == storage.read_json(folder / "train.json") == {
        "wall_time_s": 2.0, "tokens": config.steps * config.batch_size * 128}
    assert set(storage.load_weights(folder / "model.safetensors")) == set(call["model"].state_dict())
    assert logged == ["rope trained at 128 from scratch (seed 3): 2s"]

    assert tuning.train_from_scratch(p, 3, runtime, logged.append) == metrics and len(training.calls) == 1
    (folder / "model.safetensors").unlink()  # a run killed between its two writes trains again
    training.leaves_checkpoint = False  # (as a run that finished before its first checkpoint)
    tuning.train_from_scratch(p, 3, runtime, logged.append)
    assert len(training.calls) == 2


def test_from_scratch_on_another_rank_writes_nothing(tmp_path, monkeypatch):
    p = _plan(tmp_path)
    training = StandInTraining()
    monkeypatch.setattr(tuning, "train", training)
    runtime = Runtime(torch.device("cpu"), None, rank=1, world_size=2)
    assert tuning.train_from_scratch(p, 0, runtime, print)["tokens"] > 0
    assert (training.calls[0]["rank"], training.calls[0]["world_size"]) == (1, 2)
    assert not (tmp_path / "scratch" / "seed0" / "train.json").exists()


def test_the_scratch_budget_is_pretraining_plus_one_fine_tuning_in_whole_batches(tmp_path):
    p = _plan(tmp_path)
    config = tuning.scratch_config(p, 5)
    per_step = p.config.finetune_batch * 128
    assert (config.steps - 1) * per_step < tuning.scratch_tokens(p) <= config.steps * per_step
    assert (config.seed, config.lr, config.warmup, config.length) == (5, p.base.lr, p.base.warmup, 128)
    assert config.checkpoint_every == p.base.checkpoint_every


def summary(loss_best: float, loss_plain: float, n_hat: int, factor: float) -> dict:
    return {"loss_best_n_hat": loss_best, "loss_n_hat_0": loss_plain, "best": {"n_hat": n_hat},
            "rope_parameters": {"rope_type": "longrope", "long_factor": [factor, factor]}}


def test_the_export_takes_the_seed_best_without_n_hat(tmp_path):
    """Seed 1 has the better search loss with its n̂, seed 2 without: the export (n̂ = 0) takes seed 2."""
    p = _plan(tmp_path)
    summaries = {1: summary(2.0, 2.6, 4, 1.5), 2: summary(2.2, 2.4, 8, 2.5), 0: summary(2.1, 2.5, 0, 3.5)}
    chosen = searching.export(p, summaries)
    assert chosen == {**summaries[2], "exported_seed": 2}
    written = json.loads((tmp_path / "rope_parameters.json").read_text())
    assert written["rope_parameters"] == {"rope_type": "longrope", "long_factor": [2.5, 2.5]}
    metadata = written["metadata"]
    assert metadata["chosen"] == "seed 2 of [0, 1, 2], lowest dev loss with n_hat = 0" and metadata["n_hat"] == 0
    assert metadata["search_loss_nats"] == {"best_n_hat": 2.2, "n_hat_0": 2.4, "split": "dev"}
    assert metadata["n_hat_note"].endswith("(the search's best had n_hat = 8)")
    assert metadata["found_by"].startswith("posenc extend: LongRoPE")


def test_the_run_read_names_what_it_lacks_and_takes_only_its_own_seeds(tmp_path):
    config = ExtendConfig.from_preset("smoke", seeds=2)
    with pytest.raises(ValueError, match=rf"^--run {tmp_path}: not a posenc extrapolate run \(no config.json "
                                         rf"there\)$"):
        _read_run(tmp_path, config, None)
    base = extrapolate.ExperimentConfig.from_preset("smoke", seed=2, device="auto")
    storage.write_json(tmp_path / "config.json", base.to_dict())
    lacking = rf"^--run {tmp_path} has no finished RoPE checkpoint for {{}} \(checkpoints/<name>/model.safetensors\); "
    train = rf"\. Train one with: posenc extrapolate --resume --out {tmp_path} --encodings rope --seeds 2$"
    with pytest.raises(ValueError, match=lacking.format("rope-seed2, rope-seed3") + "it has: no finished checkpoints"
                                         + train):
        _read_run(tmp_path, config, None)
    for name in ("rope-seed0", "rope-seed1", "alibi-seed2", "rope-seed2", "rope-seed3x"):  # 0, 1: not this run's
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "model.safetensors").write_bytes(b"")
    (tmp_path / "checkpoints" / "rope-seed3").mkdir()  # begun, not finished
    with pytest.raises(ValueError, match=lacking.format("rope-seed3") + "it has: alibi-seed2, rope-seed0, rope-seed1, "
                                         "rope-seed2, rope-seed3x" + train):
        _read_run(tmp_path, config, None)
    (tmp_path / "checkpoints" / "rope-seed3" / "model.safetensors").write_bytes(b"")
    assert _read_run(tmp_path, config, None) == (base, False)  # no alibi-seed3: no ALiBi rows
    (tmp_path / "checkpoints" / "alibi-seed3").mkdir()
    (tmp_path / "checkpoints" / "alibi-seed3" / "model.safetensors").write_bytes(b"")
    read, has_alibi = _read_run(tmp_path, config, "cpu")
    assert has_alibi and read.device == "cpu" and read.seed == 2 and base.device == "auto"


def test_each_row_loads_its_base_checkpoint_with_its_scaling_and_length(tmp_path):
    p = _plan(tmp_path)
    rows = {row.name: row for row in p.rows}
    pi = method_scaling("pi", p.config.factor, p.base.train_length)
    for encoding in ("rope", "alibi"):
        storage.save_weights(tmp_path / f"{encoding}.safetensors",
                             LanguageModel(p.model_config(encoding)).state_dict())
    scaled = tuning.load(p, rows["rope+pi fine-tuned"], pi, tmp_path / "rope.safetensors")
    assert scaled.config.encoding_kwargs == {"scaling": pi} and scaled.config.max_positions == p.base.train_length
    alibi = tuning.load(p, rows["alibi fine-tuned"], pi, tmp_path / "alibi.safetensors")  # a scaling is RoPE's only
    assert alibi.config.encoding == "alibi" and alibi.config.encoding_kwargs == {}
    scratch = tuning.load(p, rows["rope trained at target"], None, tmp_path / "rope.safetensors")
    assert scratch.config.max_positions == 128 and scratch.config.encoding_kwargs == {}


def test_fine_tuning_reads_and_writes_where_the_layout_says(tmp_path, monkeypatch):
    """finetune/<row>/seed<k>/lr<rate>/ per rate, scratch/seed<k>/ for the row trained at the target, the base
    checkpoint for a zero-shot row; the dev score at the target length, at the run's stride and precision."""
    p = _plan(tmp_path, eval_stride=32)
    rows = {row.name: row for row in p.rows}
    selections = {"rope+pi fine-tuned": {"lr": 3e-4}}
    assert tuning.weights(p, rows["rope+pi fine-tuned"], 2, selections) == (
        tmp_path / "finetune" / "rope+pi-fine-tuned" / "seed2" / "lr0.0003" / "model.safetensors")
    scratch = tmp_path / "scratch" / "seed2" / "model.safetensors"
    assert tuning.weights(p, rows["rope trained at target"], 2, {}) == scratch
    assert tuning.weights(p, rows["rope+pi"], 2, {}) == p.checkpoint("rope", 2)
    config = tuning.finetune_config(p, 3e-4, 2)
    assert (config.steps, config.batch_size, config.length, config.lr) == (p.config.finetune_steps,
                                                                          p.config.finetune_batch, 128, 3e-4)
    assert config.checkpoint_every == p.config.finetune_steps // 4 and config.seed == 3  # not pretraining's seed
    asked = {}

    def evaluate(model, tokens, lengths, **kwargs):
        asked.update(lengths=lengths, **kwargs)
        return {"window_bits": {128: [1.5, 2.5]}}

    monkeypatch.setattr(tuning, "evaluate", evaluate)
    runtime = Runtime(torch.device("cpu"), torch.bfloat16)
    assert tuning.bits_at_target(None, SimpleNamespace(tokens=None), p, runtime, "dev") == [1.5, 2.5]
    assert asked == {"lengths": [128], "stride": 32, "autocast_dtype": torch.bfloat16, "label": "dev"}
