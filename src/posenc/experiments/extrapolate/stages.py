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

import dataclasses
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from .. import __version__, checks, storage
from ..data import Corpus, check_corpus_size, eval_span, stdlib_corpus, text_corpus
from ..evaluate import evaluate
from ..model import LanguageModel, ModelConfig
from ..train import TrainConfig, train
from . import report
from .presets import preset_values
from .rows import Row, parse_rows

PRESETS: dict[str, dict] = {
    # CI and tests: seconds on 2 cores.
    "smoke": dict(dim=32, num_layers=1, num_heads=2, train_length=16, batch_size=8, steps=20, lr=3e-3,
                  warmup=5, eval_windows=2, checkpoint_every=5),
    # make run: minutes on a 2-core laptop CPU.
    "default": dict(dim=128, num_layers=4, num_heads=4, train_length=64, batch_size=32, steps=600, lr=2e-3,
                    warmup=50, eval_windows=48),
    # A GPU: a bigger model, longer training and windows.
    "gpu": dict(dim=512, num_layers=8, num_heads=8, train_length=256, batch_size=64, steps=4000, lr=1e-3,
                warmup=200, eval_windows=64),
}


@dataclass(frozen=True)
class ExperimentConfig:
    preset: str = "default"
    encodings: str = "default"
    dim: int = 128
    num_layers: int = 4
    num_heads: int = 4
    train_length: int = 64
    batch_size: int = 32
    steps: int = 600
    lr: float = 2e-3
    warmup: int = 50
    eval_windows: int = 48
    eval_factors: tuple[int, ...] = (1, 2, 4, 8)
    eval_stride: int | None = None
    seeds: int = 1
    seed: int = 0
    device: str = "auto"
    text: str | None = None
    checkpoint_every: int = 100
    compile: bool = False  # torch.compile the training forward pass; speed only, not a training field

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> "ExperimentConfig":
        values = preset_values(PRESETS, preset, overrides)
        return cls(preset=preset, **values)

    @classmethod
    def from_dict(cls, values: dict) -> "ExperimentConfig":
        """The inverse of to_dict (e.g. a run directory's config.json)."""
        values = dict(values)
        if "eval_factors" in values:
            values["eval_factors"] = tuple(values["eval_factors"])
        return cls(**values)

    def __post_init__(self):
        for name in ("dim", "num_layers", "num_heads", "train_length", "batch_size", "steps", "eval_windows", "seeds"):
            checks.positive_int(name, getattr(self, name))
        checks.positive_int("warmup", self.warmup, minimum=0)
        checks.positive_float("lr", self.lr)
        if not self.eval_factors or any(not isinstance(f, int) or f < 1 for f in self.eval_factors):
            raise ValueError(f"eval_factors must be integers >= 1, got {self.eval_factors}")
        if self.eval_stride is not None:
            checks.positive_int("eval_stride", self.eval_stride)
        checks.choice("device", self.device, ("auto", "cpu", "cuda"))
        parse_rows(self.encodings)  # unknown names fail here, before anything runs

    @property
    def eval_lengths(self) -> list[int]:
        return [self.train_length * f for f in sorted(set(self.eval_factors))]

    @property
    def eval_span(self) -> int:
        return max(self.eval_lengths) * self.eval_windows

    def model_config(self, row: Row, kwargs: dict) -> ModelConfig:
        return ModelConfig(encoding=row.trains, encoding_kwargs=kwargs, dim=self.dim, num_layers=self.num_layers,
                           num_heads=self.num_heads, max_positions=self.train_length)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "eval_factors": list(self.eval_factors)}

    def training_dict(self) -> dict:
        """The fields a checkpoint depends on: a resumed run must keep them."""
        return {name: value for name, value in self.to_dict().items() if name in TRAINING_FIELDS}

    @property
    def eval_tag(self) -> str:
        """Names evaluation files by protocol, so a resumed run may change how it evaluates."""
        stride = "nonoverlap" if self.eval_stride is None else f"stride{self.eval_stride}"
        return f"{'-'.join(map(str, self.eval_lengths))}x{self.eval_windows}-{stride}"


# Changing any of these changes what a checkpoint is; everything else (rows, seeds,
# eval lengths, protocol, windows, device) may change between --resume calls.
TRAINING_FIELDS = ("dim", "num_layers", "num_heads", "train_length", "batch_size", "steps", "lr", "warmup",
                   "text", "checkpoint_every")


@dataclass
class Runtime:
    """Where this process runs: device, precision and its place in a DDP group."""

    device: torch.device
    autocast_dtype: torch.dtype | None
    rank: int = 0
    world_size: int = 1
    label: str = field(default="")

    @classmethod
    def detect(cls, requested: str) -> "Runtime":
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        cuda = torch.cuda.is_available() and requested in ("auto", "cuda")
        if requested == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available here; use --device cpu or auto")
        if cuda:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        if world_size > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        name = torch.cuda.get_device_name(device) if cuda else f"cpu ({os.cpu_count()} cores)"
        return cls(device, torch.bfloat16 if cuda else None, rank, world_size, name)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


