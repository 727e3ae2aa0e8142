"""Figures of a ``posenc pretrained`` results dict: loss by position (mean over documents), retrieval per row, and
the fine-tuning curve."""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from .style import colours


def loss_figure(results: dict) -> Figure:
    """Mean loss per position bin over the test documents, one line per row; the context dotted. No spread band:
    documents differ mostly in level (a Bible book against a code file), which the paired comparisons remove and a
    min..max band would turn into a wall that hides the rows' differences."""
    figure = Figure(figsize=(8.0, 4.8), layout="constrained")
    ax = figure.add_subplot()
    palette = colours(list(results["rows"]))
    means = []
    for name, row in results["rows"].items():
        edges = row["test"][0]["bins"]["bin_edges"]
        centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
        mean = torch.tensor([w["bins"]["loss"] for w in row["test"]]).mean(0)
        ax.plot(centres, mean, marker=".", label=name, color=palette[name])
        means.append(mean)
    ax.axvline(results["original_context"], color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel(f"token position in a {results['config']['to']:,}-token window (dotted: the model's context)")
    ax.set_ylabel("next-token loss (nats), mean per bin")
    ax.set_title(f"{results['config']['model']}: loss by position, mean over {len(results['documents']['test'])} "
                 "test documents")
    every = torch.cat(means)
    low, high = float(every.nan_to_num(nan=float("inf")).min()), float(every.nan_to_num(nan=float("-inf")).max())
    margin = 0.08 * (high - low) or 0.1
    ax.set_ylim(low - margin, high + margin)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return figure


def retrieval_figure(results: dict) -> Figure:
    """Keys found per (row, depth band) at the run's length, and the unscaled model inside its context, with the
    mean log-probability of the right word."""
    config = results["config"]
    cells = {name: row["keys"] for name, row in results["rows"].items()}
    cells[f"none, first {results['in_context']['length']:,} (in context)"] = results["in_context"]["test_keys"]
    names = list(cells)
    figure = Figure(figsize=(1.3 * config["bands"] + 3.5, 0.45 * len(names) + 1.8), layout="constrained")
    ax = figure.add_subplot()
    grid = [[float("nan") if a is None else a for a in cells[n]["by_band"]] for n in names]
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(config["bands"]), [f"{b + 1}" for b in range(config["bands"])])
    ax.set_yticks(range(len(names)), [f"{n} ({cells[n]['found']}/{cells[n]['total']})" for n in names])
    ax.set_xlabel("depth band of the key (1: the document's start, farthest from the question)")
    for i, name in enumerate(names):
        for j, (acc, lp) in enumerate(zip(cells[name]["by_band"], cells[name]["log_prob_by_band"])):
            if acc is not None:
                ax.text(j, i, f"{acc:.0%}\n{lp:.1f}", ha="center", va="center", fontsize=7)
    figure.colorbar(image, ax=ax, shrink=0.8, label="keys found (text: log-prob of the right word)")
    ax.set_title(f"{config['model']}: keys planted in {len(results['documents']['test'])} test documents of "
                 f"{config['to']:,} tokens (context {results['original_context']:,})", fontsize=9)
    return figure


def curve_figure(results: dict) -> Figure:
    """Dev loss past the original context against fine-tuning step, one line per fine-tuned row."""
    figure = Figure(figsize=(6.0, 4.0), layout="constrained")
    ax = figure.add_subplot()
    palette = colours(list(results["finetune"]))
    for name, record in results["finetune"].items():
        steps = sorted(record["curve"], key=int)
        ax.plot([int(s) for s in steps], [record["curve"][s] for s in steps], marker="o", label=name,
                color=palette[name])
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel(f"dev loss past {results['original_context']:,} tokens (nats)")
    ax.set_title(f"{results['config']['model']}: fine-tuning at factor {results['factor']:g}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return figure
