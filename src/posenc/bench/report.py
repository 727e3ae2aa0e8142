"""Columns of each bench table, as a plain-text table for the terminal and Markdown for files."""

from __future__ import annotations


def _ratio(row: dict) -> str:
    if "ratio_low" not in row:
        return f"{row['ratio']:.2f}"
    return f"{row['ratio']:.2f} ({row['ratio_low']:.2f}–{row['ratio_high']:.2f})"


def _optional(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


# table name -> (title, [(column header, cell function)])
TABLES = {
    "attention": ("attention() time / eager", [
        ("encoding", lambda r: r["encoding"]), ("backend", lambda r: r["backend"]), ("T", lambda r: str(r["length"])),
        ("ms", lambda r: f"{r['ms']:.2f}"), ("time / eager (quartiles)", _ratio)]),
    "training": ("training-step time / NoPE", [
        ("encoding", lambda r: r["encoding"]), ("L", lambda r: str(r["length"])), ("B", lambda r: str(r["batch"])),
        ("compiled", lambda r: "yes" if r["compiled"] else "no"), ("backend", lambda r: r.get("backend", "auto")),
        ("form", lambda r: r.get("form", "—")),
        ("ms", lambda r: f"{r['ms']:.1f}"),
        ("time / NoPE (quartiles)", _ratio)]),
    "rope": ("RoPE apply on q and k / copy_ of the same bytes", [
        ("contender", lambda r: r["contender"]), ("shape", lambda r: "×".join(map(str, r["shape"]))),
        ("ms", lambda r: f"{r['ms']:.2f}"), ("time / copy_ (quartiles)", _ratio)]),
    "forms": ("score terms as a table in the kernel, a bias mask or q/k channels, attention forward+backward / NoPE "
              "causal", [
        ("encoding", lambda r: r["encoding"]), ("form", lambda r: r["form"]), ("T", lambda r: str(r["length"])),
        ("B", lambda r: str(r["batch"])), ("ms", lambda r: f"{r['ms']:.2f}"), ("time / NoPE (quartiles)", _ratio)]),
    "memory": ("training-step activation memory / NoPE", [
        ("encoding", lambda r: r["encoding"]), ("L", lambda r: str(r["length"])), ("B", lambda r: str(r["batch"])),
        ("backend", lambda r: r.get("backend", "auto")), ("MiB saved for backward", lambda r: f"{r['mib']:.1f}"), ("/ NoPE", lambda r: f"{r['ratio']:.3f}")]),
    "long": ("long-context attention forward+backward / SDPA without positions, each row in its own process", [
        ("encoding", lambda r: r["encoding"]), ("B", lambda r: str(r["B"])), ("H", lambda r: str(r["H"])),
        ("T", lambda r: str(r["T"])), ("Dh", lambda r: str(r["Dh"])),
        ("ms", lambda r: f"{r['ms']:.2f}" if "ms" in r else f"error: {r['error']}"),
        ("× SDPA", lambda r: _optional(r["x_sdpa_nope"], 2)), ("peak GiB", lambda r: _optional(r["peak_gib"], 2))]),
}


def _cells(table: str, rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, body) of ``table`` for ``rows``: the cells every rendering shares."""
    columns = TABLES[table][1]
    return [name for name, _ in columns], [[cell(row) for _, cell in columns] for row in rows]


def plain(table: str, rows: list[dict], machine: str = "") -> str:
    """The table for a terminal; ``machine`` (``machine.one_line``) printed under its title."""
    header, body = _cells(table, rows)
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]

    def aligned(cells: list[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()

    title = [TABLES[table][0]] + ([f"on {machine}"] if machine else [])
    lines = title + [aligned(header), aligned(["-" * width for width in widths])]
    return "\n".join(lines + [aligned(line) for line in body])


def markdown_lines(table: str, rows: list[dict]) -> list[str]:
    """The rows as the lines of a Markdown table (no title)."""
    header, body = _cells(table, rows)
    rule = "|" + " --- |" * len(header)
    return ["| " + " | ".join(header) + " |", rule] + ["| " + " | ".join(line) + " |" for line in body]


def markdown(table: str, rows: list[dict], machine: str = "") -> str:
    lines = [f"### {TABLES[table][0]}", ""] + ([f"On {machine}.", ""] if machine else [])
    return "\n".join(lines + markdown_lines(table, rows)) + "\n"
