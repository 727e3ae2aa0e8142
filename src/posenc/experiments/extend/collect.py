"""``posenc extend``'s results: every cell with its interval, each row's change from its own 1× score, the
paired comparisons its questions need, the fine-tuning curves at the chosen rates, and the rate sweep."""

from __future__ import annotations

from ...lm.data import Windows
from ...lm.evaluate import protocol
from ...lm.runtime import provenance
from .. import intervals
from ..rate_grid import rate_key
from . import tuning
from .config import ExtendRow
from .plan import Plan

CONTROL = "rope fine-tuned"


def comparisons(rows: list[ExtendRow]) -> list[tuple[str, str, str]]:
    """(a, b, question) pairs, each reported as a − b over the same windows and seeds."""
    names = {row.name for row in rows}
    pairs = []
    for row in rows:
        scaled_rope = row.trains == "rope" and row.method != "rope"
        if row.stage == "fine-tuned" and scaled_rope and CONTROL in names:
            pairs.append((row.name, CONTROL, "scaling + fine-tuning vs fine-tuning alone"))
        if row.stage == "fine-tuned" and row.trains == "rope" and "alibi fine-tuned" in names:
            pairs.append((row.name, "alibi fine-tuned", "vs ALiBi fine-tuned on the same tokens"))
        if row.stage == "zero-shot" and row.trains == "rope" and "alibi" in names:
            pairs.append((row.name, "alibi", "zero-shot vs ALiBi zero-shot"))
        zero_shot = row.name.removesuffix(" fine-tuned")
        if row.stage == "fine-tuned" and zero_shot in names:
            pairs.append((row.name, zero_shot, "what fine-tuning adds"))
        if row.stage == "from scratch" and CONTROL in names:
            pairs.append((row.name, CONTROL, "from scratch vs RoPE fine-tuned, same tokens"))
    return pairs


def collect(p: Plan, runtime, seeds: dict[int, dict], windows: Windows, longrope: dict | None, stages: dict) -> dict:
    groups, _ = intervals.units(windows.files)
    lengths = [str(n) for n in p.eval_lengths]
    per_seed = {row.name: {n: [seeds[s]["evals"][row.name]["window_bits"][n] for s in seeds] for n in lengths}
                for row in p.rows}
    tokens_per_finetune = p.config.finetune_steps * p.config.finetune_batch * p.target
    first = seeds[p.seeds[0]]
    rows = []
    for row in p.rows:
        own = per_seed[row.name]
        cells = {n: intervals.cell(own[n], groups) for n in lengths}
        rows.append({
            "name": row.name, "method": row.method, "stage": row.stage, "trained_encoding": row.trains,
            "scaling": first["scalings"].get(row.method),  # None for plain RoPE, ALiBi and RoPE from scratch
            "bits_per_byte": {n: cells[n] and cells[n]["mean"] for n in lengths},
            "interval": {n: cells[n] and [cells[n]["low"], cells[n]["high"]] for n in lengths},
            "bits_per_byte_std": {n: cells[n] and cells[n]["seed_std"] for n in lengths},
            "change_from_1x": {n: intervals.paired(own[n], own[lengths[0]], groups) for n in lengths},
            "window_bits": {n: intervals.seed_mean(own[n]) for n in lengths},
            "per_seed": [seeds[s]["evals"][row.name]["bits_per_byte"] for s in seeds],
            "errors": first["evals"][row.name]["errors"],
            "position_bits": first["evals"][row.name]["position_bits"],
            "extra_tokens": (tokens_per_finetune if row.stage == "fine-tuned"
                             else tuning.scratch_tokens(p) if row.stage == "from scratch" else 0),
            "learning_rates": [seeds[s]["selections"][row.name]["lr"] for s in seeds] if row.stage == "fine-tuned"
            else None,
        })
    return {
        "config": p.config.to_dict(), "base_config": p.base.to_dict(), "run": str(p.run_dir), "seeds": p.seeds,
        "train_length": p.base.train_length, "target_length": p.target, "eval_lengths": p.eval_lengths,
        "protocol": protocol(p.config.eval_stride), "corpus": p.corpus.fingerprint,
        "windows": intervals.describe_windows(windows, p.corpus.test),
        "pretraining_tokens": p.base.steps * p.base.batch_size * p.base.train_length,
        "finetune_tokens": tokens_per_finetune,
        "scratch_tokens": tuning.scratch_tokens(p) if p.config.from_scratch else None,
        "alibi": "trained" if p.has_alibi else "not in --run: ALiBi rows left out",
        "rows": rows,
        "comparisons": [{"a": a, "b": b, "question": question,
                         "difference": {n: intervals.paired(per_seed[a][n], per_seed[b][n], groups) for n in lengths}}
                        for a, b, question in comparisons(p.rows)],
        "curves": _curves(p, seeds), "sweep": _sweep(p, seeds), "longrope": longrope,
        "stages_s": stages, "wall_time_s": sum(stages.values()),
        "provenance": provenance(),
        "device": runtime.label,
    }


def _curves(p: Plan, seeds: dict[int, dict]) -> dict:
    """Per fine-tuned row, bits at the target on the curve's test windows at each step, at each seed's chosen
    rate: {row: {step: {"mean", "low", "high", "seed_std"}}}."""
    groups, _ = intervals.units(p.curve_windows().files)
    curves = {}
    for row in (r for r in p.rows if r.stage == "fine-tuned"):
        chosen = [seeds[s]["selections"][row.name] for s in seeds]
        runs = [selection["curves"][rate_key(selection["lr"])] for selection in chosen]
        steps = sorted(set.intersection(*(set(run) for run in runs)), key=int)
        curves[row.name] = {step: intervals.cell([run[step]["window_bits"] for run in runs], groups) for step in steps}
    return curves


def _sweep(p: Plan, seeds: dict[int, dict]) -> dict:
    """{row: {"dev_bits": {rate: mean over the seeds that scored it}, "chosen": [rate per seed], "at_edge": [per
    seed]}}: what chose each row's rate. A widened grid can score other rates in other seeds."""
    sweep = {}
    for row in (r for r in p.rows if r.stage == "fine-tuned"):
        chosen = [seeds[s]["selections"][row.name] for s in seeds]
        rates = sorted({lr for c in chosen for lr in c["dev_bits"]}, key=float)
        scored = {lr: [c["dev_bits"][lr] for c in chosen if lr in c["dev_bits"]] for lr in rates}
        sweep[row.name] = {"dev_bits": {lr: sum(values) / len(values) for lr, values in scored.items()},
                           "chosen": [c["lr"] for c in chosen], "at_edge": [c.get("at_edge", False) for c in chosen],
                           "dev_windows": chosen[0]["dev_windows"]}
    return sweep
