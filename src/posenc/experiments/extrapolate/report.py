"""Results of ``extrapolate`` as a table (terminal and Markdown) and files on disk."""

from __future__ import annotations

from pathlib import Path

from ... import storage
from .. import tables


def _cell(mean, std) -> str:
    if mean is None:
        return "N/A"
    return f"{mean:.3f}" if not std else f"{mean:.3f} ± {std:.3f}"


def table_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    train_length = results["train_length"]
    header = ["encoding"] + [f"{length // train_length}× ({length})" for length in results["eval_lengths"]]
    body = []
    for row in results["rows"]:
        cells = [_cell(row["bits_per_byte"][str(length)], row["bits_per_byte_std"][str(length)])
                 for length in results["eval_lengths"]]
        body.append([row["name"]] + cells)
    return header, body


def title(results: dict) -> str:
    seeds = results["config"]["seeds"]
    return (f"Bits per byte (lower is better), trained at {results['train_length']} bytes, "
            f"{results['protocol']}, {seeds} seed{'s' if seeds > 1 else ''}"
            f"{' (mean ± std)' if seeds > 1 else ''}")


def terminal_table(results: dict) -> str:
    return title(results) + "\n" + tables.text_table(*table_rows(results))


def markdown_table(results: dict) -> str:
    header, body = table_rows(results)
    corpus = results["corpus"]
    lines = [f"# {title(results)}", ""] + tables.markdown_table(header, body)
    lines += [
        "",
        f"Corpus: {corpus['source']} ({corpus['files']} files, sha256 `{corpus['sha256'][:16]}`, "
        f"split {corpus['split']}). Device: {results['device']}, {results['processes']} process(es), "
        f"training + evaluation {results['wall_time_s']:.0f}s. posenc {results['versions']['posenc']}, "
        f"torch {results['versions']['torch']}, Python {results['versions']['python']}.",
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
