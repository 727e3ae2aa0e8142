"""The training loop's numbers: the learning-rate schedule in closed form and in the optimizer, which parameters
decay, gradient clipping, that stops and resumes follow the uninterrupted run, where checkpoints land and what the
returned metrics average."""

import math

import pytest
import torch

from posenc import storage
from posenc.lm import train as train_module
from posenc.lm.model import LanguageModel, ModelConfig
from posenc.lm.train import TrainConfig, learning_rate, train

CPU = torch.device("cpu")


def tiny() -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(ModelConfig(encoding="rope", dim=16, num_layers=1, num_heads=2, max_positions=16))


def data() -> torch.Tensor:
    return torch.randint(0, 256, (4000,), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)


def config(**changes) -> TrainConfig:
    return TrainConfig(**{"steps": 6, "batch_size": 2, "length": 16, "lr": 3e-3, "warmup": 2, **changes})


def cosine(lr: float, progress: float) -> float:
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def test_the_rate_warms_up_linearly_then_decays_along_a_cosine_to_a_tenth():
    schedule = TrainConfig(steps=110, batch_size=1, length=8, lr=2.0, warmup=10)
    assert [learning_rate(s, schedule) for s in (0, 4, 9)] == pytest.approx([0.2, 1.0, 2.0])
    assert learning_rate(10, schedule) == pytest.approx(2.0)
    assert learning_rate(35, schedule) == pytest.approx(cosine(2.0, 0.25))
    assert learning_rate(60, schedule) == pytest.approx(1.1)  # halfway: (0.1 + 1) / 2 of the peak
    assert learning_rate(110, schedule) == pytest.approx(0.2)
    assert learning_rate(500, schedule) == pytest.approx(0.2)  # past the last step it stays at a tenth


@pytest.mark.parametrize("steps, warmup, step, want", [
    (4, 0, 0, 1.0),  # no warm-up: the peak at once
    (4, 0, 2, cosine(1.0, 0.5)),
    (4, 4, 3, 1.0),  # all warm-up: the peak at the last step
    (4, 4, 4, 1.0),  # and no decay left after it
    (5, 4, 5, 0.1),  # one step of decay reaches the tenth
])
def test_the_schedule_at_its_edges(steps, warmup, step, want):
    assert learning_rate(step, TrainConfig(steps=steps, batch_size=1, length=8, lr=1.0, warmup=warmup)) == \
        pytest.approx(want)


def test_each_step_runs_at_the_schedules_rate_and_only_matrices_decay(tmp_path):
    chosen = config(weight_decay=0.3)
    model = tiny()
    train(model, data(), chosen, checkpoint=tmp_path / "last.pt", device=CPU, until=3)
    optimizer = storage.load_checkpoint(tmp_path / "last.pt")["optimizer"]
    groups, state = optimizer["param_groups"], optimizer["state"]
    assert [g["lr"] for g in groups] == [learning_rate(2, chosen)] * 2  # the rate of the last step taken
    assert [g["weight_decay"] for g in groups] == [0.3, 0.0] and all(g["betas"] == (0.9, 0.95) for g in groups)
    decayed = [state[i]["exp_avg"].dim() for i in groups[0]["params"]]  # Adam's moments have their parameter's shape
    kept = [state[i]["exp_avg"].dim() for i in groups[1]["params"]]
    assert decayed and kept and min(decayed) >= 2 and max(kept) < 2
    assert len(decayed) + len(kept) == len(list(model.parameters()))


def test_gradients_are_clipped_to_the_configured_norm(tmp_path):
    """Adam divides the step by the gradient's size, so clipping shows where the clipped gradient nears Adam's
    epsilon: clipped to 1e-12, the first step moves the weights a thousandth as far."""
    moved = {}
    for clip in (1.0, 1e-12):
        model, before = tiny(), tiny().state_dict()
        train(model, data(), config(steps=1, warmup=0, grad_clip=clip, weight_decay=0.0), checkpoint=tmp_path / f"{clip}.pt",
              device=CPU)
        moved[clip] = max((model.state_dict()[k] - v).abs().max().item() for k, v in before.items())
    assert moved[1.0] > 1e-3 and moved[1e-12] < 1e-3 * moved[1.0]


def test_stopping_and_resuming_follows_the_uninterrupted_run(tmp_path):
    whole = tiny()
    straight = train(whole, data(), config(), checkpoint=tmp_path / "whole.pt", device=CPU)
    parts = tiny()
    elapsed = []
    for until in (2, 5, None):
        resumed = train(parts, data(), config(), checkpoint=tmp_path / "parts.pt", device=CPU, until=until)
        elapsed.append(storage.load_checkpoint(tmp_path / "parts.pt")["elapsed"])
    assert 0 < elapsed[0] <= elapsed[1] <= elapsed[2] <= resumed["wall_time_s"]  # time adds up across the stops
    for name, tensor in whole.state_dict().items():
        torch.testing.assert_close(parts.state_dict()[name], tensor, rtol=0, atol=1e-7)
    assert storage.load_checkpoint(tmp_path / "parts.pt")["losses"] == pytest.approx(
        storage.load_checkpoint(tmp_path / "whole.pt")["losses"], abs=1e-6)
    assert resumed["steps"] == straight["steps"] == 6
    assert resumed["final_loss"] == pytest.approx(straight["final_loss"], abs=1e-6)


