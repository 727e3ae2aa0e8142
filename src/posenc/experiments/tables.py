"""Plain-text and Markdown tables from a header and rows of strings, and the cells every report shares."""

from __future__ import annotations

from . import intervals
from .rate_grid import rate_key, rate_label


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


def interval_cell(mean: float | None, interval: list[float] | None, seed_std: float | None = None) -> str:
    """'2.253 [2.241, 2.266]' (95% interval), with '± s' when seeds vary; 'N/A' when undefined."""
    if mean is None:
        return "N/A"
    text = f"{mean:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"
    return text + (f" ± {seed_std:.3f}" if seed_std else "")


def difference_cell(difference: dict | None) -> str:
    """'+0.123 [+0.100, +0.140]', with the seeds' t interval ' (seeds [+0.020, +0.210])' where several seeds ran,
    marked '(noise)' unless the difference is supported (``intervals.supported``: both intervals exclude zero);
    'identical' when every window scores the same; '—' when undefined."""
    if difference is None:
        return "—"
    if difference["low"] == difference["high"] == difference["mean"] == 0:
        return "identical"
    text = f"{difference['mean']:+.3f} [{difference['low']:+.3f}, {difference['high']:+.3f}]"
    if "seed_low" in difference:
        text += f" (seeds [{difference['seed_low']:+.3f}, {difference['seed_high']:+.3f}])"
    return text + ("" if intervals.supported(difference) else " (noise)")


def rate_rows(sweeps: dict[str, list[dict]], first_seed: int) -> tuple[list[str], list[list[str]]]:
    """One line per trained name and seed that swept (numbered from ``first_seed``): its dev score at every rate any
    sweep scored, the kept rate's in bold, "—" where its grid did not reach a rate, and the kept rate
    (``rate_label``). ``sweeps``: {name: [one ``rate_grid.choose_rate`` selection per seed]}; a seed that inherited
    its rate (``rate_grid.inherit_rate``) has no line."""
    swept = {name: [(seed, sweep) for seed, sweep in enumerate(runs, first_seed) if "scores" in sweep]
             for name, runs in sweeps.items()}
    keys = sorted({key for runs in swept.values() for _, sweep in runs for key in sweep["scores"]}, key=float)
    body = []
    for name, runs in swept.items():
        for seed, sweep in runs:
            scores, kept = sweep["scores"], rate_key(sweep["lr"])
            body.append([name, str(seed)] + [
                "—" if key not in scores else f"**{scores[key]:.4f}**" if key == kept else f"{scores[key]:.4f}"
                for key in keys] + [rate_label(sweep["lr"], sweep["at_edge"])])
    return ["encoding", "seed"] + keys + ["kept"], body
