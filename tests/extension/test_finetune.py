import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posenc import storage
from posenc.extension.finetune import curve_points, finetune
from posenc.lm.model import LanguageModel, ModelConfig
from posenc.lm.train import TrainConfig, train
from tests.helpers import raising_on_call

CONFIG = TrainConfig(steps=40, batch_size=4, length=32, lr=2e-3, warmup=4, checkpoint_every=7, seed=1)
POINTS = [0, 5, 10, 20, 40]


def pretrained() -> LanguageModel:
    torch.manual_seed(0)
    scaling = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}
    return LanguageModel(ModelConfig(encoding="rope", encoding_kwargs={"scaling": scaling}, dim=32, num_layers=1,
                                     num_heads=2, max_positions=16))


def data() -> torch.Tensor:
    return torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)


def probe(model) -> float:
    """A fixed number that changes with every weight: the loss on fixed bytes."""
    with torch.no_grad():
        tokens = torch.arange(33)[None] % 256
        return torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[0, 1:]).item()


def test_curve_points_crowd_the_early_steps():
    assert curve_points(80) == [0, 5, 10, 20, 40, 80]
    assert curve_points(3) == [0, 1, 2, 3]
    assert curve_points(1) == [0, 1]


def test_finetune_records_the_curve_and_changes_the_model(tmp_path):
    model = pretrained()
    before = probe(model)
    metrics = finetune(model, data(), CONFIG, tmp_path / "ft", points=POINTS, measure=probe)
    assert list(metrics["curve"]) == [str(p) for p in POINTS]
    assert len(set(metrics["curve"].values())) == len(POINTS)  # each point measured after its own steps
    assert metrics["curve"]["0"] == pytest.approx(before)
    assert metrics["curve"]["40"] == pytest.approx(probe(model)) and probe(model) != before
    assert sorted(path.name for path in (tmp_path / "ft").iterdir()) == ["curve.json", "finetune.json",
                                                                         "model.safetensors"]
    assert storage.read_json(tmp_path / "ft" / "curve.json") == metrics["curve"]
    again = pretrained()  # a finished folder is loaded, not retrained
    assert finetune(again, data(), CONFIG, tmp_path / "ft", points=POINTS, measure=probe) == metrics
    assert probe(again) == pytest.approx(probe(model))


def test_an_interrupted_run_keeps_its_points_and_ends_as_the_uninterrupted_run(tmp_path):
    reference = pretrained()
    whole = finetune(reference, data(), CONFIG, tmp_path / "whole", points=POINTS, measure=probe)
    interrupted_at_the_third_point = raising_on_call(probe, 3)
    folder = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        finetune(pretrained(), data(), CONFIG, folder, points=POINTS, measure=interrupted_at_the_third_point)
    assert sorted(path.name for path in folder.iterdir()) == ["curve.json", "last.pt"]
    assert storage.read_json(folder / "curve.json") == {"0": whole["curve"]["0"], "5": whole["curve"]["5"]}

    def measured_again(model):  # a value no earlier point can have: shows which points were measured after resuming
        return probe(model) + 1000.0

    resumed = pretrained()
    metrics = finetune(resumed, data(), CONFIG, folder, points=POINTS, measure=measured_again)
    want = {step: value + (1000.0 if int(step) > 5 else 0.0) for step, value in whole["curve"].items()}
    assert metrics["curve"] == pytest.approx(want)
    for name, tensor in resumed.state_dict().items():
        torch.testing.assert_close(tensor, reference.state_dict()[name], rtol=1e-5, atol=1e-6)


def test_points_are_only_those_asked_for_and_measure_is_optional(tmp_path):
    config = TrainConfig(steps=3, batch_size=2, length=16, lr=1e-3, warmup=1, checkpoint_every=2)
    assert finetune(pretrained(), data(), config, tmp_path / "a", points=[1], measure=probe)["curve"].keys() == {"1"}
    assert finetune(pretrained(), data(), config, tmp_path / "b", points=[1, 3])["curve"] == {}
    one_step = TrainConfig(steps=1, batch_size=2, length=16, lr=1e-3, warmup=0)
    assert list(finetune(pretrained(), data(), one_step, tmp_path / "c", points=[0, 1], measure=probe)["curve"]) == [
        "0", "1"]