def load_corpus(config: ExperimentConfig) -> Corpus:
    corpus = text_corpus(config.text) if config.text else stdlib_corpus()
    check_corpus_size(corpus, train_length=config.train_length, eval_span=config.eval_span)
    return corpus


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
    corpus = load_corpus(config)  # fails on a bad corpus before any training
    for row in rows:  # ... and on sizes an encoding rejects (e.g. an odd head width for RoPE)
        LanguageModel(config.model_config(row, row.train_kwargs))
    if runtime.rank == 0:
        prepare_run_dir(out, config, resume)
        log(f"corpus: {corpus.describe()}")
        log(f"device: {runtime.label}; processes: {runtime.world_size}; run directory: {out}")
    runtime.barrier()
    tokens = eval_span(corpus.validation, config.eval_span)
    started = time.perf_counter()
    trainings: dict[str, dict] = {}
    for seed in range(config.seed, config.seed + config.seeds):
        for trained in dict.fromkeys(row.trains for row in rows):
            trainings[f"{trained}-seed{seed}"] = _train_one(config, rows, trained, seed, corpus, out, runtime, log)
            if runtime.rank == 0:
                for row in (r for r in rows if r.trains == trained):
                    _evaluate_row(config, row, seed, tokens, out, runtime, log)
            runtime.barrier()
    if runtime.rank != 0:
        return {}
    results = _collect(config, rows, corpus, out, runtime, trainings, time.perf_counter() - started)
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
    metrics = train(model, corpus.train, train_config, checkpoint=folder / "last.pt", device=runtime.device,
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


def _evaluate_row(config, row, seed, tokens, out, runtime, log) -> None:
    path = out / "evals" / config.eval_tag / f"{row.name}-seed{seed}.json"
    if path.exists():
        return
    weights = storage.load_weights(out / "checkpoints" / f"{row.trains}-seed{seed}" / "model.safetensors")
    began = time.perf_counter()
    bits, errors, position = {}, {}, None
    for length in config.eval_lengths:
        kwargs = {**row.train_kwargs, **row.eval_kwargs(length / config.train_length, config.train_length)}
        model = LanguageModel(config.model_config(row, kwargs))
        model.load_state_dict(weights)
        model.to(runtime.device)
        result = evaluate(model, tokens, [length], stride=config.eval_stride, autocast_dtype=runtime.autocast_dtype,
                          label=f"eval {row.name} @ {length}")
        bits[str(length)] = result["bits_per_byte"][length]
        errors.update({str(k): v for k, v in result["errors"].items()})
        if length == max(config.eval_lengths):
            position = result["position_bits"]
    storage.write_json(path, {"row": row.name, "seed": seed, "bits_per_byte": bits, "errors": errors,
                              "position_bits": position, "wall_time_s": time.perf_counter() - began})
    shown = ", ".join(f"{k}: {'N/A' if v is None else f'{v:.3f}'}" for k, v in bits.items())
    log(f"  {row.name}: {shown}")


def _collect(config, rows, corpus, out, runtime, trainings, wall) -> dict:
    table = []
    for row in rows:
        evals = [storage.read_json(out / "evals" / config.eval_tag / f"{row.name}-seed{s}.json")
                 for s in range(config.seed, config.seed + config.seeds)]
        mean, std = {}, {}
        for length in map(str, config.eval_lengths):
            values = [e["bits_per_byte"][length] for e in evals]
            defined = None not in values
            mean[length] = statistics.fmean(values) if defined else None
            std[length] = (statistics.stdev(values) if len(values) > 1 else 0.0) if defined else None
        train_runs = [trainings[f"{row.trains}-seed{s}"] for s in range(config.seed, config.seed + config.seeds)]
        table.append({
            "name": row.name,
            "trained_encoding": row.trains,
            "bits_per_byte": mean,
            "bits_per_byte_std": std,
            "per_seed": [e["bits_per_byte"] for e in evals],
            "errors": evals[0]["errors"],
            "position_bits": evals[0]["position_bits"],
            "parameters": train_runs[0]["parameters"],
            "train_wall_time_s": statistics.fmean(t["wall_time_s"] for t in train_runs),
            "eval_wall_time_s": statistics.fmean(e["wall_time_s"] for e in evals),
        })
    protocol = ("non-overlapping windows" if config.eval_stride is None
                else f"sliding windows, stride {config.eval_stride}")
    return {
        "config": config.to_dict(),
        "train_length": config.train_length,
        "eval_lengths": config.eval_lengths,
        "protocol": protocol,
        "corpus": corpus.fingerprint,
        "versions": {"posenc": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "device": runtime.label,
        "processes": runtime.world_size,
        # Compute time of the whole run across --resume calls: every training and evaluation.
        "wall_time_s": sum(t["wall_time_s"] for t in trainings.values()) + sum(r["eval_wall_time_s"] for r in table),
        "this_invocation_s": wall,
        "rows": table,
    }
