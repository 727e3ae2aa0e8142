"""Plain-text and Markdown tables from a header and rows of strings, shared by every report."""

from __future__ import annotations


def text_table(header: list[str], body: list[list[str]]) -> str:
    """Columns padded to their widest cell, a dashed rule under the header."""
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in body]
    return "\n".join(lines)


def markdown_table(header: list[str], body: list[list[str]], text_columns: int = 1) -> list[str]:
    """Lines of a Markdown table; the first ``text_columns`` left-aligned, the rest (numbers) right-aligned."""
    rule = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    return (["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
            + ["| " + " | ".join(line) + " |" for line in body])


def stage_rows(stages: dict[str, float]) -> list[list[str]]:
    """[stage, seconds] rows for a wall-time table."""
    return [[stage, f"{seconds:.1f}"] for stage, seconds in stages.items()]
