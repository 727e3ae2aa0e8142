"""Fully sharded fine-tuning (FSDP2, ``torch.distributed.fsdp.fully_shard``) of a transformers model under torchrun.

Each rank keeps the whole model it was given (the measurements read it) and trains a sharded copy: every decoder
layer (the classes a transformers model names in ``_no_split_modules``) and then the root are one ``fully_shard``
unit each, so a rank holds 1/N of the trained parameters, their gradients and AdamW's two moments, and gathers a
layer's parameters only while it runs. Gradients are averaged across ranks by the reduce-scatter, so with each rank
training on its rows of one global batch N processes follow one process's run.

The functions that gather (``full_parameters``, ``optimizer_state``) are collective: every rank calls them.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor


def sharded_copy(model: nn.Module, blocks: tuple[str, ...]) -> nn.Module:
    """A copy of ``model`` with each submodule whose class is named in ``blocks``, then the root, sharded."""
    if not blocks:
        raise ValueError("sharded fine-tuning needs the model's layer classes (transformers' _no_split_modules)")
    replica = copy.deepcopy(model)
    for module in list(replica.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(replica)
    return replica


def layer_classes(model: nn.Module) -> tuple[str, ...]:
    """The decoder-layer class names of a transformers model (a peft model passes on its base model's); () for a
    module without them."""
    return tuple(getattr(model, "_no_split_modules", None) or ())


def full_parameters(parameters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every parameter whole (a sharded one gathered from the ranks), detached; collective."""
    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for name, p in parameters.items()}


def load_parameters(model: nn.Module, parameters: dict[str, torch.Tensor], values: dict[str, torch.Tensor],
                    sharded: bool) -> None:
    """Copy whole tensors into ``model``'s ``parameters``; sharded, each rank takes its shard (collective)."""
    if sharded:
        set_model_state_dict(model, values, options=StateDictOptions(full_state_dict=True, strict=False))
        return
    with torch.no_grad():
        for name, parameter in parameters.items():
            parameter.copy_(values[name])


def optimizer_state(parameters: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> dict:
    """{parameter name: {state key: whole tensor}}: the optimizer's per-parameter state by name, sharded tensors
    gathered (collective), so a checkpoint does not depend on how many processes wrote it. (torch's
    ``get_optimizer_state_dict`` would do it, but it first takes a zero-gradient step to create missing state,
    which counts in Adam's bias correction.)"""
    return {name: {key: (value.full_tensor() if isinstance(value, DTensor) else value).detach().clone()
                   for key, value in optimizer.state[p].items()}
            for name, p in parameters.items() if p in optimizer.state}


def load_optimizer_state(parameters: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer, state: dict) -> None:
    """The inverse of ``optimizer_state``: each rank takes its shard of a sharded parameter's tensors."""
    for name, p in parameters.items():
        if name in state:
            optimizer.state[p] = {key: _like(p, value) for key, value in state[name].items()}


def _like(parameter: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``value`` placed as ``parameter`` is (sharded the same way) when it has the parameter's shape."""
    if isinstance(parameter, DTensor) and value.shape == parameter.shape:
        return distribute_tensor(value.to(parameter.device), parameter.device_mesh, parameter.placements)
    return value.to(parameter.device)
