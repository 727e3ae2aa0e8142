"""``posenc extrapolate``: train tiny LMs with each encoding at one length, test at 1×…8×.

Flow: corpus -> for each seed and trained encoding: train (resumable) -> final weights
-> evaluate every row that reads that checkpoint at each eval length -> results.json,
results.md, extrapolation.png, position_loss.png, and a table on the terminal.

Every run directory is self-describing and resumable: ``config.json`` pins the
training config, ``checkpoints/<encoding>-seed<k>/`` holds the in-progress checkpoint
and final weights, ``evals/<protocol>/<row>-seed<k>.json`` each finished evaluation.
``--resume`` skips what is finished and continues what is not; it may also add rows
or seeds, or evaluate the same checkpoints with another protocol.

With a rate grid (``--lrs``), each trained encoding and seed trains at every rate of it (``rates/lr<rate>/``
under its checkpoint folder), widened past the grid's edge while the best rate sits there (``rate_grid``), and
keeps the rate with the lowest bits per byte on dev windows at the training length (``selection.json``): a choice
on dev, in distribution. The kept rate's weights are the checkpoint's, so every reader of a run finds them where
it always has. With ``--lr-sweep-seeds K`` only the first K seeds sweep; each later seed trains once, at the rate
with the lowest mean dev bits per byte over those K (``rate_grid.inherit_rate``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ... import storage
from ...lm.data import Windows, load_corpus, sample_windows
from ...lm.evaluate import evaluate
from ...lm.model import LanguageModel
from ...lm.runtime import Runtime, provenance
from ...lm.train import TrainConfig, train
from .. import intervals, pinning
from ..rate_grid import check_trained, choose_rate, inherit_rate, rate_key
from . import report
from .collect import collect
from .config import TRAINING_FIELDS, ExperimentConfig
from .rows import parse_rows

def prepare_run_dir(out: Path, config: ExperimentConfig, resume: bool) -> None:
    """Pin the training config in ``out``; refuse to resume with different training fields.

    ``config.json`` keeps the first invocation's full config (``posenc plot --ckpt``
    reads it); only TRAINING_FIELDS must match on --resume.
    """
    held = pinning.open_pin(out, resume, kind="extrapolate", start=f"posenc extrapolate --out {out}")
    if held is None:
        pinning.write_pin(out, config.to_dict())
        return
    changed = pinning.changed_fields(config.to_dict(), held, "extrapolate", sorted(TRAINING_FIELDS))
    pinning.refuse_changes(out, changed, did="trained", may_change="rows, seeds and evaluation settings")


def pin_corpus_and_commit(out: Path, corpus: dict, commit: str | None) -> list:
    """Record in ``out/run.json`` the corpus the run reads and every commit that has worked on it; a resumed run
    must read the same corpus (source and sha256: its evaluations could not be merged with another's), a run made
    before this file existed takes this one's. Returns the commits, in order (this one last)."""
    path, held = out / "run.json", {}
    if path.exists():
        held = storage.read_json(path)
        was = {key: held["corpus"].get(key) for key in ("source", "sha256")}
        if was != {key: corpus.get(key) for key in ("source", "sha256")}:
            raise ValueError(f"--resume: {out} was trained and scored on another corpus ({was['source']}, sha256 "
                             f"{str(was['sha256'])[:12]}), not {corpus['source']} ({corpus['sha256'][:12]}); its "
                             "evaluations cannot be merged with this one's")
    commits = [c for c in held.get("commits", []) if c != commit] + [commit]
    storage.write_json(path, {"corpus": corpus, "commits": commits})
    return commits


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
    commits = []
    if runtime.rank == 0:
        prepare_run_dir(out, config, resume)
        commits = pin_corpus_and_commit(out, corpus.fingerprint, provenance()["commit"])
        log(f"corpus: {corpus.describe()}")
        log(f"device: {runtime.label}; processes: {runtime.world_size}; run directory: {out}")
    runtime.barrier()
    windows = sample_windows(corpus.test, config.window_length, config.eval_windows)  # every row scores these
    dev = sample_windows(corpus.dev, config.train_length, config.dev_windows) if config.lrs else None
    started = time.perf_counter()
    trainings: dict[str, dict] = {}
    for seed in range(config.seed, config.seed + config.seeds):
        for trained in dict.fromkeys(row.trains for row in rows):
            row = next(r for r in rows if r.trains == trained)
            trainings[f"{trained}-seed{seed}"] = _train_row(config, row, seed, corpus, dev, out, runtime, log)
            if runtime.rank == 0:
                for reader in (r for r in rows if r.trains == trained):
                    _evaluate_row(config, reader, seed, windows, out, runtime, log)
            runtime.barrier()
    if runtime.rank != 0:
        return {}
    results = collect(config, rows, corpus, windows, out, runtime, trainings, time.perf_counter() - started)
    results["commits"] = commits
    report.write_all(results, out)
    log("")
    log(report.terminal_table(results))
    log(f"\nwrote {out / 'results.json'}, results.md, extrapolation.png, position_loss.png")
    return results


def _train_row(config, row, seed, corpus, dev: Windows | None, out, runtime, log) -> dict:
    """Train ``row``'s encoding at this seed (at ``config.lr``, or at the rate its grid chooses on ``dev``, or a seed
    past ``config.sweep_seeds`` at the rate it inherits) into ``checkpoints/<encoding>-seed<k>/``; its training
    metrics (with a grid, also "lr" and "sweep": the selection or the inheritance)."""
    folder = out / "checkpoints" / f"{row.trains}-seed{seed}"
    if not config.lrs:
        return check_trained(f"{row.trains} (seed {seed})", _train_one(config, row, seed, corpus, config.lr, folder,
                                                                        runtime, log), config.lr)
    if (folder / "train.json").exists() and (folder / "model.safetensors").exists():
        log(f"{row.trains} (seed {seed}): already trained, skipping")
        return storage.read_json(folder / "train.json")
    selection_path = folder / "selection.json"
    if seed not in config.sweep_seeds and not selection_path.exists():
        sweeps = [storage.read_json(folder.parent / f"{row.trains}-seed{s}" / "selection.json")
                  for s in config.sweep_seeds]
        inherited = inherit_rate(config.lrs, sweeps, config.sweep_seeds)
        check_trained(f"{row.trains} (seed {seed})", _train_one(
            config, row, seed, corpus, inherited["lr"], folder / "rates" / f"lr{rate_key(inherited['lr'])}", runtime,
            log), inherited["lr"])
        if runtime.rank == 0:
            storage.write_json(selection_path, inherited)
        runtime.barrier()
    if not selection_path.exists():
        seconds = []

        def dev_bits(lr: float) -> float:
            """Train at ``lr`` (every rank), score on dev (rank 0), every rank reading rank 0's value."""
            rate_folder = folder / "rates" / f"lr{rate_key(lr)}"
            seconds.append(_train_one(config, row, seed, corpus, lr, rate_folder, runtime, log)["wall_time_s"])
            value = _dev_bits(config, row, rate_folder, dev, runtime) if runtime.rank == 0 else 0.0
            return runtime.broadcast_float(value)

        chosen = choose_rate(config.lrs, dev_bits, config.lr_widenings, "--lrs")
        if runtime.rank == 0:
            storage.write_json(selection_path, {**chosen, "dev_windows": len(dev.files), "split": "dev",
                                                "sweep_seconds": sum(seconds)})
            log(f"{row.trains} (seed {seed}): dev bits per byte at {config.train_length} by rate "
                + ", ".join(f"{lr}: {v:.4f}" for lr, v in chosen["scores"].items()) + f"; chosen {chosen['lr']:g}"
                + (" (still at the grid's edge)" if chosen["at_edge"] else ""))
        runtime.barrier()
    selection = storage.read_json(selection_path)
    kept = folder / "rates" / f"lr{rate_key(selection['lr'])}"
    metrics = {**storage.read_json(kept / "train.json"), "lr": selection["lr"], "sweep": selection}
    if runtime.rank == 0:
        storage.save_weights(folder / "model.safetensors", storage.load_weights(kept / "model.safetensors"))
        storage.write_json(folder / "train.json", metrics)  # written last: its presence means "finished"
    runtime.barrier()
    return metrics


def _dev_bits(config, row, folder: Path, dev: Windows, runtime) -> float:
    """Bits per byte of the weights in ``folder`` on the dev windows at the training length."""
    model = LanguageModel(config.model_config(row, row.train_kwargs))
    model.load_state_dict(storage.load_weights(folder / "model.safetensors"))
    result = evaluate(model.to(runtime.device), dev.tokens, [config.train_length],
                      autocast_dtype=runtime.autocast_dtype, label=f"dev {row.trains} @ {config.train_length}")
    return result["bits_per_byte"][config.train_length]


def _train_one(config, row, seed, corpus, lr: float, folder: Path, runtime, log) -> dict:
    """Train ``row``'s encoding at ``lr`` into ``folder`` (resumable; skipped when finished); its metrics."""
    done = folder / "train.json"
    what = f"{row.trains} (seed {seed}" + (f", lr {lr:g})" if config.lrs else ")")
    if done.exists() and (folder / "model.safetensors").exists():  # deleted weights: rebuilt from last.pt
        log(f"{what}: already trained, skipping")
        return storage.read_json(done)
    torch.manual_seed(seed)
    model = LanguageModel(config.model_config(row, row.train_kwargs))
    train_config = TrainConfig(steps=config.steps, batch_size=config.batch_size, length=config.train_length,
                               lr=lr, warmup=config.warmup, checkpoint_every=config.checkpoint_every, seed=seed)
    metrics = train(model, corpus.train.data, train_config, checkpoint=folder / "last.pt", device=runtime.device,
                    autocast_dtype=runtime.autocast_dtype, rank=runtime.rank, world_size=runtime.world_size,
                    label=f"train {what}", compile=config.compile)
    metrics["parameters"] = model.parameter_counts()
    if runtime.rank == 0:
        storage.save_weights(folder / "model.safetensors", model.state_dict())
        storage.write_json(done, metrics)  # written last: its presence means "finished"
        (folder / "last.pt").unlink(missing_ok=True)
        log(f"{what}: trained in {metrics['wall_time_s']:.0f}s, "
            f"train loss {metrics['final_bits_per_byte']:.3f} bits/byte, "
            f"{metrics['parameters']['model']:,} + {metrics['parameters']['encoding']:,} encoding parameters")
    runtime.barrier()  # every rank finds the weights written before it reads them
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
