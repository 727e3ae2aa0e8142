"""Results of ``extend --hf``: the collected dict, tables, figures and rope_parameters.json.

The unit is the document (``experiments.documents``). Per row: test means over documents (first tokens, inside the
context, past it) with a 95% t interval; keys found at ``--to`` with a Wilson interval, by depth band. Comparisons
are paired over the same test documents: loss past the context (a − b, negative: a is lower) and the share of keys
found per document (a − b, positive: a finds more). All of a run's comparisons form one family: each gets its raw
interval, the Bonferroni interval over the family and Holm's p; a verdict is written only where the corrected
interval excludes zero and Holm's p is below 0.05. The exported row is the lowest mean dev loss past the context among the rows that change
the model's rotary scaling.
"""

from __future__ import annotations

import json
from pathlib import Path

from ... import storage
from ...lm.runtime import provenance_line
from ..documents import correct, paired, t_interval, wilson
from ..tables import markdown_table, stage_rows, text_table

MEASURES = ("first", "inside", "past")
CONTROL = "context control"


def exportable(row: dict) -> bool:
    """A row that is a model plus rope_parameters (what export writes): plain attention, a scaling."""
    return row["attention"] == "sdpa" and row["method"] != "none"


def accuracy(records: list[dict]) -> float:
    return sum(r["correct"] for r in records) / len(records)


def mean_cell(values: list[float]) -> dict:
    """{"mean", "low", "high"}: the mean over documents and its 95% t interval."""
    low, high = t_interval(values)
    return {"mean": sum(values) / len(values), "low": low, "high": high}


def keys_cell(records: list[dict], bands: int) -> dict:
    """Keys found over every question of a row: count, total, Wilson interval, and the share per depth band."""
    found = sum(r["correct"] for r in records)
    low, high = wilson(found, len(records))
    per_band = [[r for r in records if r["band"] == b] for b in range(bands)]
    return {"found": found, "total": len(records), "accuracy": found / len(records), "low": low, "high": high,
            "by_band": [accuracy(band) if band else None for band in per_band],
            "log_prob_by_band": [sum(r["log_prob"] for r in band) / len(band) if band else None for band in per_band]}


def comparisons(rows: dict, control: dict, files: list[str], finetune_method: str) -> dict:
    """Every paired comparison of a run, corrected together: {"loss past: a − b" | "keys found: a − b": ...}."""
    past = {name: [d["past"] for d in row["test"]] for name, row in rows.items()}
    past[CONTROL] = [d["past"] for d in control["test"]]
    found = {name: [accuracy(d["retrieval"]) for d in row["test"]] for name, row in rows.items()}
    pose, ctrl = f"{finetune_method}+pose", f"{finetune_method}+control"
    loss_pairs = [(name, CONTROL) for name in rows] + [
        (a, b) for a, b in [(pose, finetune_method), (pose, ctrl), ("self-extend", finetune_method)]
        if a in past and b in past]
    key_pairs = [(a, b) for a, b in [(finetune_method, "none"), ("self-extend", "none"),
                                     ("self-extend", finetune_method), (pose, ctrl)] if a in found and b in found]
    family = {f"loss past: {a} − {b}": paired(past[a], past[b], files) for a, b in loss_pairs}
    family.update({f"keys found: {a} − {b}": paired(found[a], found[b], files) for a, b in key_pairs})
    return correct(family)


def collect(config, model, original, factor, group, corpus, test, dev, measured, control, in_context, tuned, stages
            ) -> dict:
    """The results dict; ``corpus``: the fingerprint of the corpus the documents came from."""
    files = [w["file"] for w in test]
    rows = {}
    for name, row in measured.items():
        records = [k for d in row["test"] for k in d["retrieval"]]
        rows[name] = {**row, **{key: mean_cell([d[key] for d in row["test"]]) for key in MEASURES},
                      "dev_past": sum(d["past"] for d in row["dev"]) / len(row["dev"]) if row["dev"] else None,
                      "keys": keys_cell(records, config.bands)}
    choices = {n: r["dev_past"] for n, r in rows.items() if exportable(r)}
    best = min(choices, key=choices.get) if len(choices) > 1 else next(iter(choices), None)
    chosen_by = (f"lowest mean dev loss past the context over {len(dev)} dev documents" if len(choices) > 1
                 else "the only row that can be exported")
    return {
        "config": config.to_dict(), "model_type": model.config.model_type, "original_context": original,
        "factor": factor, "self_extend_group": group, "corpus": corpus,
        "documents": {split: [w["file"] for w in windows] for split, windows in (("test", test), ("dev", dev))},
        "rows": rows, "control": {**control, "past": mean_cell([d["past"] for d in control["test"]]),
                                  "stride": config.control_stride,
                                  "context": [original - config.control_stride + 1, original]},
        "in_context": {"length": original // 2, **in_context,
                       **{f"{split}_keys": keys_cell([k for d in in_context[split] for k in d], config.bands)
                          for split in ("test", "dev")}},
        "comparisons": comparisons(rows, control, files, config.finetune_method), "finetune": tuned,
        "best_row": best, "chosen_by": chosen_by,
        "best_rope_parameters": rows[best]["rope_parameters"] if best else None,
        "stages_s": stages, "wall_time_s": sum(stages.values()),
    }


