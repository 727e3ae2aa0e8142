"""Figure of a ``posenc task`` results dict: exact match vs length, one line per row."""

from __future__ import annotations

from matplotlib.figure import Figure

from .style import band, length_axis, row_colours


def task_figure(results: dict) -> Figure:
    """Exact match (0..1) vs eval length (log2 x), 95% bands; dotted: the training length."""
    figure = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = figure.add_subplot()
    lengths = results["eval_lengths"]
    colours = row_colours(results)
    for row in results["rows"]:
        cells = [(n, row["exact_match"][str(n)]) for n in lengths]
        cells = [(n, c) for n, c in cells if c is not None]
        if not cells:
            continue
        style = "--" if row["randomized_positions"] else "-"
        ax.plot([n for n, _ in cells], [c["mean"] for _, c in cells], style, marker="o", label=row["name"],
                color=colours[row["name"]])
        band(ax, [n for n, _ in cells], [c["low"] for _, c in cells], [c["high"] for _, c in cells], colours[row["name"]])
    length_axis(ax, lengths, results["train_length"], "tokens")
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("exact match")
    ax.set_title(f"{results['task']}: trained at {results['train_length']} tokens (bands: 95% intervals)")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3)
    return figure
