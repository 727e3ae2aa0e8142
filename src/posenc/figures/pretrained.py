"""Figures of a ``posenc extend --hf`` results dict: loss by position and the passkey grid, per method."""

from __future__ import annotations

from matplotlib.figure import Figure

from .style import colours


def loss_figure(results: dict) -> Figure:
    """Mean loss per position bin in the longest window, one line per method; the model's context marked."""
    figure = Figure(figsize=(8.0, 4.8), layout="constrained")
    ax = figure.add_subplot()
    longest = str(max(results["config"]["lengths"]))
    palette = colours(list(results["methods"]))
    for method, record in results["methods"].items():
        bins = record["loss"][longest]["bins"]
        centres = [(a + b) / 2 for a, b in zip(bins["bin_edges"][:-1], bins["bin_edges"][1:])]
        ax.plot(centres, bins["loss"], marker=".", label=method, color=palette[method])
    ax.axvline(results["original_context"], color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel(f"token position in a {int(longest):,}-token window (dotted: the model's context)")
    ax.set_ylabel("next-token loss (nats), mean per bin")
    ax.set_title(f"{results['config']['model']}: loss by position, factor {results['factor']:g}")
    values = [v for r in results["methods"].values() for v in r["loss"][longest]["bins"]["loss"]]
    ax.set_ylim(min(values) * 0.9, min(max(values), min(values) * 4) * 1.05)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return figure


def passkey_figure(results: dict) -> Figure:
    """One heatmap per method: accuracy per (length, depth)."""
    config, methods = results["config"], list(results["methods"])
    figure = Figure(figsize=(2.6 * len(methods) + 1, 3.2), layout="constrained")
    axes = figure.subplots(1, len(methods), squeeze=False)[0]
    image = None
    for ax, method in zip(axes, methods):
        grid = [[results["methods"][method]["passkey"][str(n)]["accuracy"][str(d)] for d in config["passkey_depths"]]
                for n in config["passkey_lengths"]]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(config["passkey_depths"])), [f"{d:g}" for d in config["passkey_depths"]])
        ax.set_yticks(range(len(config["passkey_lengths"])), [f"{n:,}" for n in config["passkey_lengths"]])
        ax.set_xlabel("key depth")
        ax.set_title(method)
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                ax.text(j, i, f"{value:.0%}", ha="center", va="center", fontsize=8)
    axes[0].set_ylabel("prompt length (tokens)")
    figure.colorbar(image, ax=list(axes), shrink=0.8, label="passkey accuracy")
    figure.suptitle(f"{config['model']}: passkey retrieval (context {results['original_context']:,})")
    return figure