def _interval(cell: dict, digits: int = 3) -> str:
    return f"{cell['mean']:.{digits}f} [{cell['low']:.{digits}f}, {cell['high']:.{digits}f}]"


def _keys(cell: dict) -> str:
    return f"{cell['found']}/{cell['total']} [{cell['low']:.0%}, {cell['high']:.0%}]"


def _difference(c: dict) -> str:
    return (f"{c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]; corrected [{c['corrected'][0]:+.3f}, "
            f"{c['corrected'][1]:+.3f}], Holm p {c['p_holm']:.3g}")


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    context, to = results["original_context"], results["config"]["to"]
    header = ["row", f"first {results['config']['first_tokens']:,}", f"inside {context:,}", f"past {context:,}",
              f"− {CONTROL} (raw 95%)", f"keys found @ {to:,} [95%]", "dev past"]
    body = []
    for name, row in results["rows"].items():
        versus = results["comparisons"].get(f"loss past: {name} − {CONTROL}")
        body.append([name, *(_interval(row[key]) for key in MEASURES),
                     f"{versus['mean']:+.3f} [{versus['low']:+.3f}, {versus['high']:+.3f}]" if versus else "—",
                     _keys(row["keys"]), "—" if row["dev_past"] is None else f"{row['dev_past']:.3f}"])
    body.append([CONTROL, "—", "—", _interval(results["control"]["past"]), "—", "—", "—"])
    return header, body


def title(results: dict) -> str:
    control = results["control"]
    return (f"{results['config']['model']} ({results['model_type']}, context {results['original_context']:,}) at "
            f"{results['config']['to']:,} tokens (factor {results['factor']:g}) on {len(results['documents']['test'])}"
            f" test documents ({results['corpus']['source']}): loss in nats, mean [95% t interval over documents]; "
            f"the {CONTROL} is the unscaled model re-reading, each target seeing {control['context'][0]:,}–"
            f"{control['context'][1]:,} tokens")


def in_context_line(results: dict) -> str:
    ctx = results["in_context"]
    return (f"In-context retrieval (the unscaled model, keys planted in the first {ctx['length']:,} tokens): test "
            f"{_keys(ctx['test_keys'])}, dev (calibration) {_keys(ctx['dev_keys'])}.")


def terminal_table(results: dict) -> str:
    differences = [[name, _difference(c)] for name, c in results["comparisons"].items()]
    return "\n\n".join([title(results), text_table(*table_rows(results)), in_context_line(results),
                         text_table(["paired difference over test documents", "a − b"], differences)])


def verdicts(results: dict) -> list[str]:
    """One line per comparison; a verdict only where the corrected interval excludes zero and Holm's p < 0.05."""
    lines = []
    for name, c in results["comparisons"].items():
        a = name.split(": ", 1)[1].split(" − ")[0]
        if not c["verdict"]:
            lines.append(f"- {name}: {_difference(c)} — no verdict (the corrected interval covers zero or Holm's p "
                         "is not below 0.05).")
        elif name.startswith("loss"):
            lines.append(f"- {name}: {_difference(c)} — {a} is {'lower (better)' if c['mean'] < 0 else 'higher (worse)'}.")
        else:
            lines.append(f"- {name}: {_difference(c)} — {a} finds {'more' if c['mean'] > 0 else 'fewer'} keys.")
    return lines


def markdown(results: dict) -> str:
    config = results["config"]
    lines = [f"# {title(results)}", ""] + markdown_table(*table_rows(results)) + ["", in_context_line(results)]
    m = len(results["comparisons"])
    lines += ["", f"## Paired differences over the same test documents ({m} comparisons, corrected together)", "",
              "Raw: 95% paired t interval; corrected: Bonferroni at 1 − 0.05/m; Holm p: of the exact sign-flip "
              "test. A verdict needs both the corrected interval to exclude zero and Holm's p < 0.05.", ""] + verdicts(results)
    lines += ["", "## Keys found by depth band (band 1: the start of the document, farthest from the question)", ""]
    bands = [f"band {b + 1}/{config['bands']}" for b in range(config["bands"])]
    body = [[name] + [f"{acc:.0%} ({lp:.1f})" for acc, lp in zip(row["keys"]["by_band"], row["keys"]["log_prob_by_band"])]
            for name, row in results["rows"].items()]
    lines += markdown_table(["row (mean log-prob of the right word)"] + bands, body)
    if results["best_row"]:
        lines += ["", f"Best row on dev ({results['chosen_by']}): **{results['best_row']}**; its "
                  "`rope_parameters` (rope_parameters.json):", "", "```json",
                  json.dumps(results["best_rope_parameters"], indent=2), "```"]
    lines += ["", f"Test documents: {', '.join(results['documents']['test'])}.",
              f"Dev documents: {', '.join(results['documents']['dev'])}.",
              f"Corpus sha256 {results['corpus']['sha256']}.", "",
              "## Wall time per stage", ""] + markdown_table(["stage", "seconds"], stage_rows(results["stages_s"]))
    lines += ["", f"Peak memory (RSS) {results['peak_rss_gib']:.2f} GiB on {results['device']}. " + provenance_line(results["provenance"])]
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
            "metadata": {"row": results["best_row"], "chosen_by": results["chosen_by"],
                         "model": results["config"]["model"]}})
