"""Results of ``pretrained``: the collected dict, tables, figures and rope_parameters.json.

The unit is the document (``experiments.documents``). Per row: test means over documents (first tokens, inside the
context, past it) with a 95% t interval; keys found at ``--to`` with a Wilson interval, by depth band. Comparisons
are paired over the same test documents: loss past the context (a − b, negative: a is lower) and the share of keys
found per document (a − b, positive: a finds more). All of a run's comparisons form one family: each gets its raw
interval, the Bonferroni interval over the family and Holm's p; its sentence follows ``verdicts``' rule. The exported row is the lowest mean dev loss past the context among the rows that change
the model's rotary scaling.
"""

from __future__ import annotations

import json
from pathlib import Path

from ... import storage
from ...lm.runtime import provenance_line
from ..documents import correct, paired, t_interval, wilson
from ..tables import markdown_table, stage_rows, text_table
from ..verdicts import exploratory, family_line, sentences
from . import context_use

MEASURES = ("first", "inside", "past")
CONTROL = "context control"
FAR = "none in context"  # the unscaled model's farthest keys inside its context (keys.far_length)


def exportable(row: dict) -> bool:
    """A row that is a model plus rope_parameters (what export writes): plain attention, a scaling."""
    return row["attention"] == "sdpa" and row["method"] != "none"


def accuracy(records: list[dict]) -> float:
    return sum(r["correct"] for r in records) / len(records)


def of_task(records: list[dict], task: str = "multi-key") -> list[dict]:
    """The records of one retrieval task (records of runs before tasks existed are all multi-key)."""
    return [r for r in records if r.get("task", "multi-key") == task]


def task_cells(records: list[dict], tasks, bands: int) -> dict:
    """{task: ``keys_cell`` of its questions (a question's band: its first sentence's), with "words": the share of
    the listed words found} for each of ``tasks``."""
    cells = {}
    for task in tasks:
        asked = of_task(records, task)
        cells[task] = {**keys_cell(asked, bands),
                       "words": sum(r["words_found"] for r in asked) / sum(len(r["answers"]) for r in asked)}
    return cells


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


def farthest_band(records: list[dict]) -> float:
    """The share of a document's multi-key questions in band 0 (the start of the document) answered."""
    return accuracy([r for r in of_task(records) if r["band"] == 0])


def comparisons(rows: dict, control: dict, files: list[str], finetune_method: str, tasks=(), far=None) -> dict:
    """Every paired comparison of a run, corrected together: {"loss past: a − b" | "keys found: a − b" |
    "<task> found: a − b" (for each of ``tasks``, the same pairs as the keys) | "farthest keys: a − none in
    context" (each row but the unscaled one: its farthest band's share per document against the unscaled model's
    farthest band inside its context, ``far``: per test document its records; runs before it have none): ...}."""
    past = {name: [d["past"] for d in row["test"]] for name, row in rows.items()}
    past[CONTROL] = [d["past"] for d in control["test"]]
    found = {name: [accuracy(of_task(d["retrieval"])) for d in row["test"]] for name, row in rows.items()}
    pose, ctrl = f"{finetune_method}+pose", f"{finetune_method}+control"
    loss_pairs = [(name, CONTROL) for name in rows] + [
        (a, b) for a, b in [(pose, finetune_method), (pose, ctrl), ("self-extend", finetune_method),
                            ("string", finetune_method), ("dca", finetune_method)] if a in past and b in past]
    key_pairs = [(a, b) for a, b in [(finetune_method, "none"), ("self-extend", "none"),
                                     ("self-extend", finetune_method), (pose, ctrl), ("string", "none"),
                                     ("dca", "none")]
                 if a in found and b in found]
    family = {f"loss past: {a} − {b}": paired(past[a], past[b], files) for a, b in loss_pairs}
    family.update({f"keys found: {a} − {b}": paired(found[a], found[b], files) for a, b in key_pairs})
    for task in tasks:
        right = {name: [accuracy(of_task(d["retrieval"], task)) for d in row["test"]] for name, row in rows.items()}
        family.update({f"{task} found: {a} − {b}": paired(right[a], right[b], files) for a, b in key_pairs})
    if far is not None:
        inside = [farthest_band(records) for records in far]
        family.update({f"farthest keys: {name} − {FAR}": paired([farthest_band(d["retrieval"]) for d in row["test"]],
                                                                 inside, files)
                       for name, row in rows.items() if name != "none"})
    return correct(family)


