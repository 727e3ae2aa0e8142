"""``posenc extend``: stretch a trained RoPE model to ``factor``× its training length.

Flow: base run (RoPE and ALiBi trained by ``posenc extrapolate`` into ``out/base``, or a
finished ``--run``) -> LongRoPE search on the RoPE checkpoint (search windows from the
validation split *after* the reported bytes) -> ``rope_parameters.json`` -> fine-tune
each method, and ALiBi with the same extra tokens, at the target length (curve points
on the way) -> evaluate every row on the same validation bytes at every eval length
-> results.json, results.md, extension.png, finetune_curve.png, longrope_factors.png.

Every method runs at one fixed config, ``factor`` = target / training length, at every
eval length: the config a user would deploy. (``extrapolate`` instead sets the factor to
each column's length.) The presets, config and rows are in config.py.

Run directory: ``config.json``, ``base/`` (when no --run), ``search_log.json``,
``rope_parameters.json``, ``finetune/<row>/``, ``scratch/``, ``evals/<protocol>/<row>.json``.
Each stage writes atomically and is skipped on ``--resume`` once finished.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import __version__, storage
from ...extension.finetune import curve_points, finetune
from ...extension.longrope import (default_max_factor, lm_objective, longrope_parameters, method_factors,
                                   plain_frequencies, seed_candidates)
from ...extension.methods import method_scaling
from ...extension.search import N_HAT_CHOICES, Candidate, SearchConfig, best_loss_per_generation, search
from ...lm.data import Corpus, eval_span, load_corpus
from ...lm.evaluate import evaluate
from ...lm.model import LanguageModel, ModelConfig
from ...lm.runtime import Runtime
from ...lm.train import TrainConfig, train
from .. import extrapolate
from ..extrapolate import ExperimentConfig
from . import report
from .config import RESULT_FIELDS, ExtendConfig, ExtendRow, make_rows


@dataclass
class Plan:
    """What one invocation works on: configs, the base run, the corpus and its slices."""

    config: ExtendConfig
    base: ExperimentConfig
    run_dir: Path
    out: Path
    corpus: Corpus
    target: int
    eval_lengths: list[int]
    rows: list[ExtendRow]
    has_alibi: bool

    @property
    def seed(self) -> int:
        return self.base.seed

    def checkpoint(self, encoding: str) -> Path:
        return self.run_dir / "checkpoints" / f"{encoding}-seed{self.seed}" / "model.safetensors"

    @property
    def eval_tag(self) -> str:
        stride = "nonoverlap" if self.config.eval_stride is None else f"stride{self.config.eval_stride}"
        return f"{'-'.join(map(str, self.eval_lengths))}x{self.base.eval_windows}-{stride}"

    def report_tokens(self) -> torch.Tensor:
        return eval_span(self.corpus.validation, max(self.eval_lengths) * self.base.eval_windows)

    def search_windows(self) -> torch.Tensor:
        """(W, target + 1) windows of the validation split after the reported bytes: never scored in the table."""
        start = max(self.eval_lengths) * self.base.eval_windows + 1
        windows = [self.corpus.validation[start + i * self.target : start + (i + 1) * self.target + 1]
                   for i in range(self.config.search_windows)]
        return torch.stack(windows).long()

    def model_config(self, encoding: str, scaling: dict | None = None, max_positions: int | None = None
                     ) -> ModelConfig:
        return ModelConfig(encoding=encoding, encoding_kwargs={"scaling": scaling} if scaling else {},
                           dim=self.base.dim, num_layers=self.base.num_layers, num_heads=self.base.num_heads,
                           max_positions=max_positions or self.base.train_length)


def plan(config: ExtendConfig, out: Path, *, run: Path | None = None, text: str | None = None,
         device: str | None = None) -> Plan:
    """Check everything that can be checked before any training; raises ValueError with the way out."""
    if run is not None:
        base, has_alibi = _read_run(Path(run), config, device)
        run_dir = Path(run)
    else:
        base = ExperimentConfig.from_preset(config.base, encodings="rope,alibi", text=text, device=device)
        run_dir, has_alibi = out / "base", True
    target = config.target_length(base.train_length)
    lengths = sorted(set(base.eval_lengths) | {target})
    span = max(lengths) * base.eval_windows
    uneven = [length for length in lengths if span % length]
    if uneven:
        raise ValueError(f"the eval span ({span} tokens) is not a whole number of windows of {uneven}; choose a "
                         "--factor whose target length divides it")
    corpus = load_corpus(base.text, train_length=base.train_length, eval_span=base.eval_span)
    need = span + 1 + config.search_windows * target + 1
    if "longrope" in config.methods and len(corpus.validation) < need:
        raise ValueError(f"corpus too small: the validation split has {len(corpus.validation):,} tokens; the report "
                         f"span ({span:,}) plus {config.search_windows} search windows of {target} need {need:,}; use "
                         "more text, fewer --search-windows or a smaller --factor")
    if len(corpus.train) < 4 * (target + 1):
        raise ValueError(f"corpus too small: the train split has {len(corpus.train):,} tokens, fine-tuning windows "
                         f"of {target} need at least {4 * (target + 1):,}; use more text or a smaller --factor")
    for encoding in ("rope", "alibi") if has_alibi else ("rope",):  # sizes the encodings reject fail here
        LanguageModel(ModelConfig(encoding=encoding, dim=base.dim, num_layers=base.num_layers,
                                  num_heads=base.num_heads, max_positions=base.train_length))
    return Plan(config, base, run_dir, out, corpus, target, lengths, make_rows(config, has_alibi), has_alibi)


def _read_run(run: Path, config: ExtendConfig, device: str | None) -> tuple[ExperimentConfig, bool]:
    pinned = run / "config.json"
    if not pinned.exists():
        raise ValueError(f"--run {run} is not a posenc extrapolate run (no config.json there)")
    base = ExperimentConfig.from_dict({**storage.read_json(pinned), **({"device": device} if device else {})})
    folder = run / "checkpoints"
    have = sorted(p.name for p in folder.iterdir() if (p / "model.safetensors").exists()) if folder.exists() else []
    if f"rope-seed{base.seed}" not in have:
        raise ValueError(f"--run {run} has no finished RoPE checkpoint (checkpoints/rope-seed{base.seed}/"
                         f"model.safetensors); it has: {', '.join(have) or 'no finished checkpoints'}. Train one with: "
                         f"posenc extrapolate --resume --out {run} --encodings rope")
    return base, f"alibi-seed{base.seed}" in have


def _pin_config(out: Path, config: ExtendConfig, base: ExperimentConfig, run: Path | None, resume: bool) -> None:
    pinned = out / "config.json"
    current = {"extend": config.to_dict(), "base": base.training_dict(), "run": str(run) if run else None}
    if pinned.exists():
        previous = storage.read_json(pinned)
        if not resume:
            raise ValueError(f"--out {out} already holds a run; pass --resume to continue it or choose another --out")
        changed = sorted(k for k in RESULT_FIELDS if previous["extend"].get(k) != current["extend"][k])
        changed += ["base model"] if previous["base"] != current["base"] else []
        changed += ["--run"] if previous["run"] != current["run"] else []
        if changed:
            raise ValueError(f"--resume: {out} was run with a different config (differs in {changed}); only "
                             "--methods, --from-scratch and --device may change")
    elif resume:
        raise ValueError(f"--resume: {out} holds no posenc extend run (no config.json there); start one with: "
                         f"posenc extend --out {out}")
    else:
        storage.write_json(pinned, current)


def run(config: ExtendConfig, out: Path, *, run_dir: Path | None = None, text: str | None = None,
        device: str | None = None, resume: bool = False, log=print) -> dict:
    """The whole experiment into ``out``; returns the results dict (also written to results.json)."""
    out = Path(out)
    p = plan(config, out, run=run_dir, text=text, device=device)
    runtime = Runtime.detect(p.base.device)
    if runtime.rank == 0:
        _pin_config(out, config, p.base, run_dir, resume)
    else:
        log = lambda *_: None  # noqa: E731 - one voice in a DDP group
    runtime.barrier()
    log(f"extend: {p.base.train_length} -> {p.target} tokens (factor {config.factor:g}); rows: "
        f"{', '.join(r.name for r in p.rows)}")
    stages: dict[str, float] = {}
    if run_dir is None:
        extrapolate.run(p.base, p.run_dir, resume=(p.run_dir / "config.json").exists(), log=log)
        if runtime.rank == 0:
            stages["base models (train + extrapolate eval)"] = storage.read_json(p.run_dir / "results.json")["wall_time_s"]
    scalings = {m: method_scaling(m, config.factor, p.base.train_length) for m in config.methods if m != "longrope"}
    longrope = None
    if "longrope" in config.methods:
        if runtime.rank == 0:
            _search(p, runtime, log)
        runtime.barrier()  # every process fine-tunes with the searched factors
        longrope = storage.read_json(out / "longrope.json")
        scalings["longrope"] = longrope["rope_parameters"]
        stages["longrope search"] = longrope["wall_time_s"]
    tokens = p.report_tokens()
    curves = {}
    for row in (r for r in p.rows if r.stage == "fine-tuned"):
        metrics = _finetune_row(p, row, scalings.get(row.method), tokens, runtime, log)
        curves[row.method] = metrics["curve"]
        stages[f"fine-tune {row.method}"] = metrics["wall_time_s"]
    if config.from_scratch:
        stages["rope trained at target"] = _train_from_scratch(p, runtime, log)["wall_time_s"]
    runtime.barrier()
    if runtime.rank != 0:
        return {}
    evals = {row.name: _evaluate_row(p, row, scalings.get(row.method), tokens, runtime, log) for row in p.rows}
    stages["evaluation (all rows)"] = sum(e["wall_time_s"] for e in evals.values())
    results = _collect(p, runtime, scalings, evals, curves, longrope, stages)
    report.write_all(results, out)
    log("")
    log(report.terminal_table(results))
    log(f"\nwrote {out / 'results.json'}, results.md, extension.png, finetune_curve.png"
        + (", longrope_factors.png, rope_parameters.json" if longrope else ""))
    return results


def _load(p: Plan, row: ExtendRow, scaling: dict | None, weights: Path) -> LanguageModel:
    max_positions = p.target if row.method == "scratch" else None
    model = LanguageModel(p.model_config(row.trains, scaling if row.trains == "rope" else None, max_positions))
    model.load_state_dict(storage.load_weights(weights))
    return model


def _search(p: Plan, runtime: Runtime, log) -> None:
    """LongRoPE's search on the RoPE checkpoint; writes search_log.json, rope_parameters.json, longrope.json."""
    summary_path = p.out / "longrope.json"
    if summary_path.exists() and (p.out / "rope_parameters.json").exists():
        return
    base, head_dim = p.base, p.base.dim // p.base.num_heads
    model = _load(p, ExtendRow("rope", "rope", "rope", "zero-shot"), None, p.checkpoint("rope")).to(runtime.device)
    objective = lm_objective(model, p.search_windows(), factor=p.config.factor, original=base.train_length)
    search_config = SearchConfig(
        population=p.config.search_population, generations=p.config.search_generations,
        parents=p.config.search_parents, max_factor=default_max_factor(p.config.factor),
        n_hat_choices=tuple(n for n in N_HAT_CHOICES if n < base.train_length), seed=p.seed)
    context = {"factor": p.config.factor, "target_length": p.target, "search_windows": p.config.search_windows,
               "corpus_sha256": p.corpus.fingerprint["sha256"], "base": base.training_dict()}
    log(f"LongRoPE search: population {search_config.population}, {search_config.generations} generations, "
        f"{p.config.search_windows} windows of {p.target} tokens")
    state = search(objective, seed_candidates(head_dim, p.config.factor, base.train_length), search_config,
                   p.out / "search_log.json", context=context, log=log)
    best = Candidate.from_dict(state["best"])
    without_n_hat = objective([Candidate(best.factors, 0)])[0] if best.n_hat else state["best"]["loss"]
    seeds = {m: entry["loss"] for m, entry in zip(("pi", "ntk", "yarn"), state["generations"][0]["candidates"])}
    parameters = longrope_parameters(best.factors, factor=p.config.factor, original=base.train_length)
    wall = sum(g["wall_time_s"] for g in state["generations"])
    evaluated = sum(g["new_evaluations"] for g in state["generations"])
    summary = {
        "best": state["best"], "loss_best_n_hat": state["best"]["loss"], "loss_n_hat_0": without_n_hat,
        "seed_losses": seeds, "best_loss_per_generation": best_loss_per_generation(state),
        "candidates_evaluated": evaluated, "candidates_per_s": evaluated / max(wall, 1e-9),
        "wall_time_s": wall, "search_log": "search_log.json", "rope_parameters": parameters,
        "method_factors": {m: list(method_factors(m, head_dim, p.config.factor, base.train_length))
                           for m in ("pi", "ntk", "yarn")},
        "inverse_frequencies": plain_frequencies(head_dim, 10000.0).tolist(),
    }
    storage.write_json(p.out / "rope_parameters.json", {"rope_parameters": parameters, "metadata": {
        "found_by": "posenc extend: LongRoPE evolutionary search (Ding et al. 2024)",
        "n_hat": best.n_hat,
        "n_hat_note": "n_hat (initial positions kept at the original frequencies) has no field in transformers' "
                      "longrope format; this export uses n_hat = 0",
        "search_loss_nats": {"best_n_hat": state["best"]["loss"], "n_hat_0": without_n_hat},
        "short_factor_note": "short_factor = 1: plain RoPE up to original_max_position_embeddings",
    }})
    storage.write_json(summary_path, summary)
    log(f"LongRoPE: best loss {state['best']['loss']:.4f} nats (n̂ = {best.n_hat}; n̂ = 0: {without_n_hat:.4f}); "
        f"seeds: " + ", ".join(f"{m} {v:.4f}" for m, v in seeds.items()))


