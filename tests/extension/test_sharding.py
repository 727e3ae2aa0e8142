"""Fine-tuning under torchrun shards the model with FSDP2: two CPU processes over gloo end where one process ends
(full fine-tuning, LoRA, and a run killed at a curve point and resumed), and a run killed under two processes
resumes under one."""

import os
import re
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from posenc import storage
from posenc.experiments.pretrained.measure import tiny_llama
from posenc.extension import sharding
from posenc.extension.adapt import AdaptConfig, adapt
from tests.helpers import raising_on_call

TEXT = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(0))
POINTS = (0, 4, 6)


def config(**overrides):
    return AdaptConfig(**{"mode": "pose", "target": 256, "window": 32, "steps": 6, "lr": 1e-3, "batch": 2,
                          "checkpoint_every": 2, **overrides})


def first_logit(model) -> float:
    """A number every trained weight moves: the curve's measurement."""
    with torch.no_grad():
        return model(input_ids=TEXT[None, :40]).logits[0, -1, :8].sum().item()


class Crash(Exception):
    pass


def crash_at_the_second_point():
    return raising_on_call(first_logit, 2, Crash)


def check_loading_some_parameters(replica) -> None:
    """Whole tensors for some of a sharded model's parameters: those change on every rank, the others do not."""
    parameters = dict(replica.named_parameters())
    before = sharding.full_parameters(parameters)  # collective, as each full_tensor() below
    changed = "model.norm.weight"
    sharding.load_parameters(replica, {changed: parameters[changed]}, {changed: before[changed] + 1}, sharded=True)
    for name, parameter in parameters.items():
        want = before[name] + 1 if name == changed else before[name]
        torch.testing.assert_close(parameter.full_tensor(), want, rtol=0, atol=0, msg=name)


def check_moments_round_trip(replica) -> None:
    """AdamW's moments gathered whole by name, then loaded into a new optimizer: each rank holds its shard, placed
    as its parameter is (not replicated), with the gathered values."""
    parameters = dict(replica.named_parameters())
    optimizer = torch.optim.AdamW(replica.parameters())
    replica(input_ids=TEXT[None, :16]).logits.sum().backward()
    optimizer.step()
    moments = sharding.optimizer_state(parameters, optimizer)
    fresh = torch.optim.AdamW(replica.parameters())
    sharding.load_optimizer_state(parameters, fresh, moments)
    for name, parameter in parameters.items():
        assert not isinstance(moments[name]["exp_avg"], DTensor) and moments[name]["exp_avg"].shape == parameter.shape
        assert fresh.state[parameter].keys() == moments[name].keys() == {"step", "exp_avg", "exp_avg_sq"}, name
        for key in ("exp_avg", "exp_avg_sq"):
            loaded = fresh.state[parameter][key]
            assert isinstance(loaded, DTensor) and loaded.placements == parameter.placements, (name, key)
            assert loaded.to_local().shape == parameter.to_local().shape, (name, key)
            torch.testing.assert_close(loaded.full_tensor(), moments[name][key], rtol=0, atol=0, msg=name)