def test_a_run_killed_after_its_last_point_before_its_weights_finishes_on_resuming(tmp_path, monkeypatch):
    config = TrainConfig(steps=3, batch_size=2, length=16, lr=1e-3, warmup=1, checkpoint_every=2)
    reference = pretrained()
    whole = finetune(reference, data(), config, tmp_path / "whole", points=[0, 3], measure=probe)

    def killed(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(storage, "save_weights", killed)
        with pytest.raises(KeyboardInterrupt):
            finetune(pretrained(), data(), config, tmp_path / "killed", points=[0, 3], measure=probe)
    assert storage.read_json(tmp_path / "killed" / "curve.json") == whole["curve"]  # every point was measured
    resumed = pretrained()
    again = finetune(resumed, data(), config, tmp_path / "killed", points=[0, 3], measure=probe)
    assert again["curve"] == whole["curve"] and (tmp_path / "killed" / "finetune.json").exists()
    for name, tensor in resumed.state_dict().items():
        torch.testing.assert_close(tensor, reference.state_dict()[name], rtol=1e-5, atol=1e-6)


def test_autocast_reaches_the_training_loop(tmp_path):
    config = TrainConfig(steps=2, batch_size=2, length=16, lr=1e-3, warmup=1)
    low = finetune(pretrained(), data(), config, tmp_path / "low", autocast_dtype=torch.bfloat16)
    direct = train(pretrained(), data(), config, checkpoint=tmp_path / "direct.pt", device=torch.device("cpu"),
                   autocast_dtype=torch.bfloat16)
    plain = finetune(pretrained(), data(), config, tmp_path / "plain")
    assert low["final_loss"] == direct["final_loss"] != plain["final_loss"]


def test_weights_without_their_record_are_trained_again(tmp_path):
    config = TrainConfig(steps=2, batch_size=2, length=16, lr=1e-3, warmup=1)
    first = finetune(pretrained(), data(), config, tmp_path / "ft")
    (tmp_path / "ft" / "finetune.json").unlink()  # killed between the two writes
    again = finetune(pretrained(), data(), config, tmp_path / "ft")
    assert (tmp_path / "ft" / "finetune.json").exists() and again["steps"] == first["steps"]


KILLABLE = """
import sys, time
sys.path.insert(0, {root!r})
from tests.extension.test_finetune import CONFIG, POINTS, data, pretrained, probe
from posenc.extension.finetune import finetune
def slow(model):
    time.sleep(0.4)
    return probe(model)
finetune(pretrained(), data(), CONFIG, {folder!r}, points=POINTS, measure=slow)
"""


def test_sigkill_then_resume_gives_the_uninterrupted_weights(tmp_path):
    reference = pretrained()
    finetune(reference, data(), CONFIG, tmp_path / "reference", points=POINTS, measure=probe)

    folder = tmp_path / "killed"
    script = KILLABLE.format(root=str(Path(__file__).parents[2]), folder=str(folder))
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        curve = folder / "curve.json"
        if curve.exists() and len(json.loads(curve.read_text())) >= 3:
            break
        time.sleep(0.01)
    process.kill()
    process.wait()
    assert (folder / "last.pt").exists(), process.stderr.read().decode()[-2000:]
    assert not (folder / "finetune.json").exists(), "finished before the kill"
    resumed = pretrained()
    metrics = finetune(resumed, data(), CONFIG, folder, points=POINTS, measure=probe)
    want = storage.load_weights(tmp_path / "reference" / "model.safetensors")
    for name, tensor in storage.load_weights(folder / "model.safetensors").items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-4)
    assert list(metrics["curve"]) == [str(p) for p in POINTS]


def test_zero_steps_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fine-tuning needs steps >= 1"):
        finetune(pretrained(), data(), TrainConfig(steps=0, batch_size=2, length=8, lr=1e-3, warmup=0), tmp_path)
