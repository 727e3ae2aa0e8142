"""``posenc task``'s results from its finished evaluations: each row's exact match per length as a cell
over the test sequences (the unit every interval resamples) and the seeds, its dev means, and how it trained."""

from __future__ import annotations

from pathlib import Path

from ... import storage
from ...lm.runtime import provenance
from .. import intervals
from .config import SPLIT_SEEDS, TaskConfig


def sequences(config: TaskConfig, length: str, items: int) -> list[int]:
    """(items,): the sequence each exact-match item of ``length`` came from, the unit a bootstrap resamples."""
    per_sequence = config.task_spec.scored_per_sequence(int(length))
    if items != per_sequence * config.eval_sequences:
        raise ValueError(f"{items} exact-match items at length {length}: expected {per_sequence} for each of "
                         f"{config.eval_sequences} sequences")
    return [item // per_sequence for item in range(items)]


def cells(config: TaskConfig, per_seed_scores: list[dict]) -> dict:
    """{length: a cell over the seeds' exact-match items (``intervals.cell``), or None where there are none}."""
    by_length = {}
    for length in map(str, config.eval_lengths):
        per_seed = [scores[length] for scores in per_seed_scores]
        by_length[length] = None if per_seed[0] is None else intervals.cell(per_seed, sequences(config, length,
                                                                                                 len(per_seed[0])))
    return by_length


def means(config: TaskConfig, per_seed_scores: list[dict]) -> dict:
    """{length: the mean exact match over the seeds' items, or None where there are none}."""
    return {n: None if per_seed_scores[0][n] is None else
            sum(sum(scores[n]) / len(scores[n]) for scores in per_seed_scores) / len(per_seed_scores)
            for n in map(str, config.eval_lengths)}


def collect(config: TaskConfig, out: Path, trainings: dict, wall: float) -> dict:
    """results.json's dict (``report.write_all`` writes it) from the evaluations in ``out/evals`` and the
    ``trainings`` of each "<row>-seed<k>"; ``wall`` the seconds of this invocation."""
    seeds = range(config.seed, config.seed + config.seeds)
    rows = []
    for name, encoding, randomized in config.rows:
        evals = [storage.read_json(out / "evals" / f"{name}-seed{seed}.json") for seed in seeds]
        dev = [e.get("dev_exact_match") for e in evals]  # None in evaluations made before dev sequences existed
        rows.append({"name": name, "encoding": encoding, "randomized_positions": randomized,
                     "exact_match": cells(config, [e["exact_match"] for e in evals]),
                     "dev_exact_match": None if None in dev else means(config, dev),
                     "train_seconds": [trainings[f"{name}-seed{s}"]["wall_time_s"] for s in seeds],
                     "learning_rates": [trainings[f"{name}-seed{s}"].get("lr", config.lr) for s in seeds],
                     "rate_sweeps": [trainings[f"{name}-seed{s}"]["sweep"] for s in seeds] if config.lrs else None})
    results = {"task": config.task, "task_spec": str(config.task_spec), "train_length": config.train_length,
               "eval_lengths": config.eval_lengths, "seeds": config.seeds, "config": config.to_dict(),
               "rows": rows,
               "splits": {split: {"sequences": config.eval_sequences, "generator_seed": f"{seed} + length"}
                          for split, seed in SPLIT_SEEDS.items()},
               "interval": f"95% bootstrap over the {config.eval_sequences} test sequences per length "
               f"(and seeds, drawn independently, where several ran), {intervals.RESAMPLES} resamples",
               "wall_time_s": wall, "provenance": provenance()}
    return results