def run_jobs(rank: int, world_size: int, port: int, folder: str) -> None:
    """One process of the group: full fine-tuning, LoRA, a crash at step 4 and its resumption, another crash."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        model = tiny_llama(0, 32)
        replica = sharding.sharded_copy(model, sharding.layer_classes(model))  # each rank holds half of each tensor
        for name, parameter in replica.named_parameters():
            assert isinstance(parameter, DTensor) and parameter.to_local().shape[0] == parameter.shape[0] // 2, name
        assert not any(isinstance(p, DTensor) for p in model.parameters())  # the measured model stays whole
        check_loading_some_parameters(replica)
        check_moments_round_trip(replica)
        for name, lora in (("full", 0), ("lora", 4)):
            adapt(tiny_llama(0, 32), TEXT, config(lora=lora), f"{folder}/{name}", points=POINTS, measure=first_logit,
                  rank=rank, world_size=world_size)
        with pytest.raises(Crash):
            adapt(tiny_llama(0, 32), TEXT, config(), f"{folder}/resumed", points=POINTS,
                  measure=crash_at_the_second_point(), rank=rank, world_size=world_size)
        dist.barrier()
        adapt(tiny_llama(0, 32), TEXT, config(), f"{folder}/resumed", points=POINTS, measure=first_logit, rank=rank,
              world_size=world_size)
        with pytest.raises(Crash):
            adapt(tiny_llama(0, 32), TEXT, config(), f"{folder}/crashed", points=POINTS,
                  measure=crash_at_the_second_point(), rank=rank, world_size=world_size)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp")
    mp.start_processes(run_jobs, args=(2, free_port(), str(folder)), nprocs=2, start_method="spawn")
    return folder


@pytest.mark.parametrize("name, lora", [("full", 0), ("lora", 4), ("resumed", 0)])
def test_two_sharded_processes_train_the_weights_one_process_trains(two_processes, tmp_path, name, lora):
    model, record = adapt(tiny_llama(0, 32), TEXT, config(lora=lora), tmp_path / "one", points=POINTS,
                          measure=first_logit)
    sharded = storage.load_weights(two_processes / name / "model.safetensors")
    want = dict(model.named_parameters())
    assert set(sharded) == set(want)
    for key, tensor in want.items():
        torch.testing.assert_close(sharded[key], tensor.detach(), rtol=1e-4, atol=1e-5, msg=key)
    got = storage.read_json(two_processes / name / "adapt.json")
    assert got["losses"] == pytest.approx(record["losses"], abs=1e-5)  # the global batch's loss, not rank 0's
    assert got["curve"].keys() == record["curve"].keys() == {"0", "4", "6"}
    assert list(got["curve"].values()) == pytest.approx(list(record["curve"].values()), abs=1e-4)
    assert record["curve"]["0"] != pytest.approx(record["curve"]["6"], abs=1e-3)  # the curve saw training


def test_a_run_killed_under_two_processes_resumes_under_one(two_processes, tmp_path):
    whole, record = adapt(tiny_llama(0, 32), TEXT, config(), tmp_path / "whole", points=POINTS, measure=first_logit)
    state = storage.load_checkpoint(two_processes / "crashed" / "last.pt")
    assert state["step"] == 4 and set(state["moments"]) == set(state["trainable"])  # whole tensors, by name
    assert state["moments"]["model.norm.weight"]["exp_avg"].shape == whole.model.norm.weight.shape
    resumed, again = adapt(tiny_llama(0, 32), TEXT, config(), two_processes / "crashed", points=POINTS,
                           measure=first_logit)
    for key, tensor in whole.named_parameters():
        torch.testing.assert_close(dict(resumed.named_parameters())[key], tensor, rtol=1e-4, atol=1e-5, msg=key)
    assert again["losses"] == pytest.approx(record["losses"], abs=1e-5)


def test_layer_classes_are_a_transformers_models_or_the_ones_a_peft_model_wraps():
    peft = pytest.importorskip("peft")
    model = tiny_llama(0, 32)
    assert sharding.layer_classes(model) == ("LlamaDecoderLayer",)
    wrapped = peft.get_peft_model(tiny_llama(0, 32), peft.LoraConfig(r=4, target_modules=["q_proj"]))
    assert sharding.layer_classes(wrapped) == ("LlamaDecoderLayer",)
    assert sharding.layer_classes(torch.nn.Linear(2, 2)) == ()
    refusal = "sharded fine-tuning needs the model's layer classes (transformers' _no_split_modules)"
    with pytest.raises(ValueError, match="^" + re.escape(refusal) + "$"):
        sharding.sharded_copy(torch.nn.Linear(2, 2), ())


def test_a_checkpoint_from_an_older_posenc_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "run"
    with pytest.raises(Crash):
        adapt(tiny_llama(0, 32), TEXT, config(), folder, points=POINTS, measure=crash_at_the_second_point())
    state = storage.load_checkpoint(folder / "last.pt")
    del state["moments"]
    storage.save_checkpoint(folder / "last.pt", state)
    with pytest.raises(ValueError, match="written by an older posenc; delete it"):
        adapt(tiny_llama(0, 32), TEXT, config(), folder, points=POINTS, measure=first_logit)
