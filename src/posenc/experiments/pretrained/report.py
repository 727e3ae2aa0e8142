"""Results of ``extend --hf`` as tables, loss_by_position.png, passkey.png and rope_parameters.json."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

from .. import storage
from ..plots import colours, save_figure
from .tables import markdown_table, stage_rows, text_table


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    lengths = results["config"]["lengths"]
    header = ["method"] + [f"{n:,}" for n in lengths]
    body = [[method] + [f"{r['loss'][str(n)]['mean']:.3f}" for n in lengths] for method, r in results["methods"].items()]
    return header, body


def passkey_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    config = results["config"]
    header = ["method"] + [f"{n:,} @ {d:g}" for n in config["passkey_lengths"] for d in config["passkey_depths"]]
    body = [[method] + [f"{r['passkey'][str(n)]['accuracy'][str(d)]:.0%}" for n in config["passkey_lengths"]
                        for d in config["passkey_depths"]] for method, r in results["methods"].items()]
    return header, body


def title(results: dict) -> str:
    return (f"{results['config']['model']} ({results['model_type']}, context {results['original_context']:,}): mean "
            f"loss (nats) over the first N tokens, factor {results['factor']:g}")


def terminal_table(results: dict) -> str:
    return "\n\n".join([title(results), text_table(*table_rows(results)), text_table(*passkey_rows(results))])


def markdown(results: dict) -> str:
    lines = [f"# {title(results)}", ""] + markdown_table(*table_rows(results))
    lines += ["", "## Passkey retrieval (accuracy per length @ depth)", ""] + markdown_table(*passkey_rows(results))
    if results["best_method"]:
        lines += ["", f"Best method at {results['best_at']:,} tokens: **{results['best_method']}**; its "
                  "`rope_parameters` (rope_parameters.json):", "", "```json",
                  json.dumps(results["best_rope_parameters"], indent=2), "```"]
    lines += ["", "## Wall time per stage", ""] + markdown_table(["stage", "seconds"], stage_rows(results["stages_s"]))
    lines += ["", f"Peak memory (RSS) {results['peak_rss_gib']:.2f} GiB. Text: {results['text_tokens']:,} tokens. "
              f"posenc {results['versions']['posenc']}, torch {results['versions']['torch']}."]
    return "\n".join(lines) + "\n"


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


def write_all(results: dict, out: Path) -> None:
    storage.write_json(out / "results.json", results)
    storage.write_text(out / "results.md", markdown(results))
    save_figure(loss_figure(results), out / "loss_by_position.png")
    save_figure(passkey_figure(results), out / "passkey.png")
    if results["best_method"]:
        storage.write_json(out / "rope_parameters.json", {
            "rope_parameters": results["best_rope_parameters"],
            "metadata": {"method": results["best_method"], "chosen_by": f"lowest mean loss over the first "
                         f"{results['best_at']} tokens", "model": results["config"]["model"]}})
