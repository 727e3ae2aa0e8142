"""The rows of the extrapolation table: which encoding is trained, and how it is read at eval.

A row names a trained encoding and, optionally, how its kwargs change at evaluation
as a function of ``factor = eval length / train length``: the RoPE rows reuse the one
RoPE checkpoint zero-shot with each frequency scaling, ``learned+interpolate`` reuses
the learned checkpoint with its table resampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ...extension.methods import method_scaling


@dataclass(frozen=True)
class Row:
    name: str
    trains: str  # the encoding trained (one checkpoint per trained encoding and seed)
    train_kwargs: dict = field(default_factory=dict)
    eval_kwargs: Callable[[float, int], dict] = lambda factor, train_length: {}


def _rope_scaling(method: str) -> Callable[[float, int], dict]:
    return lambda factor, train_length: {"scaling": method_scaling(method, factor, train_length)}


ROWS: dict[str, Row] = {row.name: row for row in [
    Row("none", "none"),
    Row("sinusoidal", "sinusoidal"),
    Row("learned", "learned"),
    Row("learned+interpolate", "learned", eval_kwargs=lambda factor, train_length: {"beyond": "interpolate"}),
    Row("alibi", "alibi"),
    Row("rope", "rope"),
    Row("rope+pi", "rope", eval_kwargs=_rope_scaling("pi")),
    Row("rope+ntk", "rope", eval_kwargs=_rope_scaling("ntk")),
    Row("rope+dynamic", "rope", eval_kwargs=_rope_scaling("dynamic")),
    Row("rope+yarn", "rope", eval_kwargs=_rope_scaling("yarn")),
    Row("t5", "t5"),
    Row("shaw", "shaw"),
    Row("transformer_xl", "transformer_xl"),
]}

DEFAULT_ROWS = ("none", "sinusoidal", "learned", "learned+interpolate", "alibi",
                "rope", "rope+pi", "rope+ntk", "rope+dynamic", "rope+yarn")


def parse_rows(spec: str) -> list[Row]:
    """'all', 'default', or comma-separated row names -> rows, in table order."""
    if spec == "all":
        return list(ROWS.values())
    names = DEFAULT_ROWS if spec == "default" else [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in ROWS]
    if unknown or not names:
        raise ValueError(f"--encodings: unknown rows {unknown}; valid: all, default, {', '.join(ROWS)}")
    return [ROWS[name] for name in ROWS if name in names]