def _finetune_config(p: Plan, seed_offset: int = 1) -> TrainConfig:
    return TrainConfig(steps=p.config.finetune_steps, batch_size=p.config.finetune_batch, length=p.target,
                       lr=p.config.finetune_lr, warmup=p.config.finetune_warmup,
                       checkpoint_every=max(1, p.config.finetune_steps // 4), seed=p.seed + seed_offset)


def _finetune_row(p: Plan, row: ExtendRow, scaling: dict | None, tokens, runtime: Runtime, log) -> dict:
    model = _load(p, row, scaling, p.checkpoint(row.trains))

    def measure(m) -> float:
        return evaluate(m, tokens, [p.target], stride=p.config.eval_stride, autocast_dtype=runtime.autocast_dtype,
                        label=f"curve {row.method}")["bits_per_byte"][p.target]

    metrics = finetune(model, p.corpus.train, _finetune_config(p), p.out / "finetune" / row.slug,
                       points=curve_points(p.config.finetune_steps), measure=measure, device=runtime.device,
                       autocast_dtype=runtime.autocast_dtype, rank=runtime.rank, world_size=runtime.world_size,
                       label=f"fine-tune {row.method} @ {p.target}")
    log(f"{row.name}: " + ", ".join(f"step {k}: {v:.3f}" for k, v in metrics["curve"].items()))
    return metrics


def _train_from_scratch(p: Plan, runtime: Runtime, log) -> dict:
    """RoPE trained at the target length on the base model's token budget (steps × batch × length)."""
    folder = p.out / "scratch"
    if (folder / "train.json").exists() and (folder / "model.safetensors").exists():
        return storage.read_json(folder / "train.json")
    torch.manual_seed(p.seed)
    model = LanguageModel(p.model_config("rope", None, p.target))
    batch = max(1, p.base.batch_size * p.base.train_length // p.target)
    config = TrainConfig(steps=p.base.steps, batch_size=batch, length=p.target, lr=p.base.lr, warmup=p.base.warmup,
                         checkpoint_every=p.base.checkpoint_every, seed=p.seed)
    metrics = train(model, p.corpus.train, config, checkpoint=folder / "last.pt", device=runtime.device,
                    autocast_dtype=runtime.autocast_dtype, rank=runtime.rank, world_size=runtime.world_size,
                    label=f"train rope @ {p.target} from scratch")
    if runtime.rank != 0:
        return metrics
    storage.save_weights(folder / "model.safetensors", model.state_dict())
    storage.write_json(folder / "train.json", metrics)
    (folder / "last.pt").unlink(missing_ok=True)
    log(f"rope trained at {p.target}: {metrics['wall_time_s']:.0f}s")
    return metrics


def _weights(p: Plan, row: ExtendRow) -> Path:
    if row.stage == "fine-tuned":
        return p.out / "finetune" / row.slug / "model.safetensors"
    if row.stage == "from scratch":
        return p.out / "scratch" / "model.safetensors"
    return p.checkpoint(row.trains)


def _evaluate_row(p: Plan, row: ExtendRow, scaling: dict | None, tokens, runtime: Runtime, log) -> dict:
    path = p.out / "evals" / p.eval_tag / f"{row.slug}.json"
    if path.exists():
        return storage.read_json(path)
    began = time.perf_counter()
    model = _load(p, row, scaling, _weights(p, row)).to(runtime.device)
    result = evaluate(model, tokens, p.eval_lengths, stride=p.config.eval_stride,
                      autocast_dtype=runtime.autocast_dtype, label=f"eval {row.name}")
    record = {"row": row.name, "bits_per_byte": {str(k): v for k, v in result["bits_per_byte"].items()},
              "errors": {str(k): v for k, v in result["errors"].items()}, "position_bits": result["position_bits"],
              "wall_time_s": time.perf_counter() - began}
    storage.write_json(path, record)
    log(f"  {row.name}: " + ", ".join(f"{k}: {v:.3f}" for k, v in record["bits_per_byte"].items() if v is not None))
    return record


def _collect(p: Plan, runtime: Runtime, scalings, evals, curves, longrope, stages) -> dict:
    tokens_per_finetune = p.config.finetune_steps * p.config.finetune_batch * p.target
    rows = [{
        "name": row.name, "method": row.method, "stage": row.stage, "trained_encoding": row.trains,
        "scaling": scalings.get(row.method) if row.trains == "rope" and row.method != "scratch" else None,
        "bits_per_byte": evals[row.name]["bits_per_byte"], "errors": evals[row.name]["errors"],
        "position_bits": evals[row.name]["position_bits"],
        "extra_tokens": tokens_per_finetune if row.stage == "fine-tuned" else 0,
    } for row in p.rows]
    protocol = ("non-overlapping windows" if p.config.eval_stride is None
                else f"sliding windows, stride {p.config.eval_stride}")
    return {
        "config": p.config.to_dict(), "base_config": p.base.to_dict(), "run": str(p.run_dir),
        "train_length": p.base.train_length, "target_length": p.target, "eval_lengths": p.eval_lengths,
        "protocol": protocol, "corpus": p.corpus.fingerprint,
        "pretraining_tokens": p.base.steps * p.base.batch_size * p.base.train_length,
        "finetune_tokens": tokens_per_finetune,
        "alibi": "trained" if p.has_alibi else "not in --run: ALiBi rows left out",
        "rows": rows, "curves": curves, "longrope": longrope,
        "stages_s": stages, "wall_time_s": sum(stages.values()),
        "versions": {"posenc": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "device": runtime.label,
    }
