"""Results of ``extend`` as tables (terminal, Markdown), files on disk and three figures (figures/extend.py)."""

from __future__ import annotations

from pathlib import Path

from ... import storage
from ..tables import markdown_table, stage_rows, text_table


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


def write_all(results: dict, out: Path) -> None:
    # matplotlib is imported only when a report is written
    from ...figures.extend import extension_figure, factors_figure, finetune_curve_figure
    from ...figures.style import save_figure

    storage.write_json(out / "results.json", results)
    storage.write_text(out / "results.md", markdown(results))
    save_figure(extension_figure(results), out / "extension.png")
    save_figure(finetune_curve_figure(results), out / "finetune_curve.png")
    if results["longrope"]:
        save_figure(factors_figure(results), out / "longrope_factors.png")
