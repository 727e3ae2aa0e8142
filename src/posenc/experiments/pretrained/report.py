"""Results of ``extend --hf``: the collected dict, tables, figures and rope_parameters.json.

Per row: test means (first tokens, inside the context, past it) with the spread over windows; retrieval accuracy
and mean log-probability of the right digits per (length, depth band). Comparisons are paired differences over
the same test windows, with a bootstrap interval over windows (``experiments.intervals``); with four windows the
interval is wide, and a verdict it does not support is not written.
"""

from __future__ import annotations

import json
from pathlib import Path

from ... import storage
from ..intervals import covers_zero, paired_difference, summary
from ..tables import difference_cell, interval_cell, markdown_table, stage_rows, text_table

MEASURES = ("first", "inside", "past")


def _retrieval_cells(records: dict, bands: int) -> dict:
    """{length: {"accuracy": [per band], "log_prob": [per band], "overall": accuracy}}."""
    cells = {}
    for length, keys in records.items():
        per_band = [[k for k in keys if k["band"] == b] for b in range(bands)]
        cells[length] = {"accuracy": [sum(k["correct"] for k in band) / len(band) for band in per_band],
                         "log_prob": [sum(k["log_prob"] for k in band) / len(band) for band in per_band],
                         "overall": sum(k["correct"] for k in keys) / len(keys)}
    return cells


def comparisons(rows: dict, control: dict, finetune_method: str) -> dict:
    """Paired differences past the context over the test windows (a − b; negative: a is better)."""
    past = {name: [w["past"] for w in row["test"]] for name, row in rows.items()}
    past["context control"] = [w["past"] for w in control["test"]]
    groups = list(range(len(past["context control"])))
    pairs = [(name, "context control") for name in rows]
    pose, ctrl = f"{finetune_method}+pose", f"{finetune_method}+control"
    pairs += [(a, b) for a, b in [(pose, finetune_method), (pose, ctrl), ("self-extend", pose),
                                  ("self-extend", finetune_method)] if a in past and b in past]
    return {f"{a} − {b}": paired_difference(past[a], past[b], groups) for a, b in pairs}


def collect(config, model, original, factor, group, test, dev, measured, control, tuned, stages) -> dict:
    groups = list(range(len(test)))
    rows = {}
    for name, row in measured.items():
        rows[name] = {**row, **{key: summary([w[key] for w in row["test"]], groups) for key in MEASURES},
                      "dev_past": sum(w["past"] for w in row["dev"]) / len(row["dev"]),
                      "retrieval_cells": _retrieval_cells(row["retrieval"], config.bands)}
    exportable = {n: r["dev_past"] for n, r in rows.items() if r["attention"] == "sdpa" and n != "none"
                  and r["method"] != "none"}
    best = min(exportable, key=exportable.get) if exportable else None
    return {
        "config": config.to_dict(), "model_type": model.config.model_type, "original_context": original,
        "factor": factor, "self_extend_group": group,
        "windows": {split: [{"file": w["file"], "start": w["start"]} for w in windows]
                    for split, windows in (("test", test), ("dev", dev))},
        "rows": rows, "control": {**control, "past": summary([w["past"] for w in control["test"]], groups)},
        "comparisons": comparisons(rows, control, config.finetune_method), "finetune": tuned,
        "best_row": best, "best_rope_parameters": rows[best]["rope_parameters"] if best else None,
        "stages_s": stages, "wall_time_s": sum(stages.values()),
    }


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    context = results["original_context"]
    lengths = results["config"]["retrieval_lengths"]
    header = ["row", f"first {results['config']['first_tokens']:,}", f"inside {context:,}", f"past {context:,}",
              "dev past"] + [f"retrieval @ {n:,}" for n in lengths]
    body = []
    for name, row in results["rows"].items():
        cells = [interval_cell(row[key]["mean"], [row[key]["low"], row[key]["high"]]) for key in MEASURES]
        body.append([name, *cells, f"{row['dev_past']:.3f}"]
                    + [f"{row['retrieval_cells'][str(n)]['overall']:.0%}" for n in lengths])
    control = results["control"]["past"]
    body.append(["context control", "—", "—", interval_cell(control["mean"], [control["low"], control["high"]]),
                 f"{sum(w['past'] for w in results['control']['dev']) / len(results['control']['dev']):.3f}"]
                + ["—"] * len(lengths))
    return header, body


