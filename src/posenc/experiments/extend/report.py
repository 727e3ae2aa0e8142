"""Results of ``extend`` as tables (terminal, Markdown) and three figures.

Colours belong to a method (plain RoPE, pi, ntk, ..., alibi), so a method's zero-shot
row (dashed) and fine-tuned row (solid) share one, in every figure.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure

from .. import storage
from ..plots import colours, save_figure
from .tables import markdown_table, stage_rows, text_table


def _method_colours(results: dict) -> dict[str, str]:
    return colours(list(dict.fromkeys(row["method"] for row in results["rows"])))


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    train_length = results["train_length"]
    header = ["row", "stage"] + [f"{length / train_length:g}× ({length})" for length in results["eval_lengths"]]
    body = []
    for row in results["rows"]:
        cells = ["N/A" if row["bits_per_byte"][str(n)] is None else f"{row['bits_per_byte'][str(n)]:.3f}"
                 for n in results["eval_lengths"]]
        body.append([row["name"], row["stage"]] + cells)
    return header, body


def title(results: dict) -> str:
    return (f"Bits per byte (lower is better): RoPE trained at {results['train_length']}, extended to "
            f"{results['target_length']} (factor {results['config']['factor']:g}), {results['protocol']}")


def terminal_table(results: dict) -> str:
    return title(results) + "\n" + text_table(*table_rows(results))


def markdown(results: dict) -> str:
    header, body = table_rows(results)
    corpus, config = results["corpus"], results["config"]
    lines = [f"# {title(results)}", ""] + markdown_table(header, body, text_columns=2)
    share = results["finetune_tokens"] / results["pretraining_tokens"]
    lines += ["", f"Fine-tuning: {config['finetune_steps']} steps × {config['finetune_batch']} windows × "
              f"{results['target_length']} tokens = {results['finetune_tokens']:,} tokens per fine-tuned row "
              f"({share:.0%} of the {results['pretraining_tokens']:,} pretraining tokens), lr {config['finetune_lr']:g}. "
              f"Every method runs at factor {config['factor']:g} at every length. ALiBi: {results['alibi']}."]
    if results["curves"]:
        steps = sorted({int(s) for curve in results["curves"].values() for s in curve})
        body = [[method] + [f"{curve[str(s)]:.3f}" if str(s) in curve else "" for s in steps]
                for method, curve in results["curves"].items()]
        lines += ["", f"## Bits per byte at {results['target_length']} during fine-tuning", ""]
        lines += markdown_table(["method"] + [f"step {s}" for s in steps], body)
    longrope = results["longrope"]
    if longrope:
        seeds = ", ".join(f"{m} {v:.4f}" for m, v in longrope["seed_losses"].items())
        lines += ["", "## LongRoPE search", "",
                  f"Best loss on the search windows {longrope['loss_best_n_hat']:.4f} nats with n̂ = "
                  f"{longrope['best']['n_hat']}; the exported factors (n̂ = 0, transformers has no field for n̂) "
                  f"score {longrope['loss_n_hat_0']:.4f}. Seeds: {seeds}. {longrope['candidates_evaluated']} "
                  f"candidates at {longrope['candidates_per_s']:.2f}/s; best loss per generation: "
                  + ", ".join(f"{v:.4f}" for v in longrope["best_loss_per_generation"]) + ".",
                  "", "Exported `rope_parameters` (rope_parameters.json):", "", "```json",
                  _compact_json(longrope["rope_parameters"]), "```"]
    lines += ["", "## Wall time per stage", ""] + markdown_table(["stage", "seconds"], stage_rows(results["stages_s"]))
    lines += ["", f"Corpus: {corpus['source']} (sha256 `{corpus['sha256'][:16]}`). Device: {results['device']}. "
              f"posenc {results['versions']['posenc']}, torch {results['versions']['torch']}."]
    return "\n".join(lines) + "\n"


def _compact_json(value: dict) -> str:
    import json

    return "{\n" + ",\n".join(f'  "{k}": {json.dumps(v)}' for k, v in value.items()) + "\n}"


def extension_figure(results: dict) -> Figure:
    """Bits per byte vs length: zero-shot dashed, fine-tuned solid, one colour per method."""
    figure = Figure(figsize=(9.0, 4.8), layout="constrained")
    ax = figure.add_subplot()
    lengths, palette = results["eval_lengths"], _method_colours(results)
    for row in results["rows"]:
        points = [(n, row["bits_per_byte"][str(n)]) for n in lengths if row["bits_per_byte"][str(n)] is not None]
        style = {"zero-shot": "--", "fine-tuned": "-", "from scratch": ":"}[row["stage"]]
        ax.plot(*zip(*points), style, marker="o", label=row["name"], color=palette[row["method"]])
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.axvline(results["train_length"], color="grey", linewidth=0.8, linestyle=":")
    ax.axvline(results["target_length"], color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("evaluation length (log2); dotted: training length (grey), target length (black)")
    ax.set_ylabel("bits per byte (lower is better)")
    ax.set_title(f"Extending RoPE ×{results['config']['factor']:g}: zero-shot (dashed) vs fine-tuned (solid)")
    values = [v for row in results["rows"] for v in row["bits_per_byte"].values() if v is not None]
    ax.set_ylim(min(values) * 0.95, min(max(values), min(values) * 2.2) * 1.05)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    return figure


def finetune_curve_figure(results: dict) -> Figure:
    """Bits per byte at the target length against fine-tuning steps, per method."""
    figure = Figure(figsize=(7.0, 4.5), layout="constrained")
    ax = figure.add_subplot()
    palette = _method_colours(results)
    for method, curve in results["curves"].items():
        steps = sorted(curve, key=int)
        ax.plot([int(s) for s in steps], [curve[s] for s in steps], marker="o", label=method, color=palette[method])
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel(f"fine-tuning steps at {results['target_length']} tokens "
                  f"({results['config']['finetune_batch']} windows per step; symlog)")
    ax.set_ylabel(f"bits per byte at {results['target_length']}")
    ax.set_title("How minimal is minimal fine-tuning?")
    if results["curves"]:
        ax.legend(fontsize=8)
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
    ax.plot(wavelengths, longrope["best"]["factors"], "-", marker="o", label=f"searched (n̂ = {longrope['best']['n_hat']})",
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


def write_all(results: dict, out: Path) -> None:
    storage.write_json(out / "results.json", results)
    storage.write_text(out / "results.md", markdown(results))
    save_figure(extension_figure(results), out / "extension.png")
    save_figure(finetune_curve_figure(results), out / "finetune_curve.png")
    if results["longrope"]:
        save_figure(factors_figure(results), out / "longrope_factors.png")
