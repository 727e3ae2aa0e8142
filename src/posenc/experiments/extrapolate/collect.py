"""``posenc extrapolate``'s results from its finished evaluations: each cell with its interval over seeds and files,
each row's change from its own 1× score, each row against the best row of its column, and what the run cost."""

from __future__ import annotations

import statistics
from pathlib import Path

from ... import storage
from ...lm.data import Windows
from ...lm.evaluate import protocol
from ...lm.leakage import train_overlap
from ...lm.runtime import provenance
from .. import intervals
from ..pinning import read_pin
from ..verdicts import seed_comparisons


def versus(best: str | None, own: list, per_seed: dict, length: str, groups: list[int]) -> dict | None:
    """This row minus the column's best row, paired over the same windows and seeds."""
    difference = intervals.paired(own, per_seed[best][length], groups) if best else None
    return difference and {"best": best, **difference}


def collect(config, rows, corpus, windows: Windows, out: Path, runtime, trainings: dict, wall: float) -> dict:
    """results.json's dict: ``rows``' evaluations of ``windows`` (read from ``out/evals``) with the ``trainings``
    of each "<trained>-seed<k>", over the config's seeds; ``wall`` the seconds of this invocation."""
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
            "vs_best": {n: versus(best[n], own[n], per_seed, n, groups) for n in lengths},
            "window_bits": {n: intervals.seed_mean(own[n]) for n in lengths},
            "per_seed": [e["bits_per_byte"] for e in runs],
            "errors": runs[0]["errors"],
            "position_bits": runs[0]["position_bits"],
            "parameters": train_runs[0]["parameters"],
            "learning_rates": [t.get("lr", config.lr) for t in train_runs],
            "rate_sweeps": [t["sweep"] for t in train_runs] if config.lrs else None,
            "train_wall_time_s": statistics.fmean(t["wall_time_s"] for t in train_runs),
            "eval_wall_time_s": statistics.fmean(e["wall_time_s"] for e in runs),
        })
    results = {
        "config": config.to_dict(),
        "train_length": config.train_length,
        "eval_lengths": config.eval_lengths,
        "protocol": protocol(config.eval_stride),
        "corpus": corpus.fingerprint,
        "windows": intervals.describe_windows(windows, corpus.test),
        "train_overlap": train_overlap(corpus.train, windows),
        "provenance": provenance(),
        "device": runtime.label,
        "processes": runtime.world_size,
        # Compute time of the whole run across --resume calls: every training and evaluation.
        "wall_time_s": sum(compute_seconds(t) for t in trainings.values()) + sum(r["eval_wall_time_s"] for r in table),
        "this_invocation_s": wall,
        "rows": table,
    }
    if config.compare:
        results["family"] = {**declared(config, out), "comparisons": config.family}
        results["comparisons"] = seed_comparisons(results)
    return results


def declared(config, out: Path) -> dict:
    """{"declared", "exploratory"}: whether --compare is the one the run's first invocation pinned in config.json
    (written before anything trained), or was changed on --resume, after results may have been seen."""
    if read_pin(out, "extrapolate")["compare"] == config.compare:
        return {"declared": "before the run: --compare, pinned in config.json by its first invocation",
                "exploratory": False}
    return {"declared": "after results could be seen: --compare changed on --resume", "exploratory": True}


def compute_seconds(training: dict) -> float:
    """A training's seconds, with a rate grid every rate's (the kept one among them; a seed that inherited its rate
    trained once)."""
    return training.get("sweep", {}).get("sweep_seconds", training["wall_time_s"])
