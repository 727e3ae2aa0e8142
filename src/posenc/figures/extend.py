"""Figures of a ``posenc extend`` results dict: extension by length, fine-tuning curves, LongRoPE factors.

Colours belong to a method (plain RoPE, pi, ntk, ..., alibi), so a method's zero-shot
row (dashed) and fine-tuned row (solid) share one, in every figure.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from .style import band, colours


def _method_colours(results: dict) -> dict[str, str]:
    return colours(list(dict.fromkeys(row["method"] for row in results["rows"])))


def extension_figure(results: dict) -> Figure:
    """Bits per byte vs length: zero-shot dashed, fine-tuned solid, one colour per method."""
    figure = Figure(figsize=(9.0, 4.8), layout="constrained")
    ax = figure.add_subplot()
    lengths, palette = results["eval_lengths"], _method_colours(results)
    for row in results["rows"]:
        points = [(n, row["bits_per_byte"][str(n)]) for n in lengths if row["bits_per_byte"][str(n)] is not None]
        style = {"zero-shot": "--", "fine-tuned": "-", "from scratch": ":"}[row["stage"]]
        ax.plot(*zip(*points), style, marker="o", label=row["name"], color=palette[row["method"]])
        intervals = [row["interval"][str(n)] or (None, None) for n in lengths]
        band(ax, lengths, *zip(*intervals), palette[row["method"]])
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.axvline(results["train_length"], color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(results["target_length"], color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("evaluation length (log2); dotted: training length (grey), target length (black)")
    ax.set_ylabel("bits per byte (lower is better)")
    ax.set_title(f"Extending RoPE ×{results['config']['factor']:g}: zero-shot (dashed) vs fine-tuned (solid); "
                 "bands: 95% intervals")
    values = [v for row in results["rows"] for v in row["bits_per_byte"].values() if v is not None]
    ax.set_ylim(min(values) * 0.95, min(max(values), min(values) * 2.2) * 1.05)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    return figure


def finetune_curve_figure(results: dict) -> Figure:
    """Bits per byte at the target length against fine-tuning steps at the chosen rate, per row, with bands."""
    figure = Figure(figsize=(7.0, 4.5), layout="constrained")
    ax = figure.add_subplot()
    palette = _method_colours(results)
    method = {row["name"]: row["method"] for row in results["rows"]}
    for name, curve in results["curves"].items():
        steps = sorted(curve, key=int)
        x = [int(s) for s in steps]
        style = ":" if method[name] == "rope" else "-"
        ax.plot(x, [curve[s]["mean"] for s in steps], style, marker="o", label=name, color=palette[method[name]])
        band(ax, x, [curve[s]["low"] for s in steps], [curve[s]["high"] for s in steps], palette[method[name]])
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel(f"fine-tuning steps at {results['target_length']} tokens "
                  f"({results['config']['finetune_batch']} windows per step; symlog)")
    ax.set_ylabel(f"bits per byte at {results['target_length']} (test windows)")
    ax.set_title("How minimal is minimal fine-tuning? (each row at its rate chosen on dev)")
    if results["curves"]:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return figure


def factors_figure(results: dict) -> Figure:
    """Searched λ_i against PI, NTK and YaRN's equivalent factors, by wavelength 2π/θ_i."""
    figure = Figure(figsize=(7.0, 4.5), layout="constrained")
    ax = figure.add_subplot()
    longrope = results["longrope"]
    wavelengths = [2 * math.pi / theta for theta in longrope["inverse_frequencies"]]
    palette = _method_colours(results)
    for method, factors in longrope["method_factors"].items():
        ax.plot(wavelengths, factors, "--", marker=".", label=method, color=palette.get(method))
    ax.plot(wavelengths, longrope["best"]["factors"], "-", marker="o", label="searched (run and exported with n̂ = 0)",
            color=palette.get("longrope"))
    ax.axvline(results["train_length"], color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(results["target_length"], color="black", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("wavelength 2π/θ_i in tokens (log); dotted: training and target length")
    ax.set_ylabel("rescale factor λ_i (θ_i → θ_i / λ_i)")
    ax.set_title("LongRoPE: searched per-frequency factors")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return figure
