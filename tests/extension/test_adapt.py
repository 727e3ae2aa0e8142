"""Fine-tuning a transformers model for a longer context: PoSE ids reach the model, LoRA merges into the same
logits, an interrupted run resumes to the uninterrupted one's weights, and bad options fail before any work."""

import time
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from posenc import storage
from posenc.experiments.pretrained.measure import tiny_llama
from posenc.extension import adapt as adapting
from posenc.extension.adapt import AdaptConfig, adapt, position_ids, with_lora, merged
from posenc.lm.train import learning_rate
from tests.helpers import raising_on_call

TEXT = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(0))


def config(**overrides):
    return AdaptConfig(**{"mode": "pose", "target": 256, "window": 32, "steps": 6, "lr": 1e-3, "batch": 2,
                          "checkpoint_every": 2, **overrides})


def weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_pose_and_control_ids():
    generator = torch.Generator().manual_seed(0)
    pose = position_ids(config(), generator)
    control = position_ids(config(mode="control"), generator)
    assert pose.shape == (2, 32) and pose.max() > 31 and (pose < 256).all()
    assert torch.equal(control, torch.arange(32).expand(2, 32))


def test_the_model_trains_at_the_skipwise_ids_of_each_step(tmp_path, monkeypatch):
    model, seen = tiny_llama(0, 32), []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda **kw: seen.append(kw["position_ids"].clone()) or forward(**kw))
    adapt(model, TEXT, config(steps=3), tmp_path / "run")
    generator = torch.Generator().manual_seed(0)
    for ids in seen:  # each step draws its windows, then its ids, from the run's generator
        torch.randint(0, TEXT.shape[0] - 33, (2,), generator=generator)
        assert torch.equal(ids, position_ids(config(), generator))
    assert len(seen) == 3 and max(int(ids.max()) for ids in seen) > 31


def test_an_interrupted_run_resumes_to_the_uninterrupted_weights(tmp_path):
    whole, record = adapt(tiny_llama(0, 32), TEXT, config(), tmp_path / "whole", points=(0, 4, 6),
                          measure=lambda m: 1.0)
    crash_at_the_second_point = raising_on_call(lambda model: 1.0, 2)  # points 0, 4, 6: the second is at step 4
    folder = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt):
        adapt(tiny_llama(0, 32), TEXT, config(), folder, points=(0, 4, 6), measure=crash_at_the_second_point)
    assert (folder / "last.pt").exists() and not (folder / "adapt.json").exists()
    resumed, again = adapt(tiny_llama(0, 32), TEXT, config(), folder, points=(0, 4, 6), measure=lambda m: 2.0)
    for name, tensor in weights(whole).items():
        torch.testing.assert_close(weights(resumed)[name], tensor, rtol=0, atol=0)
    assert again["losses"] == record["losses"] and len(record["losses"]) == 6
    assert again["curve"] == {"0": 1.0, "4": 2.0, "6": 2.0}  # step 0 was kept from before the crash


def test_lora_trains_adapters_norms_and_embeddings_and_merges_to_the_same_logits(tmp_path):
    model = tiny_llama(0, 32).double()
    before = weights(model)
    wrapped = with_lora(model, 4)
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad}
    assert any("lora_A" in n for n in trainable) and any("norm" in n for n in trainable)
    assert any("embed_tokens" in n for n in trainable) and not any("mlp" in n and "lora" not in n for n in trainable)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)  # fresh adapters are zero: give them something to merge
    ids = torch.randint(0, 256, (1, 40))
    adapted = wrapped(input_ids=ids).logits
    plain = merged(wrapped)
    assert not hasattr(plain, "peft_config")
    torch.testing.assert_close(plain(input_ids=ids).logits, adapted, rtol=1e-10, atol=1e-10)
    assert any(not torch.equal(p, before[n]) for n, p in weights(plain).items())


def test_lora_adapts_exactly_the_four_attention_projections_of_every_layer():
    model = tiny_llama(0, 32)
    layers = model.config.num_hidden_layers
    wrapped = with_lora(model, 2)
    adapted = sorted(name.removeprefix("base_model.model.").removesuffix(".lora_A.default.weight")
                     for name, _ in wrapped.named_parameters() if "lora_A" in name)
    want = sorted(f"model.layers.{i}.self_attn.{p}_proj" for i in range(layers) for p in "qkvo")
    assert adapted == want
    trainable = {n for n, p in wrapped.named_parameters() if p.requires_grad and "lora" not in n}
    assert trainable == {n for n, _ in wrapped.named_parameters() if "norm" in n or "embed_tokens" in n}


