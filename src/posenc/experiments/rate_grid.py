"""A learning rate chosen on dev from a grid that widens until the choice lies inside it.

The best rate of a grid at its smallest or largest value says only that the best rate may lie beyond it: a
comparison between rows that chose the grid's edge depends on where the grid ends. ``choose_rate`` scores every
rate of the grid and, while the best is at an edge, scores one more rate a grid step beyond that edge (the ratio
of the two rates at that end), at most ``widenings`` times. The selection names every rate scored and whether the
choice still sits at an edge, so a table can say so.

A run of several seeds may sweep the grid in its first seeds only; ``inherit_rate`` gives the later seeds the rate
those sweeps agree on best, so they cost one training each.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from .. import checks


def rate_key(rate: float) -> str:
    """How a rate is written in folders and results files (``f"{rate:g}"``)."""
    return f"{rate:g}"


def rate_label(rate: float, at_edge: bool) -> str:
    """A chosen rate as a table shows it, marked "(edge)" where it is still the grid's smallest or largest."""
    return rate_key(rate) + (" (edge)" if at_edge else "")


def rates_label(selections: Sequence[dict]) -> str:
    """The rates a row's seeds kept, as its table cell: one ``rate_label`` when every seed kept the same, else each
    seed's in seed order."""
    labels = [rate_label(selection["lr"], selection["at_edge"]) for selection in selections]
    return labels[0] if len(set(labels)) == 1 else ", ".join(labels)


def check_grid(name: str, rates: Sequence[float]) -> tuple[float, ...]:
    """The grid sorted ascending; a ValueError naming ``name`` for an empty grid, a rate <= 0 or a repeated rate
    (two rates that print alike would share a folder)."""
    if not rates:
        raise ValueError(f"{name} needs at least one learning rate")
    grid = tuple(sorted(checks.positive_float(name, rate) for rate in rates))
    keys = [rate_key(rate) for rate in grid]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{name} must not repeat a rate, got {', '.join(keys)}")
    return grid


def _rank(value: float) -> float:
    """A score as the choice orders it: a diverged rate's (NaN or infinite) last, never the best."""
    return value if math.isfinite(value) else math.inf


def check_trained(what: str, metrics: dict, lr: float) -> dict:
    """The metrics of ``what`` trained at the one rate ``lr``, refused when its training loss ended non-finite
    (no grid to fall back on: its evaluations would be NaN, reported as a result)."""
    if not math.isfinite(metrics["final_loss"]):
        raise ValueError(f"{what} diverged at learning rate {lr:g} (final training loss {metrics['final_loss']}): "
                         f"start a new run with a smaller --lr, or a grid of rates (--lrs) to choose from")
    return metrics


def _beyond(scored: list[float], best: float) -> float | None:
    """The next rate past the edge ``best`` sits at, a grid step beyond it; None when ``best`` is inside."""
    if best == scored[0]:
        return scored[0] * scored[0] / scored[1]
    if best == scored[-1]:
        return scored[-1] * scored[-1] / scored[-2]
    return None


def choose_rate(rates: Sequence[float], score: Callable[[float], float], widenings: int = 2,
                name: str = "learning rates") -> dict:
    """Score each rate (lower is better) and widen the grid past the edge the best rate sits at.

    Args:
        rates: the grid; one rate is a fixed rate, not a choice (nothing to widen by).
        score: rate -> the dev value the choice minimises (e.g. bits per byte); called once per rate scored.
        widenings: how many rates may be added past an edge, one at a time.
    Returns:
        {"lr": the chosen rate, "scores": {rate_key: value} for every rate scored, ascending by rate,
         "widened": the rates added past an edge, "at_edge": whether the choice is still the smallest or largest
         of two or more rates scored}. Ties go to the smaller rate; a diverged rate (a NaN or infinite score)
         ranks last, and a ValueError naming ``name`` says when every rate diverged.
    """
    checks.positive_int("widenings", widenings, minimum=0)
    values = {rate: score(rate) for rate in check_grid(name, rates)}
    widened = []
    while len(values) > 1 and len(widened) < widenings:
        scored = sorted(values)
        nxt = _beyond(scored, min(scored, key=lambda rate: _rank(values[rate])))
        if nxt is None:
            break
        values[nxt] = score(nxt)
        widened.append(nxt)
    scored = sorted(values)
    if not any(math.isfinite(values[rate]) for rate in scored):
        raise ValueError(f"every rate of {name} diverged ("
                         + ", ".join(f"{rate_key(rate)}: {values[rate]}" for rate in scored) + "): try smaller rates")
    best = min(scored, key=lambda rate: _rank(values[rate]))
    return {"lr": best, "scores": {rate_key(rate): values[rate] for rate in scored}, "widened": widened,
            "at_edge": len(scored) > 1 and best in (scored[0], scored[-1])}


def sweeping_seeds(first: int, seeds: int, sweep_seeds: int, grid: Sequence[float]) -> range:
    """The seeds of a run (``seeds`` from ``first``) that sweep ``grid``: the first ``sweep_seeds`` (0: every
    seed); a ValueError naming --lr-sweep-seeds when it is negative, above ``seeds`` or given without a grid."""
    checks.positive_int("--lr-sweep-seeds", sweep_seeds, minimum=0)
    if sweep_seeds and not grid:
        raise ValueError("--lr-sweep-seeds says which seeds sweep a grid of --lrs; give --lrs too")
    if sweep_seeds > seeds:
        raise ValueError(f"--lr-sweep-seeds must be between 1 and --seeds ({seeds}), got {sweep_seeds}")
    return range(first, first + (sweep_seeds or seeds))


def inherit_rate(grid: Sequence[float], sweeps: Sequence[dict], seeds: Sequence[int]) -> dict:
    """The rate a seed that sweeps no grid trains at: the lowest mean dev score over ``sweeps`` (the ``choose_rate``
    selections of ``grid`` by the sweeping seeds, numbered ``seeds``), among the rates every one of them scored; ties
    go to the smaller.

    Returns {"lr": that rate as the sweeps trained at it, "inherited_from": list(seeds), "mean_scores": {rate_key:
    mean} ascending by rate, "at_edge": whether the rate is the smallest or largest of two or more of those rates}."""
    if not sweeps or len(sweeps) != len(seeds):
        raise ValueError(f"inherit_rate needs one sweep per seed, got {len(sweeps)} sweeps for seeds {list(seeds)}")
    common = sorted(set.intersection(*(set(sweep["scores"]) for sweep in sweeps)), key=float)
    if not common:
        raise ValueError(f"the sweeps of seeds {list(seeds)} share no rate to choose from")
    means = {key: sum(sweep["scores"][key] for sweep in sweeps) / len(sweeps) for key in common}
    best = min(common, key=lambda key: _rank(means[key]))
    trained = {rate_key(rate): rate for rate in [*grid, *(rate for sweep in sweeps for rate in sweep["widened"])]}
    return {"lr": trained[best], "inherited_from": list(seeds), "mean_scores": means,
            "at_edge": len(common) > 1 and best in (common[0], common[-1])}