def title(results: dict) -> str:
    return (f"{results['config']['model']} ({results['model_type']}, context {results['original_context']:,}) at "
            f"{results['config']['to']:,} tokens (factor {results['factor']:g}): test loss (nats), mean over "
            f"{len(results['windows']['test'])} windows [95% interval]")


def terminal_table(results: dict) -> str:
    differences = [[name, difference_cell(d)] for name, d in results["comparisons"].items()]
    return "\n\n".join([title(results), text_table(*table_rows(results)),
                        text_table(["paired difference past the context", "nats"], differences)])


def verdicts(results: dict) -> list[str]:
    """One sentence per comparison, written only where its interval excludes zero."""
    lines = []
    for name, d in results["comparisons"].items():
        if covers_zero(d):
            lines.append(f"- {name}: {difference_cell(d)} — the interval covers zero: no verdict.")
        else:
            lines.append(f"- {name}: {difference_cell(d)} — {name.split(' − ')[0]} is "
                         f"{'lower (better)' if d['mean'] < 0 else 'higher (worse)'}.")
    return lines


def markdown(results: dict) -> str:
    config = results["config"]
    lines = [f"# {title(results)}", ""] + markdown_table(*table_rows(results))
    lines += ["", "## Paired differences past the context (same test windows)", ""] + verdicts(results)
    lines += ["", "## Retrieval: accuracy (mean log-probability of the right digits) per depth band", ""]
    bands = [f"band {b + 1}/{config['bands']}" for b in range(config["bands"])]
    body = [[f"{name} @ {n}"] + [f"{acc:.0%} ({lp:.1f})" for acc, lp in zip(cell["accuracy"], cell["log_prob"])]
            for name, row in results["rows"].items() for n, cell in row["retrieval_cells"].items()]
    lines += markdown_table(["row @ length"] + bands, body)
    if results["best_row"]:
        lines += ["", f"Best row on dev (lowest loss past the context): **{results['best_row']}**; its "
                  "`rope_parameters` (rope_parameters.json):", "", "```json",
                  json.dumps(results["best_rope_parameters"], indent=2), "```"]
    windows = ", ".join(f"{w['file']}@{w['start']}" for w in results["windows"]["test"])
    lines += ["", f"Test windows (file@token offset): {windows}.", "",
              "## Wall time per stage", ""] + markdown_table(["stage", "seconds"], stage_rows(results["stages_s"]))
    lines += ["", f"Peak memory (RSS) {results['peak_rss_gib']:.2f} GiB on {results['device']}. posenc "
              f"{results['versions']['posenc']}, torch {results['versions']['torch']}."]
    return "\n".join(lines) + "\n"


def write_all(results: dict, out: Path) -> None:
    # matplotlib is imported only when a report is written
    from ...figures.pretrained import curve_figure, loss_figure, retrieval_figure
    from ...figures.style import save_figure

    storage.write_json(out / "results.json", results)
    storage.write_text(out / "results.md", markdown(results))
    save_figure(loss_figure(results), out / "loss_by_position.png")
    save_figure(retrieval_figure(results), out / "retrieval.png")
    if results["finetune"]:
        save_figure(curve_figure(results), out / "finetune_curve.png")
    if results["best_row"]:
        storage.write_json(out / "rope_parameters.json", {
            "rope_parameters": results["best_rope_parameters"],
            "metadata": {"row": results["best_row"], "chosen_by": "lowest mean dev loss past the context",
                         "model": results["config"]["model"]}})