def test_finished_runs_are_loaded_not_trained_again(tmp_path):
    trained, _ = adapt(tiny_llama(0, 32), TEXT, config(lora=2), tmp_path / "run")
    loaded, _ = adapt(tiny_llama(0, 32), TEXT, config(lora=2), tmp_path / "run")
    ids = torch.randint(0, 256, (1, 20))
    torch.testing.assert_close(loaded(input_ids=ids).logits, trained(input_ids=ids).logits)
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_lora_run_changes_what_lora_trains_and_a_full_run_changes_the_rest(tmp_path):
    before = weights(tiny_llama(0, 32))
    lora, _ = adapt(tiny_llama(0, 32), TEXT, config(lora=2), tmp_path / "lora")
    full, _ = adapt(tiny_llama(0, 32), TEXT, config(), tmp_path / "full")
    mlp = [name for name in before if ".mlp." in name]
    projections = [name for name in before if "self_attn" in name]
    assert mlp and projections
    assert all(torch.equal(weights(lora)[name], before[name]) for name in mlp)  # no adapter there, so merged as was
    assert not any(torch.equal(weights(lora)[name], before[name]) for name in projections)
    assert not any(torch.equal(weights(full)[name], before[name]) for name in mlp + projections)


def test_a_finished_run_leaves_its_merged_weights_and_its_record_under_their_names(tmp_path):
    folder = tmp_path / "run"
    trained, record = adapt(tiny_llama(0, 32), TEXT, config(steps=2, lora=2), folder)
    assert sorted(path.name for path in folder.iterdir()) == ["adapt.json", "model.safetensors"]
    assert storage.read_json(folder / "adapt.json") == record and len(record["losses"]) == 2
    saved = storage.load_weights(folder / "model.safetensors")
    assert not any("lora" in name for name in saved)
    assert all(torch.equal(saved[name], tensor) for name, tensor in weights(trained).items())


def test_the_text_must_hold_a_window_and_its_next_token_at_two_starts_at_least(tmp_path):
    with pytest.raises(ValueError, match="not enough training text: 33 tokens for windows of 33"):
        adapt(tiny_llama(0, 32), TEXT[:33], config(steps=1), tmp_path / "short")
    _, record = adapt(tiny_llama(0, 32), TEXT[:34], config(steps=1), tmp_path / "enough")
    assert len(record["losses"]) == 1


def test_a_batch_the_processes_cannot_share_is_refused_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=r"--finetune-batch \(3\) must be divisible by the number of processes \(2\)"):
        adapt(tiny_llama(0, 32), TEXT, config(batch=3), tmp_path / "run", world_size=2)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("overrides,match", [
    (dict(window=300), "--finetune-window \\(300\\) must be at most --to \\(256\\)"),
    (dict(mode="full"), "--finetune full trains on windows of --to"),
    (dict(mode="pos"), "--finetune must be one of"),
    (dict(lora=-1), "--lora must be an integer >= 1"),
    (dict(target=1, window=1), "--to must be an integer >= 2, got 1"),
    (dict(window=1), "--finetune-window must be an integer >= 2, got 1"),
    (dict(steps=0), "--finetune-steps must be an integer >= 1, got 0"),
    (dict(lr=0.0), "--finetune-lr must be a finite number > 0.0, got 0.0"),
    (dict(batch=0), "--finetune-batch must be an integer >= 1, got 0"),
    (dict(chunks=0), "--pose-chunks must be an integer >= 1, got 0"),
    (dict(warmup=-1), "--finetune-warmup must be an integer >= 0, got -1"),
    (dict(checkpoint_every=0), "checkpoint_every must be an integer >= 1, got 0"),
])
def test_bad_options_are_one_line_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        config(**overrides)
    for rank in (0, True, 2.0):
        with pytest.raises(ValueError, match="--lora must be a rank >= 1"):
            adapting.check_lora_rank(rank)


def test_each_option_at_its_edge_is_accepted():
    for edge in (dict(target=2, window=2), dict(window=256), dict(warmup=0), dict(lora=1)):
        config(**edge)
    adapting.check_lora_rank(1)