def collect(config, model, original, factor, group, corpus, test, dev, measured, control, in_context, tuned, stages
            ) -> dict:
    """The results dict; ``corpus``: the fingerprint of the corpus the documents came from; ``in_context``: per
    split its records, and where measured "far_length" and "test_far" (the farthest keys inside the context)."""
    files, far = [w["file"] for w in test], in_context.get("test_far")
    rows = {}
    for name, row in measured.items():
        records = [k for d in row["test"] for k in d["retrieval"]]
        rows[name] = {**row, **{key: mean_cell([d[key] for d in row["test"]]) for key in MEASURES},
                      "dev_past": sum(d["past"] for d in row["dev"]) / len(row["dev"]) if row["dev"] else None,
                      "keys": keys_cell(of_task(records), config.bands),
                      "tasks": task_cells(records, config.retrieval_tasks, config.bands)}
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
                       **{f"{split}_keys": keys_cell(of_task([k for d in in_context[split] for k in d]), config.bands)
                          for split in ("test", "dev")},
                       "test_tasks": task_cells([k for d in in_context["test"] for k in d], config.retrieval_tasks,
                                                 config.bands),
                       **({"test_far_keys": keys_cell(of_task([k for d in far for k in d]), config.bands)} if far
                          else {})},
        "comparisons": comparisons(rows, control, files, config.finetune_method, config.retrieval_tasks, far),
        "finetune": tuned,
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


def _p(value: float) -> str:
    return f"{value:#.2g}"


def row_label(name: str, row: dict, results: dict) -> str:
    """A fine-tuned row spelled out for readers: "yarn + PoSE (24 steps)"; any other row by its name."""
    steps = results["config"]["finetune_steps"]
    return {"pose": f"{row['method']} + PoSE ({steps} steps)",
            "control": f"{row['method']} + control (same tokens, plain ids)",
            "full": f"{row['method']} + full-length fine-tune ({steps} steps)"}.get(row["finetune"], name)


def main_rows(results: dict, compact: bool = False) -> tuple[list[str], list[list[str]]]:
    """Per row: loss over the first tokens, inside and past the context (mean [95% t]), past the context minus the
    context control (raw and corrected interval, Holm p), keys found at --to, the dev loss that chose the export;
    then the control and the in-context retrieval baseline. ``compact`` (the README's) drops inside and dev and
    spells fine-tuned rows out."""
    context, to = results["original_context"], results["config"]["to"]
    m = len(results["comparisons"])
    header = ["row", f"first {results['config']['first_tokens']:,}", f"inside {context:,}", f"past {context:,}",
              f"− {CONTROL} [raw 95%]", f"corrected (m = {m}{', exploratory' if exploratory(results) else ''})", "Holm p", f"keys found @ {to:,} [95%]", "dev past"]
    body = []
    for name, row in results["rows"].items():
        c = results["comparisons"].get(f"loss past: {name} − {CONTROL}")
        versus = [f"{c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]",
                  f"[{c['corrected'][0]:+.3f}, {c['corrected'][1]:+.3f}]", _p(c["p_holm"])] if c else ["—"] * 3
        body.append([row_label(name, row, results) if compact else name, *(_interval(row[key]) for key in MEASURES),
                     *versus, _keys(row["keys"]), "—" if row["dev_past"] is None else f"{row['dev_past']:.3f}"])
    first, last = results["control"]["context"]
    body.append([f"{CONTROL} (re-reading: {first:,}–{last:,} tokens)", "—", "—", _interval(results["control"]["past"]),
                 "—", "—", "—", "—", "—"])
    length = results["in_context"]["length"]
    body.append([f"none, keys in the first {length:,} tokens (in context)", *["—"] * 6,
                 _keys(results["in_context"]["test_keys"]), "—"])
    if compact:
        keep = [0, 1, 3, 4, 5, 6, 7]
        header, body = [header[k] for k in keep], [[line[k] for k in keep] for line in body]
    return header, body


def comparison_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Every paired comparison of the run: raw and corrected interval, sign-flip and Holm p, verdict."""
    body = [[name, f"{c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]",
             f"[{c['corrected'][0]:+.3f}, {c['corrected'][1]:+.3f}]", _p(c["p"]), _p(c["p_holm"]),
             "yes" if c["verdict"] else "no"] for name, c in results["comparisons"].items()]
    corrected = "corrected (exploratory)" if exploratory(results) else "corrected"
    return ["comparison (a − b)", "raw 95%", corrected, "sign-flip p", "Holm p", "verdict"], body


def band_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Keys found per depth band, each with the mean log-probability of the right word; the in-context baseline
    on test and on dev (where the format was calibrated) last."""
    bands = results["config"]["bands"]
    header = ["row"] + [f"band {b + 1}" + (" (farthest)" if b == 0 else " (nearest)" if b == bands - 1 else "")
                        for b in range(bands)]
    ctx = results["in_context"]
    keyed = [(name, row["keys"]) for name, row in results["rows"].items()] + [
        (f"none, in context (first {ctx['length']:,})", ctx["test_keys"]),
        *([(f"none, in context (first {ctx['far_length']:,})", ctx["test_far_keys"])] if "far_length" in ctx else []),
        ("none, in context, dev (calibration)", ctx["dev_keys"])]
    body = [[name] + ["—" if acc is None else f"{acc:.0%} ({lp:.1f})"
                      for acc, lp in zip(keys["by_band"], keys["log_prob_by_band"])] for name, keys in keyed]
    return header, body


