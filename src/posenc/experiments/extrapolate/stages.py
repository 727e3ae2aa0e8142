"""``posenc extrapolate``: train tiny LMs with each encoding at one length, test at 1×…8×.

Flow: corpus -> for each seed and trained encoding: train (resumable) -> final weights
-> evaluate every row that reads that checkpoint at each eval length -> results.json,
results.md, extrapolation.png, position_loss.png, and a table on the terminal.

Every run directory is self-describing and resumable: ``config.json`` pins the
training config, ``checkpoints/<encoding>-seed<k>/`` holds the in-progress checkpoint
and final weights, ``evals/<protocol>/<row>-seed<k>.json`` each finished evaluation.
``--resume`` skips what is finished and continues what is not; it may also add rows
or seeds, or evaluate the same checkpoints with another protocol.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from ... import storage
from ...lm.data import Windows, load_corpus, sample_windows
from ...lm.evaluate import evaluate
from ...lm.leakage import train_overlap
from ...lm.model import LanguageModel
from ...lm.runtime import Runtime, provenance
from ...lm.train import TrainConfig, train
from .. import intervals
from . import report
from .config import ExperimentConfig
from .rows import parse_rows

def prepare_run_dir(out: Path, config: ExperimentConfig, resume: bool) -> None:
    """Pin the training config in ``out``; refuse to resume with different training fields.

    ``config.json`` keeps the first invocation's full config (``posenc plot --ckpt``
    reads it); only TRAINING_FIELDS must match on --resume.
    """
    pinned = out / "config.json"
    if pinned.exists():
        previous = storage.read_json(pinned)
        if not resume:
            raise ValueError(f"--out {out} already holds a run; pass --resume to continue it or choose another --out")
        changed = sorted(k for k, v in config.training_dict().items() if previous.get(k) != v)
        if changed:
            raise ValueError(f"--resume: {out} was trained with a different config (differs in {changed}); "
                             "only rows, seeds and evaluation settings may change")
    elif resume:
        raise ValueError(f"--resume: {out} holds no posenc extrapolate run (no config.json there); "
                         f"start one with: posenc extrapolate --out {out}")
    else:
        storage.write_json(pinned, config.to_dict())


def run(config: ExperimentConfig, out: Path, *, resume: bool = False, log=print) -> dict:
    """Run the experiment into ``out``; returns the results dict (also written to results.json)."""
    rows = parse_rows(config.encodings)
    runtime = Runtime.detect(config.device)
    if runtime.rank != 0:
        log = lambda *_: None  # noqa: E731 - one voice in a DDP group
    # A bad corpus fails here, before any training ...
    corpus = load_corpus(config.text, train_length=config.train_length, window=config.window_length,
                         windows=config.eval_windows)
    for row in rows:  # ... and on sizes an encoding rejects (e.g. an odd head width for RoPE)
        LanguageModel(config.model_config(row, row.train_kwargs))
    if runtime.rank == 0:
        prepare_run_dir(out, config, resume)
        log(f"corpus: {corpus.describe()}")
        log(f"device: {runtime.label}; processes: {runtime.world_size}; run directory: {out}")
    runtime.barrier()
    windows = sample_windows(corpus.test, config.window_length, config.eval_windows)  # every row scores these
    started = time.perf_counter()
    trainings: dict[str, dict] = {}
    for seed in range(config.seed, config.seed + config.seeds):
        for trained in dict.fromkeys(row.trains for row in rows):
            trainings[f"{trained}-seed{seed}"] = _train_one(config, rows, trained, seed, corpus, out, runtime, log)
            if runtime.rank == 0:
                for row in (r for r in rows if r.trains == trained):
                    _evaluate_row(config, row, seed, windows, out, runtime, log)
            runtime.barrier()
    if runtime.rank != 0:
        return {}
    results = _collect(config, rows, corpus, windows, out, runtime, trainings, time.perf_counter() - started)
    report.write_all(results, out)
    log("")
    log(report.terminal_table(results))
    log(f"\nwrote {out / 'results.json'}, results.md, extrapolation.png, position_loss.png")
    return results


def _train_one(config, rows, trained, seed, corpus, out, runtime, log) -> dict:
    folder = out / "checkpoints" / f"{trained}-seed{seed}"
    done = folder / "train.json"
    if done.exists() and (folder / "model.safetensors").exists():  # deleted weights: rebuilt from last.pt
        log(f"{trained} (seed {seed}): already trained, skipping")
        return storage.read_json(done)
    row = next(r for r in rows if r.trains == trained)
    torch.manual_seed(seed)
    model = LanguageModel(config.model_config(row, row.train_kwargs))
    train_config = TrainConfig(steps=config.steps, batch_size=config.batch_size, length=config.train_length,
                               lr=config.lr, warmup=config.warmup, checkpoint_every=config.checkpoint_every, seed=seed)
    metrics = train(model, corpus.train.data, train_config, checkpoint=folder / "last.pt", device=runtime.device,
                    autocast_dtype=runtime.autocast_dtype, rank=runtime.rank, world_size=runtime.world_size,
                    label=f"train {trained} (seed {seed})", compile=config.compile)
    metrics["parameters"] = model.parameter_counts()
    if runtime.rank == 0:
        storage.save_weights(folder / "model.safetensors", model.state_dict())
        storage.write_json(done, metrics)  # written last: its presence means "finished"
        (folder / "last.pt").unlink(missing_ok=True)
        log(f"{trained} (seed {seed}): trained in {metrics['wall_time_s']:.0f}s, "
            f"train loss {metrics['final_bits_per_byte']:.3f} bits/byte, "
            f"{metrics['parameters']['model']:,} + {metrics['parameters']['encoding']:,} encoding parameters")
    return metrics


def _evaluate_row(config, row, seed, windows: Windows, out, runtime, log) -> None:
    path = out / "evals" / config.eval_tag / f"{row.name}-seed{seed}.json"
    if path.exists():
        return
    weights = storage.load_weights(out / "checkpoints" / f"{row.trains}-seed{seed}" / "model.safetensors")
    began = time.perf_counter()
    bits, window_bits, errors, position = {}, {}, {}, None
    for length in config.eval_lengths:
        kwargs = {**row.train_kwargs, **row.eval_kwargs(length / config.train_length, config.train_length)}
        model = LanguageModel(config.model_config(row, kwargs))
        model.load_state_dict(weights)
        model.to(runtime.device)
        result = evaluate(model, windows.tokens, [length], stride=config.eval_stride,
                          autocast_dtype=runtime.autocast_dtype, label=f"eval {row.name} @ {length}")
        bits[str(length)] = result["bits_per_byte"][length]
        window_bits[str(length)] = result["window_bits"][length]
        errors.update({str(k): v for k, v in result["errors"].items()})
        if length == max(config.eval_lengths):
            position = intervals.position_bands(result["position_bits"], windows.files)
    storage.write_json(path, {"row": row.name, "seed": seed, "bits_per_byte": bits, "window_bits": window_bits,
                              "errors": errors, "position_bits": position,
                              "wall_time_s": time.perf_counter() - began})
    shown = ", ".join(f"{k}: {'N/A' if v is None else f'{v:.3f}'}" for k, v in bits.items())
    log(f"  {row.name}: {shown}")


def _versus(best: str | None, own: list, per_seed: dict, length: str, groups: list[int]) -> dict | None:
    """This row minus the column's best row, paired over the same windows and seeds."""
    difference = intervals.paired(own, per_seed[best][length], groups) if best else None
    return difference and {"best": best, **difference}