def test_lora_adapters_have_the_rank_asked_for_and_scale_by_two():
    wrapped = with_lora(tiny_llama(0, 32), 3)
    adapted = [module for module in wrapped.modules() if hasattr(module, "lora_A") and module.lora_A]
    assert len(adapted) == 4 * 2  # q, k, v, o in both layers
    assert all(module.lora_A["default"].weight.shape[0] == 3 for module in adapted)
    assert all(module.scaling["default"] == 2.0 for module in adapted)  # lora_alpha = 2 · rank


def test_each_step_is_adamw_at_the_scheduled_rate_on_clipped_gradients(tmp_path):
    """A hand-written loop of the documented recipe gives the run's losses and weights."""
    chosen = config(steps=4, warmup=2)
    _, record = adapt(tiny_llama(0, 32), TEXT, chosen, tmp_path / "run")
    model = tiny_llama(0, 32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=chosen.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(chosen.seed)
    losses, norms = [], []
    for step in range(chosen.steps):
        starts = torch.randint(0, TEXT.shape[0] - 33, (2,), generator=generator)
        windows = torch.stack([TEXT[s : s + 33] for s in starts.tolist()])
        ids = position_ids(chosen, generator)
        logits = model(input_ids=windows[:, :-1], position_ids=ids).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)))
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, chosen)
        optimizer.step()
        losses.append(loss.item())
    assert min(norms) > 2.0  # so a clip at 2 would step differently
    assert record["losses"] == pytest.approx(losses, rel=1e-6)
    trained = storage.load_weights(tmp_path / "run" / "model.safetensors")
    for name, tensor in weights(model).items():
        torch.testing.assert_close(trained[name], tensor, rtol=1e-5, atol=1e-6)


def test_weights_without_their_record_are_trained_again(tmp_path):
    folder = tmp_path / "run"
    adapt(tiny_llama(0, 32), TEXT, config(steps=2), folder)
    (folder / "adapt.json").unlink()  # killed between the two writes
    _, record = adapt(tiny_llama(0, 32), TEXT, config(steps=2), folder)
    assert len(record["losses"]) == 2 and (folder / "adapt.json").exists()


def embedding_sum(model) -> float:
    """A number every step moves: what a curve point measures of the model it is given."""
    return float(model.model.embed_tokens.weight.detach().double().sum())


def crash_on_forward(model, call: int):
    """``model`` whose ``call``-th forward raises KeyboardInterrupt (a kill during that training step)."""
    model.forward = raising_on_call(model.forward, call)
    return model


def test_checkpoints_fall_every_checkpoint_every_steps(tmp_path):
    folder = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):  # the fifth step is interrupted: steps 1 to 4 are done
        adapt(crash_on_forward(tiny_llama(0, 32), 5), TEXT, config(checkpoint_every=3), folder)
    assert storage.load_checkpoint(folder / "last.pt")["step"] == 3
    assert not (folder / "adapt.json").exists()


def test_a_run_killed_after_a_curve_point_keeps_it_and_ends_as_the_uninterrupted_run(tmp_path):
    chosen, points = config(checkpoint_every=3), (0, 4, 6)
    began = time.perf_counter()
    whole, record = adapt(tiny_llama(0, 32), TEXT, chosen, tmp_path / "whole", points=points, measure=embedding_sum)
    assert 0 < record["wall_time_s"] <= time.perf_counter() - began
    assert set(record) == {"config", "losses", "curve", "wall_time_s"} and record["config"] == asdict(chosen)
    folder = tmp_path / "killed"
    began = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):  # point 4 is measured and saved, then step 5 is interrupted
        adapt(crash_on_forward(tiny_llama(0, 32), 6), TEXT, chosen, folder, points=points, measure=embedding_sum)
    saved = storage.load_checkpoint(folder / "last.pt")
    assert saved["step"] == 4 and saved["curve"] == {key: record["curve"][key] for key in ("0", "4")}
    assert saved["losses"] == record["losses"][:4]

    def measured_again(model):  # a value no earlier point can have: shows which points were measured after resuming
        return embedding_sum(model) + 1000.0

    resumed, again = adapt(tiny_llama(0, 32), TEXT, chosen, folder, points=points, measure=measured_again)
    assert again["curve"] == {"0": record["curve"]["0"], "4": record["curve"]["4"], "6": record["curve"]["6"] + 1000}
    assert again["losses"] == pytest.approx(record["losses"], rel=1e-6)
    assert 0 < again["wall_time_s"] <= time.perf_counter() - began
    for name, tensor in weights(whole).items():
        torch.testing.assert_close(weights(resumed)[name], tensor, rtol=1e-5, atol=1e-6)
