"""Results of ``extend`` as tables (terminal, Markdown), files on disk and three figures (figures/extend.py)."""

from __future__ import annotations

from pathlib import Path

from ... import storage
from ...lm.runtime import provenance_line
from ..rate_grid import rate_label
from ..tables import difference_cell, interval_cell, markdown_table, stage_rows, text_table


def _lengths(results: dict) -> list[str]:
    train_length = results["train_length"]
    return [f"{n / train_length:g}× ({n})" for n in results["eval_lengths"]]


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Each row's bits per byte with its 95% interval (and the spread over seeds)."""
    body = [[row["name"], row["stage"]] + [interval_cell(row["bits_per_byte"][str(n)], row["interval"][str(n)],
                                                         row["bits_per_byte_std"][str(n)])
                                           for n in results["eval_lengths"]]
            for row in results["rows"]]
    return ["row", "stage"] + _lengths(results), body


def change_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    body = [[row["name"]] + [difference_cell(row["change_from_1x"][str(n)]) for n in results["eval_lengths"][1:]]
            for row in results["rows"]]
    return ["row"] + _lengths(results)[1:], body


def comparison_rows(results: dict, against: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Every paired comparison a − b at each length, or only those whose b is the row ``against``."""
    body = [[f"{c['a']} − {c['b']}", c["question"]] + [difference_cell(c["difference"][str(n)])
                                                        for n in results["eval_lengths"]]
            for c in results["comparisons"] if against is None or c["b"] == against]
    return ["a − b", "question"] + _lengths(results), body


def title(results: dict) -> str:
    seeds, windows = len(results["seeds"]), results["windows"]
    return (f"Bits per byte (lower is better): RoPE trained at {results['train_length']}, extended to "
            f"{results['target_length']} (factor {results['config']['factor']:g}), {results['protocol']}, "
            f"{windows['count']} test windows, {seeds} seed{'s' if seeds > 1 else ''}: mean [95% interval]"
            f"{' ± std over seeds' if seeds > 1 else ''}")


def terminal_table(results: dict) -> str:
    return title(results) + "\n" + text_table(*table_rows(results))


def markdown(results: dict) -> str:
    corpus, config, windows = results["corpus"], results["config"], results["windows"]
    lines = [f"# {title(results)}", ""] + markdown_table(*table_rows(results), text_columns=2)
    share = results["finetune_tokens"] / results["pretraining_tokens"]
    rates = ", ".join(f"{lr:g}" for lr in config["finetune_lrs"])
    lines += ["", f"Scored on the test split: {windows['count']} windows of {windows['length']} bytes "
              f"({windows['bytes']:,} bytes from {windows['files']} of its {windows['split_files']} files), the same "
              f"for every row; intervals: {windows['interval']}. Fine-tuning: {config['finetune_steps']} steps × "
              f"{config['finetune_batch']} windows × {results['target_length']} tokens = "
              f"{results['finetune_tokens']:,} tokens per fine-tuned row ({share:.0%} of the "
              f"{results['pretraining_tokens']:,} pretraining tokens), from the train split, at the rate of "
              f"{{{rates}}} that scores best on {config['sweep_windows']} dev windows (the grid grows by a step past "
              f"its edge while the best rate sits there, up to {config.get('finetune_widenings', 0)} times). Every "
              "method runs at factor "
              f"{config['factor']:g} at every length. ALiBi: {results['alibi']}."]
    if results["scratch_tokens"]:
        lines += ["", f"`rope trained at target`: {results['scratch_tokens']:,} tokens at the target length, the "
                  "pretraining plus one fine-tuning's tokens."]
    lines += ["", "## Paired comparisons (a − b on the same windows; negative: a is better; '(noise)': the "
              "interval covers 0)", ""] + markdown_table(*comparison_rows(results), text_columns=2)
    lines += ["", "## Change from the row's own 1× score", ""] + markdown_table(*change_rows(results))
    if results["sweep"]:
        lines += ["", f"## Fine-tuning rate, chosen on dev (bits at {results['target_length']} on "
                  f"{config['sweep_windows']} dev windows)", ""]
        lines += markdown_table(*sweep_rows(results["sweep"]))
    if results["curves"]:
        lines += ["", f"## Bits per byte at {results['target_length']} during fine-tuning, at the chosen rate "
                  f"({config['curve_windows']} test windows)", ""]
        lines += markdown_table(*curve_rows(results))
    longrope = results["longrope"]
    if longrope:
        seeds = ", ".join(f"{m} {v:.4f}" for m, v in longrope["seed_losses"].items())
        lines += ["", "## LongRoPE search", "",
                  f"Exported: seed {longrope['exported_seed']}'s factors. Its search scored candidates on "
                  f"{longrope['windows']} dev windows: best {longrope['loss_best_n_hat']:.4f} nats with n̂ = "
                  f"{longrope['best']['n_hat']}; the same factors with n̂ = 0 (what transformers can hold, what the "
                  f"`rope+longrope` rows run and what is exported) score {longrope['loss_n_hat_0']:.4f}. Seeds: "
                  f"{seeds}. {longrope['candidates_evaluated']} candidates at {longrope['candidates_per_s']:.2f}/s; "
                  "best loss per generation: " + ", ".join(f"{v:.4f}" for v in longrope["best_loss_per_generation"])
                  + ".", "", "Exported `rope_parameters` (rope_parameters.json):", "", "```json",
                  _compact_json(longrope["rope_parameters"]), "```"]
    lines += ["", "## Wall time per stage", ""] + markdown_table(["stage", "seconds"], stage_rows(results["stages_s"]))
    lines += ["", f"Corpus: {corpus['source']} (sha256 `{corpus['sha256'][:16]}`, split {corpus['split']}). "
              f"Device: {results['device']}. " + provenance_line(results["provenance"])]
    return "\n".join(lines) + "\n"


def curve_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Bits at the target along each fine-tuning, at the chosen rate: a column per step."""
    steps = sorted({int(s) for curve in results["curves"].values() for s in curve})
    body = [[name] + [interval_cell(curve[str(s)]["mean"], [curve[str(s)]["low"], curve[str(s)]["high"]],
                                    curve[str(s)]["seed_std"]) if str(s) in curve else "" for s in steps]
            for name, curve in results["curves"].items()]
    return ["row"] + [f"step {s}" for s in steps], body


def sweep_rows(sweep: dict) -> tuple[list[str], list[list[str]]]:
    """The rate sweep as a table: a column per rate any row scored (blank where a row did not), and each seed's
    chosen rate, marked "(edge)" where it is still the grid's smallest or largest."""
    rates = sorted({lr for row in sweep.values() for lr in row["dev_bits"]}, key=float)
    body = [[name] + [f"{row['dev_bits'][lr]:.3f}" if lr in row["dev_bits"] else "" for lr in rates]
            + [", ".join(rate_label(lr, edge)
                         for lr, edge in zip(row["chosen"], row.get("at_edge", [False] * len(row["chosen"]))))]
            for name, row in sweep.items()]
    return ["row"] + [f"lr {lr}" for lr in rates] + ["chosen"], body


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
