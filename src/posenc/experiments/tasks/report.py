"""Results of ``posenc task`` as a table (terminal and Markdown), a figure and files on disk."""

from __future__ import annotations

from pathlib import Path

from ... import storage
from ...lm.runtime import provenance_line
from ...figures.style import save_figure
from ...figures.tasks import task_figure
from .. import tables
from ..rate_grid import rates_label


def _lengths(results: dict) -> list[str]:
    """The length columns' headings: "2× (64)"."""
    return [f"{n // results['train_length']}× ({n})" for n in results["eval_lengths"]]


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    swept = bool(results["config"].get("lrs"))
    header = ["encoding"] + _lengths(results) + ["lr (dev)"] * swept + ["train s"]
    body = []
    for row in results["rows"]:
        cells = []
        for n in map(str, results["eval_lengths"]):
            cell = row["exact_match"][n]
            cells.append("N/A" if cell is None else tables.interval_cell(cell["mean"], [cell["low"], cell["high"]],
                                                                         cell["seed_std"]))
        rates = [rates_label(row["rate_sweeps"])] if swept else []
        body.append([row["name"]] + cells + rates + [f"{sum(row['train_seconds']) / len(row['train_seconds']):.0f}"])
    return header, body


def caption(results: dict) -> str:
    seeds = f"{results['seeds']} seed{'s' if results['seeds'] > 1 else ''}"
    unit = "sequences copied exactly" if results["task"] == "copy" else "answers right"
    return (f"Exact match on {results['task']} ({unit}), trained at {results['train_length']} tokens, "
            f"{results['config']['eval_sequences']} test sequences per length, {seeds}: mean [95% interval]")


def terminal_table(results: dict) -> str:
    return caption(results) + "\n" + tables.text_table(*table_rows(results))


def dev_rows(results: dict) -> tuple[list[str], list[list[str]]] | None:
    """Each row's mean exact match on the dev sequences (what choices read), or None for a run made before them."""
    if any(row.get("dev_exact_match") is None for row in results["rows"]):
        return None
    header = ["encoding"] + _lengths(results)
    return header, [[row["name"]] + ["N/A" if row["dev_exact_match"][str(n)] is None else
                                     f"{row['dev_exact_match'][str(n)]:.3f}" for n in results["eval_lengths"]]
                    for row in results["rows"]]


def seed_rows(results: dict) -> tuple[list[str], list[list[str]]] | None:
    """Each row's mean exact match per length in each seed, the seeds in order in one cell ("seeds k–m" in the
    header); None for a one-seed run. Where a row's seeds split, some learning the task and some not, its mean and
    spread describe no seed: this table shows which did."""
    if results["seeds"] < 2:
        return None
    first = results["config"]["seed"]
    header = [f"encoding (seeds {first}–{first + results['seeds'] - 1})"] + _lengths(results)
    return header, [[row["name"]] + ["N/A" if row["exact_match"][str(n)] is None else
                                     ", ".join(f"{v:.3f}" for v in row["exact_match"][str(n)]["per_seed"])
                                     for n in results["eval_lengths"]] for row in results["rows"]]


def rate_rows(results: dict) -> tuple[list[str], list[list[str]]] | None:
    """Each row's and seed's cross-entropy (nats) on the scored tokens of the dev sequences at the training length,
    at every rate it trained at (``tables.rate_rows``); None for a run without a rate grid."""
    if not results["config"].get("lrs"):
        return None
    return tables.rate_rows({row["name"]: row["rate_sweeps"] for row in results["rows"]}, results["config"]["seed"])


def write_all(results: dict, out: Path) -> None:
    dev, rates, seeds = dev_rows(results), rate_rows(results), seed_rows(results)
    lines = [f"# posenc task {results['task']}", "", caption(results), "",
             *tables.markdown_table(*table_rows(results)), "", "![exact match vs length](tasks.png)", "",
             *(["## Each seed (mean exact match; where seeds split, learning or not, the mean describes none of them)",
                "", *tables.markdown_table(*seeds), ""] if seeds else []),
             *(["## Learning rates, chosen on dev (cross-entropy of the scored tokens of dev sequences at the "
                "training length)", "", *tables.markdown_table(*rates), ""] if rates else []),
             *(["## Dev sequences (what budgets and presets are chosen on; never reported as results)", "",
                *tables.markdown_table(*dev), ""] if dev else []),
             f"{results['wall_time_s']:.0f} s. " + provenance_line(results["provenance"]), ""]
    storage.write_json(out / "results.json", results)
    storage.write_text(out / "results.md", "\n".join(lines))
    save_figure(task_figure(results), out / "tasks.png")
