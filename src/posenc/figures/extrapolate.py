"""Figures of a ``posenc extrapolate`` results dict: bits-per-byte vs length, and loss by position."""

from __future__ import annotations

from matplotlib.figure import Figure

from .style import band, length_axis, row_colours


def extrapolation_figure(results: dict) -> Figure:
    """Bits-per-byte vs eval length (log2 x), one line per row; the training length marked."""
    figure = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = figure.add_subplot()
    lengths = results["eval_lengths"]
    colours = row_colours(results)
    for row in results["rows"]:
        points = [(length, row["bits_per_byte"][str(length)]) for length in lengths]
        points = [(x, y) for x, y in points if y is not None]
        if not points:
            continue
        style = "--" if "+" in row["name"] else "-"
        ax.plot(*zip(*points), style, marker="o", label=row["name"], color=colours[row["name"]])
        if row.get("interval"):
            intervals = [row["interval"][str(length)] or (None, None) for length in lengths]
            band(ax, lengths, *zip(*intervals), colours[row["name"]])
    length_axis(ax, lengths, results["train_length"], "bytes")
    ax.set_ylabel("bits per byte (lower is better)")
    ax.set_title(f"Train short, test long ({results['protocol']}; bands: 95% intervals)")
    _cap_y(ax, results)
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    return figure


def _cap_y(ax, results: dict) -> None:
    """Keep the interesting range visible when one row blows up."""
    values = [v for row in results["rows"] for v in row["bits_per_byte"].values() if v is not None]
    if values:
        low = min(values)
        ax.set_ylim(low * 0.95, min(max(values), low * 2.5) * 1.05)


def position_loss_figure(results: dict) -> Figure:
    """Loss vs position inside the longest eval windows: where each encoding breaks."""
    figure = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = figure.add_subplot()
    colours = row_colours(results)
    for row in results["rows"]:
        position = row.get("position_bits")
        if not position:
            continue
        edges = position["bin_edges"]
        centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        style = "--" if "+" in row["name"] else "-"
        ax.plot(centres, position["bits"], style, label=row["name"], color=colours[row["name"]])
        if "low" in position:
            band(ax, centres, position["low"], position["high"], colours[row["name"]])
    ax.axvline(results["train_length"], color="grey", linewidth=0.8, linestyle=":")
    longest = max(results["eval_lengths"])
    ax.set_xlabel(f"position inside a {longest}-byte window (dotted: training length)")
    ax.set_ylabel("bits per byte at that position")
    ax.set_title("Where extrapolation breaks: loss by position")
    values = [b for row in results["rows"] if row.get("position_bits") for b in row["position_bits"]["bits"]]
    if values:
        low = min(values)
        ax.set_ylim(low * 0.95, min(max(values), low * 3) * 1.05)
        ax.legend(fontsize=8, ncol=2)
    else:
        ax.text(0.5, 0.5, "no per-position losses: recorded for non-overlapping windows only",
                ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    return figure
