"""The style every figure shares: headless matplotlib, one fixed colour per row, atomic PNG saving.

Each figure is a function that returns a matplotlib Figure (object-oriented API); ``save_figure``
writes it as a PNG atomically.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from .. import storage  # noqa: E402


def save_figure(figure: Figure, path: str | Path, dpi: int = 110) -> Path:
    return storage.atomic_write(path, lambda temp: figure.savefig(temp, dpi=dpi, format="png", bbox_inches="tight"))


def row_colours(results: dict) -> dict[str, str]:
    """One colour per row, fixed by the row's place in results: the same row has the same
    colour in every figure, even one that leaves some rows out."""
    return colours([row["name"] for row in results["rows"]])


def colours(names: list[str]) -> dict[str, str]:
    """A fixed colour per name, by its place in ``names``."""
    palette = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"].colors
    return {name: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, name in enumerate(names)}


def band(ax, xs: list, lows: list, highs: list, colour: str) -> None:
    """A translucent 95%-interval band behind a line (points whose interval is None are skipped)."""
    points = [(x, lo, hi) for x, lo, hi in zip(xs, lows, highs) if lo is not None and hi is not None]
    if points:
        x, lo, hi = zip(*points)
        ax.fill_between(x, lo, hi, color=colour, alpha=0.15, linewidth=0)


def length_axis(ax, lengths: list[int], train_length: int, unit: str) -> None:
    """x: evaluation lengths on a log2 scale, ticked at each; the training length dotted."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(length) for length in lengths])
    ax.axvline(train_length, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel(f"evaluation length ({unit}, log2 scale); dotted: training length")
