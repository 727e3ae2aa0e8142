"""Results of ``extrapolate`` as a table (terminal and Markdown) and files on disk."""

from __future__ import annotations

from pathlib import Path

from ... import storage
from ...lm.runtime import provenance_line
from .. import tables
from ..rate_grid import rates_label
from ..verdicts import tiny_lines


def _header(results: dict, first: str) -> list[str]:
    train_length = results["train_length"]
    return [first] + [f"{length // train_length}× ({length})" for length in results["eval_lengths"]]


def _swept(results: dict) -> bool:
    return bool(results["config"].get("lrs"))


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Each row's bits per byte with its 95% interval (and the spread over seeds); with a rate grid, the rate each
    seed kept."""
    body = [[row["name"]] + [tables.interval_cell(row["bits_per_byte"][str(n)], row["interval"][str(n)],
                                                  row["bits_per_byte_std"][str(n)]) for n in results["eval_lengths"]]
            + ([rates_label(row["rate_sweeps"])] if _swept(results) else [])
            for row in results["rows"]]
    return _header(results, "encoding") + ["lr (dev)"] * _swept(results), body


def rate_rows(results: dict) -> tuple[list[str], list[list[str]]] | None:
    """Dev bits per byte at the training length of each trained encoding and seed at every rate it trained at
    (``tables.rate_rows``); None for a run without a rate grid."""
    if not _swept(results):
        return None
    trained = {row["trained_encoding"]: row["rate_sweeps"] for row in results["rows"]}
    return tables.rate_rows(trained, results["config"]["seed"])


def change_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Each row's change from its own 1× score, paired over the same windows."""
    body = [[row["name"]] + [tables.difference_cell(row["change_from_1x"][str(n)]) for n in results["eval_lengths"][1:]]
            for row in results["rows"]]
    header = _header(results, "encoding")
    return [header[0]] + header[2:], body


def versus_best_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Each row minus the best row of its column, paired; the best row itself reads 'best'."""
    body = []
    for row in results["rows"]:
        cells = []
        for n in map(str, results["eval_lengths"]):
            versus = row["vs_best"][n]
            cells.append("best" if versus and versus["best"] == row["name"] else tables.difference_cell(versus))
        body.append([row["name"]] + cells)
    return _header(results, "encoding"), body


def title(results: dict) -> str:
    seeds, windows = results["config"]["seeds"], results["windows"]
    return (f"Bits per byte (lower is better), trained at {results['train_length']} bytes, {results['protocol']}, "
            f"{windows['count']} test windows of {windows['length']} bytes from {windows['files']} files, "
            f"{seeds} seed{'s' if seeds > 1 else ''}: mean [95% interval]{' ± std over seeds' if seeds > 1 else ''}")


def terminal_table(results: dict) -> str:
    return title(results) + "\n" + tables.text_table(*table_rows(results))


def overlap_line(overlap: dict | None) -> str:
    """What of the scored text also stands verbatim in train (``lm.leakage.train_overlap``); results made before it
    was measured say so."""
    if overlap is None:
        return "Train/test overlap: not measured by this run."
    worst = ", ".join(f"{name} {share:.0%}" for name, share in list(overlap["files"].items())[:3])
    return (f"Train/test overlap: {overlap['in_train']:.1%} of {overlap['probes']:,} {overlap['probe_bytes']}-byte "
            f"probes of the scored windows stand verbatim in train" + (f" (most in {worst})." if worst else "."))


def markdown_table(results: dict) -> str:
    corpus, windows = results["corpus"], results["windows"]
    lines = [f"# {title(results)}", ""] + tables.markdown_table(*table_rows(results))
    lines += ["", "## Change from the row's own 1× score (paired over the same windows)", ""]
    lines += tables.markdown_table(*change_rows(results))
    lines += ["", "## Difference to the best row of each column (paired; '(noise)': the interval covers 0)", ""]
    lines += tables.markdown_table(*versus_best_rows(results))
    rates = rate_rows(results)
    if rates:
        lines += ["", "## Learning rates, chosen on dev (bits per byte on dev windows at the training length)", ""]
        lines += tables.markdown_table(*rates)
    if "family" in results:
        lines += ["", "## Declared comparisons (paired over seeds, corrected together)", ""] + tiny_lines(results)
    lines += ["", "## Rows", ""] + [f"- `{row['name']}`: {row['description']}" for row in results["rows"]]
    lines += [
        "",
        f"Scored on the {windows['split']} split: {windows['count']} windows of {windows['length']} bytes "
        f"({windows['bytes']:,} bytes, a seeded sample stratified over {windows['files']} of its "
        f"{windows['split_files']} files, {windows['split_bytes']:,} bytes), the same windows for every row and "
        f"column; intervals: {windows['interval']}.",
        "",
        overlap_line(results.get("train_overlap")),
        "",
        f"Corpus: {corpus['source']} ({corpus['files']} files, sha256 `{corpus['sha256'][:16]}`, "
        f"split {corpus['split']}). Device: {results['device']}, {results['processes']} process(es), "
        f"training + evaluation {results['wall_time_s']:.0f}s. " + provenance_line(results["provenance"]),
        "",
        parameters_line(results),
        "",
        "N/A: the encoding has no value at that length (a learned table has no rows past its training length).",
    ]
    return "\n".join(lines) + "\n"


def parameters_line(results: dict) -> str:
    """'Parameters: N per model ... + the encodings' own tables', from the trained rows."""
    trained = {row["trained_encoding"]: row["parameters"] for row in results["rows"]}
    models = sorted({p["model"] for p in trained.values()})
    tables = ", ".join(f"{name} {p['encoding']:,}" for name, p in trained.items() if p["encoding"])
    return (f"Parameters: {' / '.join(f'{m:,}' for m in models)} per model, the same for every encoding, "
            f"plus the encoding's own tables ({tables or 'none here'}).")


def write_all(results: dict, out: Path) -> None:
    # matplotlib is imported only when a report is written
    from ...figures.extrapolate import extrapolation_figure, position_loss_figure
    from ...figures.style import save_figure

    storage.write_json(out / "results.json", results)
    storage.write_text(out / "results.md", markdown_table(results))
    save_figure(extrapolation_figure(results), out / "extrapolation.png")
    save_figure(position_loss_figure(results), out / "position_loss.png")
