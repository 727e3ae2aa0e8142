"""``posenc task``: train each row on the task at one length, score exact match at 1×…8×.

Flow: for each seed and row: train (resumable checkpoint) -> final weights -> exact match on
``eval_sequences`` dev and test sequences per length -> results.json, results.md, tasks.png, and a table.
Dev and test sequences each come from a generator seeded by their split's seed plus the length, far from any
training seed, so every row and seed answers the same questions; whatever a run is tuned by (a budget, a preset)
reads dev, and every reported cell is test. A cell is the mean over the test sequences with a 95% bootstrap
interval that resamples sequences (a recall sequence's answers together, never answer by answer), and the
spread over seeds when there are several.

With a rate grid (``--lrs``), each row and seed trains at every rate of it, widened past its edge while the best
rate sits there (``rate_grid``), and keeps the rate whose model has the lowest loss on the scored tokens of dev
sequences at the training length: a choice on dev, in distribution; the lengths past it are what is measured.
With ``--lr-sweep-seeds K`` only the first K seeds sweep; each later seed trains once, at the rate with the lowest
mean dev loss over those K (``rate_grid.inherit_rate``).

Run directory: ``config.json``; ``checkpoints/<row>-seed<k>/`` (last.pt while training,
model.safetensors + train.json when done; with ``--lrs`` one ``lr<rate>/`` folder per rate and
``selection.json``); ``evals/<row>-seed<k>.json``. ``--resume`` skips what is finished.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ... import storage
from ...lm.model import LanguageModel
from ...lm.runtime import Runtime
from ...lm.tasks import IGNORE, exact_match
from ...lm.train import TrainConfig, train
from .. import pinning
from ..rate_grid import check_trained, choose_rate, inherit_rate, rate_key
from . import report
from .collect import collect
from .config import DEV_SEED, SPLIT_SEEDS, TaskConfig

EVAL_BATCH = 64
#: the fields a checkpoint depends on: a resumed run must keep them
TRAINING_FIELDS = ("task", "dim", "num_layers", "num_heads", "train_length", "batch_size", "steps", "lr", "warmup",
                   "lrs", "lr_widenings", "lr_sweep_seeds")


def run(config: TaskConfig, out: Path, *, resume: bool = False, log=print) -> dict:
    """Run the task experiment into ``out``; returns the results dict (also written to results.json)."""
    runtime = Runtime.detect(config.device)
    for _, encoding, randomized in config.rows:  # sizes an encoding rejects fail before any training
        LanguageModel(config.model_config(encoding, randomized))
    _prepare(out, config, resume)
    task = config.task_spec
    log(f"task: {config.task} ({task}), trained at {config.train_length} tokens; device: {runtime.label}; "
        f"run directory: {out}")
    started = time.perf_counter()
    trainings = {}
    for seed in range(config.seed, config.seed + config.seeds):
        for name, encoding, randomized in config.rows:
            model, trainings[f"{name}-seed{seed}"] = _train_row(config, name, encoding, randomized, seed, out, runtime,
                                                                log)
            _evaluate(config, name, model, seed, out, runtime, log)
    results = collect(config, out, trainings, time.perf_counter() - started)
    report.write_all(results, out)
    log("")
    log(report.terminal_table(results))
    log(f"\nwrote {out / 'results.json'}, results.md, tasks.png")
    return results


def _prepare(out: Path, config: TaskConfig, resume: bool) -> None:
    held = pinning.open_pin(out, resume, kind="task")
    if held is None:
        pinning.write_pin(out, config.to_dict())
        return
    pinning.refuse_changes(out, pinning.changed_fields(config.to_dict(), held, "tasks", TRAINING_FIELDS),
                           did="trained")


def _train_row(config: TaskConfig, name, encoding, randomized, seed, out, runtime, log):
    """The row's model for this seed and its training metrics: trained at ``config.lr``, or with a rate grid at
    the rate chosen on dev (the metrics then carry "lr" and "sweep": the selection, with "sweep_seconds"; for a
    seed past ``config.sweep_seeds``, ``rate_grid.inherit_rate``'s)."""
    folder = out / "checkpoints" / f"{name}-seed{seed}"
    if not config.lrs:
        model, metrics = _train_one(config, name, encoding, randomized, seed, config.lr, folder, runtime, log)
        return model, check_trained(f"{name} (seed {seed})", metrics, config.lr)
    if seed not in config.sweep_seeds:
        inherited = inherit_rate(config.lrs, [storage.read_json(folder.parent / f"{name}-seed{s}" / "selection.json")
                                              for s in config.sweep_seeds], config.sweep_seeds)
        model, metrics = _train_one(config, name, encoding, randomized, seed, inherited["lr"],
                                    folder / f"lr{rate_key(inherited['lr'])}", runtime, log)
        check_trained(f"{name} (seed {seed})", metrics, inherited["lr"])
        return model, {**metrics, "lr": inherited["lr"], "sweep": inherited}
    selection_path = folder / "selection.json"
    if not selection_path.exists():
        seconds = []

        def dev_loss(lr: float) -> float:
            model, metrics = _train_one(config, name, encoding, randomized, seed, lr, folder / f"lr{rate_key(lr)}",
                                        runtime, log)
            seconds.append(metrics["wall_time_s"])
            return _scored_loss(config, model, DEV_SEED, runtime)

        chosen = choose_rate(config.lrs, dev_loss, config.lr_widenings, "--lrs")
        storage.write_json(selection_path, {**chosen, "sweep_seconds": sum(seconds)})
        log(f"{name} (seed {seed}): dev loss at {config.train_length} by rate "
            + ", ".join(f"{lr}: {v:.4f}" for lr, v in chosen["scores"].items()) + f"; chosen {chosen['lr']:g}"
            + (" (still at the grid's edge)" if chosen["at_edge"] else ""))
    selection = storage.read_json(selection_path)
    model, metrics = _train_one(config, name, encoding, randomized, seed, selection["lr"],
                                folder / f"lr{rate_key(selection['lr'])}", runtime, log)
    return model, {**metrics, "lr": selection["lr"], "sweep": selection}


def _train_one(config: TaskConfig, name, encoding, randomized, seed, lr, folder, runtime, log):
    torch.manual_seed(seed)
    model = LanguageModel(config.model_config(encoding, randomized))
    if (folder / "train.json").exists() and (folder / "model.safetensors").exists():
        log(f"{name} (seed {seed}, lr {lr:g}): already trained, skipping")
        model.load_state_dict(storage.load_weights(folder / "model.safetensors"))
        return model.to(runtime.device).eval(), storage.read_json(folder / "train.json")
    train_config = TrainConfig(steps=config.steps, batch_size=config.batch_size, length=config.train_length,
                               lr=lr, warmup=config.warmup, checkpoint_every=config.checkpoint_every,
                               seed=seed,
                               random_positions=max(config.eval_lengths) if randomized else 0)
    task = config.task_spec
    metrics = train(model, task, train_config, checkpoint=folder / "last.pt", device=runtime.device,
                    autocast_dtype=runtime.autocast_dtype, label=f"train {name} (seed {seed}, lr {lr:g})",
                    sample=lambda spec, length, batch, generator: spec.batch(length, batch, generator))
    storage.save_weights(folder / "model.safetensors", model.state_dict())
    storage.write_json(folder / "train.json", metrics)  # written last: its presence means "finished"
    (folder / "last.pt").unlink(missing_ok=True)
    log(f"{name} (seed {seed}, lr {lr:g}): trained in {metrics['wall_time_s']:.0f}s, "
        f"final loss {metrics['final_loss']:.3f}")
    return model.eval(), metrics


@torch.no_grad()
def _scored_loss(config: TaskConfig, model, split_seed: int, runtime) -> float:
    """Mean cross-entropy (nats) of the scored tokens of the split's ``eval_sequences`` sequences at the training
    length: what a rate is chosen by (exact match saturates at 0 or 1, and ties)."""
    task, length = config.task_spec, config.train_length
    generator = torch.Generator().manual_seed(split_seed + length)
    total, count = 0.0, 0
    for start in range(0, config.eval_sequences, EVAL_BATCH):
        inputs, targets = task.batch(length, min(EVAL_BATCH, config.eval_sequences - start), generator, full=True)
        logits = model(inputs.to(runtime.device)).float().cpu()
        scored = targets != IGNORE
        total += torch.nn.functional.cross_entropy(logits[scored], targets[scored], reduction="sum").item()
        count += int(scored.sum())
    return total / count


@torch.no_grad()
def _evaluate(config: TaskConfig, name, model, seed, out, runtime, log) -> None:
    path = out / "evals" / f"{name}-seed{seed}.json"
    if path.exists():
        return
    scores = {split: _exact_match(config, model, split_seed, runtime, f"eval {name} ({split})")
              for split, split_seed in SPLIT_SEEDS.items()}
    storage.write_json(path, {"row": name, "seed": seed, "exact_match": scores["test"],
                              "dev_exact_match": scores["dev"]})
    log(f"{name} (seed {seed}): " + ", ".join(
        f"{n}: {'N/A' if v is None else f'{sum(v) / len(v):.3f}'}" for n, v in scores["test"].items()))


def _exact_match(config: TaskConfig, model, split_seed: int, runtime, label: str) -> dict[str, list[float] | None]:
    """{length: exact-match items (``lm.tasks.exact_match``) on the split's ``eval_sequences`` sequences, or None
    where the model has no value at that length}."""
    task, scores = config.task_spec, {}
    for length in tqdm(config.eval_lengths, desc=label, leave=False, dynamic_ncols=True):
        generator = torch.Generator().manual_seed(split_seed + length)
        right = []
        try:
            for start in range(0, config.eval_sequences, EVAL_BATCH):
                size = min(EVAL_BATCH, config.eval_sequences - start)
                inputs, targets = task.batch(length, size, generator, full=True)
                logits = model(inputs.to(runtime.device)).float().cpu()
                right += exact_match(logits, targets, task).tolist()
        except ValueError:  # a learned table has no rows past its training length
            right = None
        scores[str(length)] = right
    return scores
