"""The training loop: AdamW, linear warmup + cosine decay, gradient clipping,
atomic resumable checkpoints, optional DDP (each rank takes a slice of one global batch)."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from .. import storage
from ..positions import randomized_positions
from .data import train_batch


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    length: int
    lr: float
    warmup: int
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    checkpoint_every: int = 100
    seed: int = 0
    #: > 0: train on randomized positions, a sorted random subset of [0, random_positions) per row
    random_positions: int = 0


def learning_rate(step: int, config) -> float:
    """Linear warmup to ``lr``, then cosine decay to 10% of it at the last step. ``config``: anything with ``lr``,
    ``warmup`` and ``steps`` (a TrainConfig, or extension.adapt's AdaptConfig)."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))


def train(
    model: nn.Module,
    data: torch.Tensor,
    config: TrainConfig,
    *,
    checkpoint: Path,
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
    rank: int = 0,
    world_size: int = 1,
    label: str = "train",
    compile: bool = False,
    until: int | None = None,
    sample=train_batch,
) -> dict:
    """Train ``model`` in place on random windows of ``data``; resume from ``checkpoint`` if present.

    ``sample(data, length, batch, generator) -> (inputs, targets)`` draws a batch (default: windows
    of a byte corpus; a synthetic task passes its own, with ignored targets where nothing is scored).

    Every rank draws the same global batch (same seeded generator) and trains on its
    rows ``rank::world_size``, so N processes follow the same data order as one.
    With ``compile`` the forward pass runs under ``torch.compile(fullgraph=True)``
    (same weights and checkpoints; the first steps pay the compilation).
    With ``until`` it stops after that step, checkpointed, on the full run's learning-rate
    schedule: a later call continues it (fine-tuning curves measure the model on the way).
    Returns metrics: final loss, steps, tokens/s, wall time.
    """
    if config.batch_size % world_size:
        raise ValueError(f"batch_size ({config.batch_size}) must be divisible by the number of processes ({world_size})")
    model.to(device)
    optimizer = _optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)
    start, losses, elapsed = 0, [], 0.0
    if checkpoint.exists():
        state = storage.load_checkpoint(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        start, losses, elapsed = int(state["step"]), list(state["losses"]), float(state["elapsed"])
    ddp = world_size > 1
    trained = nn.parallel.DistributedDataParallel(model) if ddp else model
    if compile:
        torch._dynamo.reset()  # one model trains at a time: drop the graphs of earlier ones
        trained = torch.compile(trained, fullgraph=not ddp)  # DDP's bucketing hooks split the graph
    model.train()
    bar = tqdm(total=config.steps, initial=start, desc=label, disable=rank != 0, mininterval=1.0, dynamic_ncols=True)
    began = time.perf_counter() - elapsed
    tokens_per_step = config.batch_size * config.length
    stop = config.steps if until is None else min(until, config.steps)
    for step in range(start, stop):
        inputs, targets = sample(data, config.length, config.batch_size, generator)
        inputs, targets = inputs[rank::world_size].to(device), targets[rank::world_size].to(device)
        positions = None
        if config.random_positions:
            positions = randomized_positions(config.batch_size, config.length, config.random_positions, generator)
            positions = positions[rank::world_size].to(device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = trained(inputs, positions)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        wall = time.perf_counter() - began
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{(step + 1 - start) * tokens_per_step / max(wall - elapsed, 1e-9):,.0f}")
        done = step + 1
        if rank == 0 and (done % config.checkpoint_every == 0 or done == stop):
            storage.save_checkpoint(checkpoint, {
                "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(), "step": done, "losses": losses, "elapsed": wall,
                "config": asdict(config),
            })
    bar.close()
    wall = time.perf_counter() - began
    tail = losses[-max(1, len(losses) // 20):]
    return {
        "steps": stop,
        "final_loss": sum(tail) / len(tail),
        "final_bits_per_byte": sum(tail) / len(tail) / math.log(2),
        "wall_time_s": wall,
        "tokens_per_s": stop * tokens_per_step / max(wall, 1e-9),
    }
