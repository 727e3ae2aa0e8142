"""Which targets need the long context, and how much of it each row of ``pretrained`` uses (issue #54 item 4;
the idea of LongPPL, Fang et al. 2024: perplexity on the tokens that need long context).

Two readers score every target of a test document, both the unscaled model inside its context:
  - the long reader reads as much as the context holds: the whole prefix for a target inside the context (one
    prefill of the first ``original`` tokens), the context control's window past it (``original −
    control_stride + 1`` to ``original`` tokens);
  - the short reader reads only recent text: windows of ``short = original // SHORT_SHARE`` tokens that advance
    by ``short // 2``, so a target sees between ``short // 2 + 1`` and ``short`` tokens.
A target *needs the long context* where the long reader's loss is at least ``GAIN`` nats below the short
reader's and at most ``CEILING`` nats (LongPPL's two thresholds), among the scored targets at least ``short``
tokens in. Per row and document, over those targets, inside the context and past it: the row's mean loss, and the
share of the long reader's gain the row keeps, Σ(short − row) / Σ(short − long): 1 where the row predicts them as
the unscaled model reading its whole context does, 0 where no better than reading ``short`` tokens.

The targets are chosen by the long reader's own losses, so its share is 1 by construction and its loss on them is
biased low (regression to the mean): compare rows with each other, not with the long reader. Means over documents
with 95% t intervals; these numbers are descriptive, outside the run's family of comparisons.

Every reader's and row's per-target losses are a file under ``measurements/`` (``losses-<key>.safetensors``),
written beside the measurement's JSON, so the summary is made from files after every process has measured.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ... import storage
from ..documents import t_interval

SHORT_SHARE = 4  # the short reader reads a quarter of the context (2,048 of SmolLM2's 8,192 tokens)
GAIN = 2.0  # nats the long reader must gain over the short one
CEILING = 2.0  # nats the long reader's loss may be at most: a target it predicts, not one it is less lost on
SPANS = ("inside", "past")


def short_context(original: int) -> int:
    return original // SHORT_SHARE


def losses_path(out: Path, key: str) -> Path:
    return Path(out) / "measurements" / f"losses-{key}.safetensors"


def save_losses(out: Path, key: str, losses: torch.Tensor) -> None:
    """losses: (T − 1,) float32 next-token losses of one reader or row on one document."""
    storage.save_weights(losses_path(out, key), {"losses": losses.float()})


def load_losses(out: Path, key: str) -> torch.Tensor | None:
    """(T − 1,) float32, or None where the measurement was made before its losses were filed."""
    path = losses_path(out, key)
    return storage.load_weights(path)["losses"] if path.exists() else None


def needing_long_context(long: torch.Tensor, short: torch.Tensor, scored: torch.Tensor, original: int
                         ) -> torch.Tensor:
    """The targets that need the long context. long, short, scored: (T − 1,). Returns (T − 1,) bool."""
    far_enough = torch.arange(long.shape[0]) >= short_context(original)
    return scored & far_enough & (short - long >= GAIN) & (long <= CEILING)


def _span(length: int, original: int, span: str) -> torch.Tensor:
    """(length,) bool: the targets inside the context (index < original − 1) or past it."""
    inside = torch.arange(length) < original - 1
    return inside if span == "inside" else ~inside


def _mean_over(values: torch.Tensor, chosen: torch.Tensor) -> float | None:
    return values[chosen].double().mean().item() if chosen.any() else None


def document_use(row: torch.Tensor, long: torch.Tensor, short: torch.Tensor, needed: torch.Tensor, original: int
                 ) -> dict:
    """{span: {"loss", "kept"}} for one row on one document; None where the span has no target that needs the
    long context. All tensors (T − 1,)."""
    use = {}
    for span in SPANS:
        chosen = needed & _span(row.shape[0], original, span)
        gain = (short[chosen] - long[chosen]).double().sum().item()
        use[span] = {"loss": _mean_over(row, chosen),
                     "kept": (short[chosen] - row[chosen]).double().sum().item() / gain if chosen.any() else None}
    return use


def _cell(values: list) -> dict | None:
    """Mean and 95% t interval over the documents that have a value (None below two)."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return None
    low, high = t_interval(present)
    return {"mean": sum(present) / len(present), "low": low, "high": high, "documents": len(present)}


def summarise(out: Path, rows: list[str], scored: list[torch.Tensor], original: int, control_stride: int
              ) -> dict | None:
    """The run's context use from its files: the readers' settings, the targets per document and span, per row
    each span's loss and kept share over documents, and the short reader's loss (the floor). None where a
    reader's losses are missing (a run measured before they were filed); a row without its files is left out.
    scored: per test document, (T − 1,) bool."""
    readers = [(load_losses(out, f"control-test{i}"), load_losses(out, f"short-test{i}")) for i in range(len(scored))]
    if any(long is None or short is None for long, short in readers):
        return None
    needed = [needing_long_context(long, short, s, original) for (long, short), s in zip(readers, scored)]
    spans = [{span: n & _span(n.shape[0], original, span) for span in SPANS} for n in needed]
    summary = {"short": short_context(original), "short_stride": short_context(original) // 2,
               "long": {"inside": [1, original], "past": [original - control_stride + 1, original]},
               "gain": GAIN, "ceiling": CEILING,
               "targets": {span: [int(s[span].sum()) for s in spans] for span in SPANS}, "rows": {}}
    for name in rows:
        losses = [load_losses(out, f"{name}-test{i}") for i in range(len(scored))]
        if any(x is None for x in losses):
            continue
        per_document = [document_use(x, long, short, n, original)
                        for x, (long, short), n in zip(losses, readers, needed)]
        summary["rows"][name] = {span: {measure: _cell([d[span][measure] for d in per_document])
                                        for measure in ("loss", "kept")} for span in SPANS}
    summary["short reader"] = {span: {"loss": _cell([_mean_over(short, s[span]) for (_, short), s in
                                                     zip(readers, spans)])} for span in SPANS}
    return summary


def table_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """Per row: loss on the targets that need the long context, inside and past the context, and the share of the
    long reader's gain kept (mean [95% t] over documents); the short reader last, as the floor."""
    def cell(c: dict | None, signed: bool = False) -> str:
        if c is None:
            return "—"
        form = "+.2f" if signed else ".3f"
        return f"{c['mean']:{form}} [{c['low']:{form}}, {c['high']:{form}}]"

    header = ["row", "loss inside", "kept inside", "loss past", "kept past"]
    body = [[name, cell(use["inside"]["loss"]), cell(use["inside"]["kept"], True), cell(use["past"]["loss"]),
             cell(use["past"]["kept"], True)] for name, use in summary["rows"].items()]
    floor = summary["short reader"]
    body.append([f"short reader (≤ {summary['short']:,} tokens)", cell(floor["inside"]["loss"]), "+0.00",
                 cell(floor["past"]["loss"]), "+0.00"])
    return header, body


def description(summary: dict) -> str:
    targets = summary["targets"]
    return (f"Targets that need the long context: those the unscaled model reading its whole context predicts at "
            f"least {summary['gain']:g} nats better than reading only the last {summary['short']:,} tokens, and "
            f"with a loss of at most {summary['ceiling']:g} nats; {sum(targets['inside']):,} inside the context and "
            f"{sum(targets['past']):,} past it over {len(targets['past'])} test documents. \"Kept\": the share of "
            f"that gain a row keeps (1: as the unscaled model reading its whole context, 0: as reading "
            f"{summary['short']:,} tokens). The targets are chosen by the long reader's own losses, so compare rows "
            f"with each other, not with it; descriptive, outside the family of comparisons.")
