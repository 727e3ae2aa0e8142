"""A learning rate chosen on dev from a grid that widens until the choice lies inside it.

The best rate of a grid at its smallest or largest value says only that the best rate may lie beyond it: a
comparison between rows that chose the grid's edge depends on where the grid ends. ``choose_rate`` scores every
rate of the grid and, while the best is at an edge, scores one more rate a grid step beyond that edge (the ratio
of the two rates at that end), at most ``widenings`` times. The selection names every rate scored and whether the
choice still sits at an edge, so a table can say so.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .. import checks


def rate_key(rate: float) -> str:
    """How a rate is written in folders and results files (``f"{rate:g}"``)."""
    return f"{rate:g}"


def rate_label(rate: float, at_edge: bool) -> str:
    """A chosen rate as a table shows it, marked "(edge)" where it is still the grid's smallest or largest."""
    return rate_key(rate) + (" (edge)" if at_edge else "")


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
         of two or more rates scored}. Ties go to the smaller rate.
    """
    checks.positive_int("widenings", widenings, minimum=0)
    values = {rate: score(rate) for rate in check_grid(name, rates)}
    widened = []
    while len(values) > 1 and len(widened) < widenings:
        scored = sorted(values)
        nxt = _beyond(scored, min(scored, key=values.get))
        if nxt is None:
            break
        values[nxt] = score(nxt)
        widened.append(nxt)
    scored = sorted(values)
    best = min(scored, key=values.get)
    return {"lr": best, "scores": {rate_key(rate): values[rate] for rate in scored}, "widened": widened,
            "at_edge": len(scored) > 1 and best in (scored[0], scored[-1])}