def _collect(config, rows, corpus, windows: Windows, out, runtime, trainings, wall) -> dict:
    groups, _ = intervals.units(windows.files)
    lengths = [str(n) for n in config.eval_lengths]
    seeds = range(config.seed, config.seed + config.seeds)
    evals = {row.name: [storage.read_json(out / "evals" / config.eval_tag / f"{row.name}-seed{s}.json") for s in seeds]
             for row in rows}
    per_seed = {name: {n: [e["window_bits"][n] for e in runs] for n in lengths} for name, runs in evals.items()}
    cells = {name: {n: intervals.cell(values[n], groups) for n in lengths} for name, values in per_seed.items()}
    best = {n: min((name for name in cells if cells[name][n]), key=lambda name: cells[name][n]["mean"], default=None)
            for n in lengths}
    table = []
    for row in rows:
        runs, own, cell = evals[row.name], per_seed[row.name], cells[row.name]
        train_runs = [trainings[f"{row.trains}-seed{s}"] for s in seeds]
        table.append({
            "name": row.name,
            "description": row.description,
            "trained_encoding": row.trains,
            "bits_per_byte": {n: cell[n] and cell[n]["mean"] for n in lengths},
            "interval": {n: cell[n] and [cell[n]["low"], cell[n]["high"]] for n in lengths},
            "bits_per_byte_std": {n: cell[n] and cell[n]["seed_std"] for n in lengths},
            "change_from_1x": {n: intervals.paired(own[n], own[lengths[0]], groups) for n in lengths},
            "vs_best": {n: _versus(best[n], own[n], per_seed, n, groups) for n in lengths},
            "window_bits": {n: intervals.seed_mean(own[n]) for n in lengths},
            "per_seed": [e["bits_per_byte"] for e in runs],
            "errors": runs[0]["errors"],
            "position_bits": runs[0]["position_bits"],
            "parameters": train_runs[0]["parameters"],
            "train_wall_time_s": statistics.fmean(t["wall_time_s"] for t in train_runs),
            "eval_wall_time_s": statistics.fmean(e["wall_time_s"] for e in runs),
        })
    protocol = ("non-overlapping windows" if config.eval_stride is None
                else f"sliding windows, stride {config.eval_stride}")
    return {
        "config": config.to_dict(),
        "train_length": config.train_length,
        "eval_lengths": config.eval_lengths,
        "protocol": protocol,
        "corpus": corpus.fingerprint,
        "windows": intervals.describe_windows(windows, corpus.test),
        "train_overlap": train_overlap(corpus.train, windows),
        "provenance": provenance(),
        "device": runtime.label,
        "processes": runtime.world_size,
        # Compute time of the whole run across --resume calls: every training and evaluation.
        "wall_time_s": sum(t["wall_time_s"] for t in trainings.values()) + sum(r["eval_wall_time_s"] for r in table),
        "this_invocation_s": wall,
        "rows": table,
    }
