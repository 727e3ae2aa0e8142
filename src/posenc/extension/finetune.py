"""Fine-tune a trained model at a longer length, measuring it on the way.

``finetune`` continues a finished model (already holding its pretrained weights and
the scaling it will run with) through ``train.py``'s loop: same optimizer, warmup +
cosine schedule, atomic resumable checkpoints, DDP, with its own steps, learning rate
and warmup. At each of ``points`` (training steps) it stops, scores the model with
``measure`` and records the value in ``curve.json``; the finished weights go to
``model.safetensors`` and the metrics to ``finetune.json`` (written last: its presence
means finished). Killed at any moment, a second call loses no finished point or step.

Folder layout: ``last.pt`` (in progress), ``curve.json``, ``model.safetensors``, ``finetune.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from .. import storage
from ..lm.train import TrainConfig, train


def curve_points(steps: int, count: int = 6) -> list[int]:
    """0 and steps/2^k for k = count-2 .. 0: the early steps, where 'minimal' is decided, get most points."""
    points = {0, steps}
    points.update(max(1, round(steps / 2**k)) for k in range(count - 1))
    return sorted(p for p in points if p <= steps)


def finetune(
    model: nn.Module,
    data: torch.Tensor,
    config: TrainConfig,
    folder: Path,
    *,
    points: list[int] = (),
    measure: Callable[[nn.Module], float] | None = None,
    device: torch.device = torch.device("cpu"),
    autocast_dtype: torch.dtype | None = None,
    rank: int = 0,
    world_size: int = 1,
    label: str = "fine-tune",
) -> dict:
    """Fine-tune ``model`` in place (or load the finished result); returns the metrics with the curve.

    Args:
        model: the model to continue, with its pretrained weights loaded.
        data: (N,) training bytes; windows of ``config.length`` are drawn from it.
        points: steps in [0, config.steps] at which ``measure(model)`` is recorded (0: before training).
    Returns:
        train()'s metrics plus {"curve": {step: value}} (steps as strings, as in JSON).
    """
    if config.steps < 1:
        raise ValueError(f"fine-tuning needs steps >= 1, got {config.steps}")
    folder = Path(folder)
    done, weights = folder / "finetune.json", folder / "model.safetensors"
    if done.exists() and weights.exists():
        model.load_state_dict(storage.load_weights(weights))
        return storage.read_json(done)
    curve_path = folder / "curve.json"
    curve = storage.read_json(curve_path) if curve_path.exists() else {}
    checkpoint = folder / "last.pt"
    for point in sorted(set(points) | {config.steps}):
        if point > 0 and (str(point) not in curve or point == config.steps):
            metrics = train(model, data, config, checkpoint=checkpoint, device=device, autocast_dtype=autocast_dtype,
                            rank=rank, world_size=world_size, label=label, until=point)
            if world_size > 1:
                dist.barrier()  # rank 0's checkpoint at this point is written before any rank reloads it
        elif point > 0:
            continue  # measured before an interruption: the checkpoint is already past it
        if measure is not None and point in points and str(point) not in curve and rank == 0:
            curve[str(point)] = measure(model)
            storage.write_json(curve_path, curve)
    metrics["curve"] = {step: curve[step] for step in sorted(curve, key=int)}
    if rank == 0:
        storage.save_weights(weights, model.state_dict())
        storage.write_json(done, metrics)
        checkpoint.unlink(missing_ok=True)
    return metrics
