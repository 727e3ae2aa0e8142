"""``posenc extend``: stretch a trained RoPE model to ``factor``× its training length.

Flow, per seed: base run (RoPE and ALiBi trained by ``posenc extrapolate`` into ``out/base``, or a
finished ``--run``) -> LongRoPE search on the RoPE checkpoint, scored on dev windows -> fine-tune
plain RoPE (the control), each method, and ALiBi with the same extra tokens at the target length, at
every rate of the sweep, keeping the rate best on dev (curves on test windows on the way) -> evaluate
every row on the same test windows at every eval length. Then per-cell intervals and paired
differences -> results.json, results.md, extension.png, finetune_curve.png, longrope_factors.png,
rope_parameters.json.

Every method runs at one fixed config, ``factor`` = target / training length, at every eval length:
the config a user would deploy. (``extrapolate`` instead sets the factor to each column's length.)

Run directory: ``config.json``, ``base/`` (when no --run), ``search_log-seed<k>.json``,
``longrope-seed<k>.json``, ``rope_parameters.json``, ``finetune/<row>/seed<k>/``, ``scratch/seed<k>/``,
``evals/<protocol>/<row>-seed<k>.json``. Each stage writes atomically and is skipped on ``--resume``
once finished.
"""

from __future__ import annotations

import time
from pathlib import Path

from ... import storage
from ...extension.methods import method_scaling
from ...lm.data import Windows
from ...lm.evaluate import evaluate
from ...lm.runtime import Runtime
from .. import extrapolate, intervals
from . import report, searching, tuning
from .collect import collect
from .config import ExtendConfig, ExtendRow
from .plan import Plan, pin_config, plan


def run(config: ExtendConfig, out: Path, *, run_dir: Path | None = None, text: str | None = None,
        device: str | None = None, resume: bool = False, only_seeds: tuple[int, ...] | None = None, log=print) -> dict:
    """The whole experiment into ``out``; returns the results dict (also written to results.json).

    ``only_seeds``: run only these seeds' stages and return {} before collecting, so processes can share one
    ``out`` seed by seed (each with ``resume`` but the first); a last call without it collects."""
    out = Path(out)
    p = plan(config, out, run=run_dir, text=text, device=device)
    todo = p.seeds if only_seeds is None else _check_only_seeds(only_seeds, p, run_dir)
    runtime = Runtime.detect(p.base.device)
    if runtime.rank == 0:
        pin_config(out, config, p.base, run_dir, resume)
    else:
        log = lambda *_: None  # noqa: E731 - one voice in a DDP group
    runtime.barrier()
    log(f"extend: {p.base.train_length} -> {p.target} tokens (factor {config.factor:g}); seeds {p.seeds}; rows: "
        f"{', '.join(r.name for r in p.rows)}")
    stages: dict[str, float] = {}
    if run_dir is None:
        extrapolate.run(p.base, p.run_dir, resume=(p.run_dir / "config.json").exists(), log=log)
        if runtime.rank == 0:
            stages["base models (train + extrapolate eval)"] = storage.read_json(p.run_dir / "results.json")["wall_time_s"]
    windows = p.report_windows() if runtime.rank == 0 else None
    seeds = {seed: _one_seed(p, seed, windows, runtime, stages, log) for seed in todo}
    if only_seeds is not None:
        log(f"seeds {list(todo)} done; write the tables once every seed is: the same command with --resume and "
            "without --only-seeds")
        return {}
    if runtime.rank != 0:
        return {}
    longrope = None
    if "longrope" in config.methods:
        longrope = searching.export(p, {seed: s["longrope"] for seed, s in seeds.items()})
    results = collect(p, runtime, seeds, windows, longrope, stages)
    report.write_all(results, out)
    log("")
    log(report.terminal_table(results))
    log(f"\nwrote {out / 'results.json'}, results.md, extension.png, finetune_curve.png"
        + (", longrope_factors.png, rope_parameters.json" if longrope else ""))
    return results


def _check_only_seeds(only_seeds: tuple[int, ...], p: Plan, run_dir: Path | None) -> list[int]:
    if run_dir is None:
        raise ValueError("--only-seeds needs --run (a finished posenc extrapolate run): without one, every process "
                         "would train the base models")
    outside = sorted(set(only_seeds) - set(p.seeds))
    if outside or not only_seeds:
        raise ValueError(f"--only-seeds {outside} are not among this run's seeds {p.seeds} (--seeds "
                         f"{p.config.seeds}, counted from the base run's seed {p.base.seed})")
    return sorted(set(only_seeds))


def _one_seed(p: Plan, seed: int, windows: Windows | None, runtime: Runtime, stages: dict, log) -> dict:
    """Search, fine-tune (with its rate sweep) and evaluate every row for one seed; on rank 0 returns
    {"scalings", "longrope", "selections", "scratch", "evals"}."""
    config = p.config
    scalings = {m: method_scaling(m, config.factor, p.base.train_length) for m in config.methods if m != "longrope"}
    longrope = None
    if "longrope" in config.methods:
        if runtime.rank == 0:
            searching.search_seed(p, seed, runtime, log)
        runtime.barrier()  # every process fine-tunes with the searched factors
        longrope = storage.read_json(searching.summary_path(p, seed))
        scalings["longrope"] = longrope["rope_parameters"]
        _add(stages, "longrope search", longrope["wall_time_s"])
    selections = {}
    for row in (r for r in p.rows if r.stage == "fine-tuned"):
        selection = tuning.sweep_row(p, row, seed, scalings.get(row.method), runtime, log)
        if selection is not None:
            selections[row.name] = selection
            _add(stages, f"fine-tune {row.name} (every rate)", selection["wall_time_s"])
    scratch = None
    if config.from_scratch:
        scratch = tuning.train_from_scratch(p, seed, runtime, log)
        _add(stages, "rope trained at target", scratch["wall_time_s"])
    runtime.barrier()
    if runtime.rank != 0:
        return {}
    evals = {row.name: _evaluate_row(p, row, seed, scalings.get(row.method), selections, windows, runtime, log)
             for row in p.rows}
    _add(stages, "evaluation (all rows)", sum(e["wall_time_s"] for e in evals.values()))
    return {"scalings": scalings, "longrope": longrope, "selections": selections, "scratch": scratch, "evals": evals}


def _add(stages: dict, name: str, seconds: float) -> None:
    stages[name] = stages.get(name, 0.0) + seconds


def _evaluate_row(p: Plan, row: ExtendRow, seed: int, scaling: dict | None, selections: dict, windows: Windows,
                  runtime: Runtime, log) -> dict:
    path = p.out / "evals" / p.eval_tag / f"{row.slug}-seed{seed}.json"
    if path.exists():
        return storage.read_json(path)
    began = time.perf_counter()
    model = tuning.load(p, row, scaling, tuning.weights(p, row, seed, selections)).to(runtime.device)
    result = evaluate(model, windows.tokens, p.eval_lengths, stride=p.config.eval_stride,
                      autocast_dtype=runtime.autocast_dtype, label=f"eval {row.name} (seed {seed})")
    record = {"row": row.name, "seed": seed,
              "bits_per_byte": {str(k): v for k, v in result["bits_per_byte"].items()},
              "window_bits": {str(k): v for k, v in result["window_bits"].items()},
              "errors": {str(k): v for k, v in result["errors"].items()},
              "position_bits": intervals.position_bands(result["position_bits"], windows.files),
              "wall_time_s": time.perf_counter() - began}
    storage.write_json(path, record)
    log(f"  {row.name}: " + ", ".join(f"{k}: {v:.3f}" for k, v in record["bits_per_byte"].items() if v is not None))
    return record