def task_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Per row, each RULER task asked beside the keys: questions answered exactly [Wilson 95%], and the share of
    the listed words found; the unscaled model inside its context last."""
    tasks, size = results["config"]["retrieval_tasks"], results["config"]["task_size"]
    header = ["row"] + [f"{task} (lists of {size}) @ {results['config']['to']:,} [95%]" for task in tasks]
    ctx = results["in_context"]
    cells = [(name, row["tasks"]) for name, row in results["rows"].items()] + [
        (f"none, in context (first {ctx['length']:,})", ctx["test_tasks"])]
    return header, [[name] + [f"{_keys(cell[task])}; words {cell[task]['words']:.0%}" for task in tasks]
                    for name, cell in cells]


def title(results: dict) -> str:
    control = results["control"]
    return (f"{results['config']['model']} ({results['model_type']}, context {results['original_context']:,}) at "
            f"{results['config']['to']:,} tokens (factor {results['factor']:g}) on {len(results['documents']['test'])}"
            f" test documents ({results['corpus']['source']}): loss in nats, mean [95% t interval over documents]; "
            f"the {CONTROL} is the unscaled model re-reading, each target seeing {control['context'][0]:,}–"
            f"{control['context'][1]:,} tokens")


def in_context_line(results: dict) -> str:
    ctx = results["in_context"]
    line = (f"In-context retrieval (the unscaled model, keys planted in the first {ctx['length']:,} tokens): test "
            f"{_keys(ctx['test_keys'])}, dev (calibration) {_keys(ctx['dev_keys'])}.")
    if "far_length" in ctx:
        line += (f" In the first {ctx['far_length']:,} tokens (the far bands' counterpart): test "
                 f"{_keys(ctx['test_far_keys'])}, farthest band {ctx['test_far_keys']['by_band'][0]:.0%}.")
    calibration = results.get("calibration")  # runs before retrieval formats had one format only
    if calibration:
        asked = ", ".join(f"{name} {_keys(cell)}" for name, cell in calibration["formats"].items())
        line += (f" Keys worded as {results['retrieval_format']!r}, chosen by {calibration['chosen_by']} "
                 f"({asked}).")
    return line


def calibration_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Each retrieval format: keys the unscaled model found on dev at half its context, per depth band, and the
    mean log-probability of the right word (nats; it breaks ties)."""
    calibration = results["calibration"]
    bands = results["config"]["bands"]
    header = (["format", f"keys found on dev @ {calibration['length']:,} [95%]"]
              + [f"band {b + 1}" for b in range(bands)] + ["log-prob"])
    body = [[name + (" (chosen)" if name == results["retrieval_format"] else ""), _keys(cell)]
            + ["—" if acc is None else f"{acc:.0%}" for acc in cell["by_band"]] + [f"{cell['log_prob']:.2f}"]
            for name, cell in calibration["formats"].items()]
    return header, body


def terminal_table(results: dict) -> str:
    differences = [[name, _difference(c)] for name, c in results["comparisons"].items()]
    parts = [title(results), text_table(*main_rows(results)), in_context_line(results),
             text_table(["paired difference over test documents", "a − b"], differences)]
    if results.get("context_use"):
        parts += [text_table(*context_use.table_rows(results["context_use"]))]
    return "\n\n".join(parts)


def markdown(results: dict) -> str:
    lines = [f"# {title(results)}", ""] + markdown_table(*main_rows(results)) + ["", in_context_line(results)]
    m = len(results["comparisons"])
    lines += ["", f"## Paired differences over the same test documents ({m} comparisons, corrected together)", "",
              "Raw: 95% paired t interval; corrected: Bonferroni at 1 − 0.05/m; Holm p: of the exact sign-flip "
              "test.", ""]
    lines += markdown_table(*comparison_rows(results)) + [""] + sentences(results["comparisons"], "document")
    lines += ["", family_line(results)]
    lines += ["", "## Keys found by depth band (band 1: the start of the document, farthest from the question); in "
              "brackets the mean log-probability of the right word", ""] + markdown_table(*band_rows(results))
    if results.get("context_use"):
        lines += ["", "## Context use: loss on the targets that need the long context (mean [95% t] over documents)",
                  "", context_use.description(results["context_use"]), ""]
        lines += markdown_table(*context_use.table_rows(results["context_use"]))
    if results["config"].get("retrieval_tasks"):
        lines += ["", "## RULER's multi-value and variable-tracking questions, planted beside the keys (exact "
                  "lists, any order)", ""] + markdown_table(*task_rows(results))
    if results.get("calibration"):
        lines += ["", f"## Retrieval formats, calibrated on dev ({results['calibration']['chosen_by']})", ""]
        lines += markdown_table(*calibration_rows(results))
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
