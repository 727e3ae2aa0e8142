"""Training stages of ``posenc extend``: each fine-tuned row at every rate of the sweep, the rate chosen on dev,
and RoPE trained from scratch at the target length on the same tokens as pretraining plus fine-tuning.

Folder layout under the run: ``finetune/<row>/seed<k>/lr<rate>/`` (finetune.py's checkpoint, curve, weights)
and ``finetune/<row>/seed<k>/selection.json`` (each rate's dev score and the chosen rate), ``scratch/seed<k>/``.
The curve along each fine-tuning is scored on test windows; only the dev score chooses.
"""

from __future__ import annotations

import torch

from ... import storage
from ...extension.finetune import curve_points, finetune
from ...lm.evaluate import evaluate
from ...lm.model import LanguageModel
from ...lm.runtime import Runtime
from ...lm.train import TrainConfig, train
from ..rate_grid import choose_rate, rate_key
from .config import ExtendRow
from .plan import Plan


def load(p: Plan, row: ExtendRow, scaling: dict | None, weights) -> LanguageModel:
    max_positions = p.target if row.method == "scratch" else None
    model = LanguageModel(p.model_config(row.trains, scaling if row.trains == "rope" else None, max_positions))
    model.load_state_dict(storage.load_weights(weights))
    return model


def finetune_config(p: Plan, lr: float, seed: int) -> TrainConfig:
    return TrainConfig(steps=p.config.finetune_steps, batch_size=p.config.finetune_batch, length=p.target, lr=lr,
                       warmup=p.config.finetune_warmup, checkpoint_every=max(1, p.config.finetune_steps // 4),
                       seed=seed + 1)


def row_folder(p: Plan, row: ExtendRow, seed: int):
    return p.out / "finetune" / row.slug / f"seed{seed}"


def rate_folder(p: Plan, row: ExtendRow, seed: int, lr: float):
    return row_folder(p, row, seed) / f"lr{rate_key(lr)}"


def bits_at_target(model, windows, p: Plan, runtime: Runtime, label: str) -> list[float]:
    result = evaluate(model, windows.tokens, [p.target], stride=p.config.eval_stride,
                      autocast_dtype=runtime.autocast_dtype, label=label)
    return result["window_bits"][p.target]


def sweep_row(p: Plan, row: ExtendRow, seed: int, scaling: dict | None, runtime: Runtime, log) -> dict | None:
    """Fine-tune ``row`` at every rate of the grid, widened past an edge while the best rate sits at one
    (``rate_grid.choose_rate``); on rank 0 return the selection.

    Returns {"lr": chosen, "dev_bits": {rate: bits}, "widened": [rates added], "at_edge": bool,
    "curves": {rate: {step: {"mean", "window_bits"}}}, "wall_time_s"} (None on other ranks)."""
    selection_path = row_folder(p, row, seed) / "selection.json"
    if selection_path.exists():
        return storage.read_json(selection_path)
    curve_windows, sweep_windows = p.curve_windows(), p.sweep_windows()

    def measure(model) -> dict:
        bits = bits_at_target(model, curve_windows, p, runtime, f"curve {row.name}")
        return {"mean": sum(bits) / len(bits), "window_bits": bits}

    curves, wall = {}, [0.0]

    def dev_bits(lr: float) -> float:
        """Fine-tune at ``lr`` (every rank) and score it on the dev windows; the choice is made by rank 0, and
        the other ranks follow it, since every rank sees the same value: rank 0's, broadcast."""
        model = load(p, row, scaling, p.checkpoint(row.trains, seed))
        metrics = finetune(model, p.corpus.train.data, finetune_config(p, lr, seed), rate_folder(p, row, seed, lr),
                           points=curve_points(p.config.finetune_steps), measure=measure, device=runtime.device,
                           autocast_dtype=runtime.autocast_dtype, rank=runtime.rank, world_size=runtime.world_size,
                           label=f"fine-tune {row.name} lr {lr:g} (seed {seed}) @ {p.target}")
        wall[0] += metrics["wall_time_s"]
        value = 0.0
        if runtime.rank == 0:
            bits = bits_at_target(model.to(runtime.device), sweep_windows, p, runtime, f"dev {row.name} lr {lr:g}")
            value = sum(bits) / len(bits)
            curves[rate_key(lr)] = metrics["curve"]
        return runtime.broadcast_float(value)

    chosen = choose_rate(p.config.finetune_lrs, dev_bits, p.config.finetune_widenings, "--finetune-lrs")
    if runtime.rank != 0:
        return None
    selection = {"lr": chosen["lr"], "dev_bits": chosen["scores"], "widened": chosen["widened"],
                 "at_edge": chosen["at_edge"], "dev_windows": len(sweep_windows.files), "curves": curves,
                 "wall_time_s": wall[0]}
    storage.write_json(selection_path, selection)
    log(f"{row.name} (seed {seed}): dev bits at {p.target} by rate "
        + ", ".join(f"{lr}: {v:.3f}" for lr, v in chosen["scores"].items())
        + f"; chosen {chosen['lr']:g}" + (" (still at the grid's edge)" if chosen["at_edge"] else ""))
    return selection


def scratch_tokens(p: Plan) -> int:
    """Pretraining plus one fine-tuning's tokens: what every fine-tuned row has seen."""
    return (p.base.steps * p.base.batch_size * p.base.train_length
            + p.config.finetune_steps * p.config.finetune_batch * p.target)


def scratch_config(p: Plan, seed: int) -> TrainConfig:
    """Batches of ``finetune_batch`` windows at the target length, as many steps as the token budget asks."""
    per_step = p.config.finetune_batch * p.target
    steps = -(-scratch_tokens(p) // per_step)
    return TrainConfig(steps=steps, batch_size=p.config.finetune_batch, length=p.target, lr=p.base.lr,
                       warmup=p.base.warmup, checkpoint_every=p.base.checkpoint_every, seed=seed)


def train_from_scratch(p: Plan, seed: int, runtime: Runtime, log) -> dict:
    """RoPE trained at the target length on pretraining + fine-tuning tokens (the ceiling)."""
    folder = p.out / "scratch" / f"seed{seed}"
    if (folder / "train.json").exists() and (folder / "model.safetensors").exists():
        return storage.read_json(folder / "train.json")
    torch.manual_seed(seed)
    model = LanguageModel(p.model_config("rope", None, p.target))
    config = scratch_config(p, seed)
    metrics = train(model, p.corpus.train.data, config, checkpoint=folder / "last.pt", device=runtime.device,
                    autocast_dtype=runtime.autocast_dtype, rank=runtime.rank, world_size=runtime.world_size,
                    label=f"train rope @ {p.target} from scratch (seed {seed})")
    metrics["tokens"] = config.steps * config.batch_size * config.length
    if runtime.rank != 0:
        return metrics
    storage.save_weights(folder / "model.safetensors", model.state_dict())
    storage.write_json(folder / "train.json", metrics)
    (folder / "last.pt").unlink(missing_ok=True)
    log(f"rope trained at {p.target} from scratch (seed {seed}): {metrics['wall_time_s']:.0f}s")
    return metrics


def weights(p: Plan, row: ExtendRow, seed: int, selections: dict):
    """The weights a row is evaluated with: the base checkpoint, the chosen rate's fine-tune, or from scratch."""
    if row.stage == "fine-tuned":
        return rate_folder(p, row, seed, selections[row.name]["lr"]) / "model.safetensors"
    if row.stage == "from scratch":
        return p.out / "scratch" / f"seed{seed}" / "model.safetensors"
    return p.checkpoint(row.trains, seed)