def test_checkpoints_land_every_checkpoint_every_steps_and_at_each_stop(tmp_path, monkeypatch):
    saved = []
    real = storage.save_checkpoint
    monkeypatch.setattr(train_module.storage, "save_checkpoint",
                        lambda path, state: (saved.append(state["step"]), real(path, state)))
    train(tiny(), data(), config(steps=10, checkpoint_every=4), checkpoint=tmp_path / "last.pt", device=CPU, until=5)
    assert saved == [4, 5]
    train(tiny(), data(), config(steps=10, checkpoint_every=4), checkpoint=tmp_path / "last.pt", device=CPU)
    assert saved == [4, 5, 8, 10]


def test_the_metrics_average_the_last_twentieth_of_the_losses(tmp_path):
    metrics = train(tiny(), data(), config(steps=40, checkpoint_every=100), checkpoint=tmp_path / "last.pt",
                    device=CPU)
    losses = storage.load_checkpoint(tmp_path / "last.pt")["losses"]
    assert len(losses) == 40 and metrics["steps"] == 40
    assert metrics["final_loss"] == pytest.approx(sum(losses[-2:]) / 2, abs=1e-12)
    assert metrics["final_bits_per_byte"] == pytest.approx(metrics["final_loss"] / math.log(2), abs=1e-12)
    assert metrics["tokens_per_s"] == pytest.approx(40 * 2 * 16 / metrics["wall_time_s"], rel=1e-9)
    short = train(tiny(), data(), config(steps=3), checkpoint=tmp_path / "short.pt", device=CPU)
    assert short["final_loss"] == pytest.approx(storage.load_checkpoint(tmp_path / "short.pt")["losses"][-1])


def test_a_batch_the_processes_cannot_share_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match=r"batch_size \(3\) must be divisible by the number of processes \(2\)"):
        train(tiny(), data(), config(batch_size=3), checkpoint=tmp_path / "last.pt", device=CPU, world_size=2)
    assert not (tmp_path / "last.pt").exists()


def test_the_wall_time_is_this_runs_and_the_checkpoint_names_its_config(tmp_path):
    import time

    began = time.perf_counter()
    metrics = train(tiny(), data(), config(steps=2), checkpoint=tmp_path / "last.pt", device=CPU)
    assert 0 < metrics["wall_time_s"] <= time.perf_counter() - began
    assert storage.load_checkpoint(tmp_path / "last.pt")["config"] == {
        "steps": 2, "batch_size": 2, "length": 16, "lr": 3e-3, "warmup": 2, "weight_decay": 0.1, "grad_clip": 1.0,
        "checkpoint_every": 100, "seed": 0, "random_positions": 0}


def test_randomized_positions_come_from_the_runs_own_generator(tmp_path):
    weights = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        model = tiny()
        torch.manual_seed(global_seed)  # the global generator differs between the two runs; the data order must not
        train(model, data(), config(steps=2, random_positions=64), checkpoint=tmp_path / f"{global_seed}.pt",
              device=CPU)
        weights.append(model.state_dict())
    for name, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][name], tensor, rtol=0, atol=0)


class Bar:
    """A stand-in for tqdm that records how the loop drives it."""

    made: list["Bar"] = []

    def __init__(self, **kwargs):
        self.kwargs, self.updates, self.postfixes, self.closed = kwargs, [], [], False
        Bar.made.append(self)

    def update(self, n):
        self.updates.append(n)

    def set_postfix(self, **values):
        self.postfixes.append(values)

    def close(self):
        self.closed = True


def test_the_progress_bar_counts_this_calls_steps_and_shows_each_loss_and_tokens_per_second(tmp_path, monkeypatch):
    ticks = iter(range(100))  # the loop's clock: 0, 0.5, 1, ... seconds, half a second per reading
    monkeypatch.setattr(train_module, "time", type("Clock", (), {"perf_counter": lambda: next(ticks) / 2}))
    monkeypatch.setattr(train_module, "tqdm", Bar)
    Bar.made.clear()
    model, path = tiny(), tmp_path / "last.pt"
    train(model, data(), config(), checkpoint=path, device=CPU, until=2, label="first")
    elapsed = storage.load_checkpoint(path)["elapsed"]
    train(model, data(), config(), checkpoint=path, device=CPU, label="resumed")
    losses = storage.load_checkpoint(path)["losses"]
    first, resumed = Bar.made
    assert first.kwargs == {"total": 6, "initial": 0, "desc": "first", "disable": False, "mininterval": 1.0,
                            "dynamic_ncols": True}
    assert resumed.kwargs == {**first.kwargs, "initial": 2, "desc": "resumed"}
    assert first.updates == [1, 1] and resumed.updates == [1, 1, 1, 1] and first.closed and resumed.closed
    assert [p["loss"] for p in first.postfixes + resumed.postfixes] == [f"{loss:.3f}" for loss in losses]
    # a tick per step: this call's steps times 2 × 16 tokens over this call's seconds, 64 tokens a second, with the
    # first call's seconds (elapsed) left out of the resumed call's rate
    assert elapsed == 1.0 and [p["tok_s"] for p in first.postfixes + resumed.postfixes] == ["64"] * 6


def test_by_default_the_bar_says_train_and_nothing_is_compiled(tmp_path, monkeypatch):
    monkeypatch.setattr(train_module, "tqdm", Bar)
    monkeypatch.setattr(train_module.torch, "compile", lambda *a, **k: pytest.fail("compiled without compile=True"))
    Bar.made.clear()
    train(tiny(), data(), config(steps=1), checkpoint=tmp_path / "last.pt", device=CPU)
    assert Bar.made[0].kwargs["desc"] == "train"
