"""The rows of the extrapolation table: which encoding is trained, and how it is read at eval.

A row names a trained encoding and, optionally, how its kwargs change at evaluation
as a function of ``factor = eval length / train length``: the RoPE rows reuse the one
RoPE checkpoint zero-shot with each frequency scaling, ``learned+interpolate`` reuses
the learned checkpoint with its table resampled, ``none+temperature`` the NoPE checkpoint
with Llama 4's query temperature (which is 1 inside the training length, as Llama 4's is
inside its 8,192-token chunks). A row with a ``layout`` trains a model whose layers mix schemes
(``lm.layouts``: local layers in a window or chunk, global ones); its eval kwargs change the global layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ... import checks
from ...encodings.registry import ENTRIES, one_axis
from ...extension.methods import method_scaling
from ...lm.layouts import LAYOUTS


@dataclass(frozen=True)
class Row:
    name: str
    trains: str  # the encoding (or layout) trained: one checkpoint per trained name and seed
    description: str
    train_kwargs: dict = field(default_factory=dict)
    eval_kwargs: Callable[[float, int], dict] = lambda factor, train_length: {}
    layout: str | None = None  # a name in lm.layouts.LAYOUTS: layers that mix schemes


def _temperature(factor: float, train_length: int) -> dict:
    """Llama 4's attention temperature with the training length as its floor: 1 inside it."""
    return {"temperature": {"kind": "llama4", "beta": 0.1, "floor": train_length}}


def _rope_scaling(method: str, fixed_factor: float | None = None, base: float = 10000.0
                  ) -> Callable[[float, int], dict]:
    """The scaling of ``method`` at each column's factor, or at ``fixed_factor`` whatever the column, of a RoPE of
    this ``base``."""
    return lambda factor, train_length: {"scaling": method_scaling(method, fixed_factor or factor, train_length,
                                                                   base=base)}


#: rows that read a trained encoding's checkpoint another way, listed after the row of that encoding
READ_ANOTHER_WAY: dict[str, list[Row]] = {
    "none": [
        Row("none+temperature", "none", "the NoPE checkpoint with Llama 4's attention temperature: queries scaled by "
            "1 + 0.1·log(1 + ⌊(p + 1)/L⌋), L the training length (1 inside it)",
            eval_kwargs=_temperature)],
    "learned": [
        Row("learned+interpolate", "learned", "the learned checkpoint, its table resampled to the eval length",
            eval_kwargs=lambda factor, train_length: {"beyond": "interpolate"})],
    "rope": [
        Row("rope+pi", "rope", "the RoPE checkpoint with position interpolation, factor = the column's",
            eval_kwargs=_rope_scaling("pi")),
        Row("rope+ntk", "rope", "the RoPE checkpoint with static NTK, factor = the column's",
            eval_kwargs=_rope_scaling("ntk")),
        Row("rope+dynamic", "rope", "the RoPE checkpoint with dynamic NTK, factor = the column's: base raised by "
            "(f² − f + 1)^(d/(d−2)) at length f·L, a larger NTK", eval_kwargs=_rope_scaling("dynamic")),
        Row("rope+dynamic1", "rope", "the RoPE checkpoint with dynamic NTK, factor 1: pure length-driven NTK, base "
            "raised by f^(d/(d−2)) at length f·L", eval_kwargs=_rope_scaling("dynamic", fixed_factor=1.0)),
        Row("rope+yarn", "rope", "the RoPE checkpoint with YaRN, factor = the column's",
            eval_kwargs=_rope_scaling("yarn"))],
}

#: rows whose layers mix schemes, each trained once, and the ways their global layers are read at longer lengths
LAYOUT_ROWS: list[Row] = [
    Row("irope", "irope", LAYOUTS["irope"].description, layout="irope"),
    Row("irope+temperature", "irope", "the iRoPE checkpoint with Llama 4's attention temperature in its global layers "
        "(1 inside the training length)", eval_kwargs=_temperature, layout="irope"),
    Row("swa+global", "swa+global", LAYOUTS["swa+global"].description, layout="swa+global"),
    Row("swa+global+yarn", "swa+global", "the swa+global checkpoint with YaRN in its global layers, factor = the "
        "column's", eval_kwargs=_rope_scaling("yarn", base=LAYOUTS["swa+global"].global_kwargs["base"]),
        layout="swa+global"),
    Row("rnope-swa", "rnope-swa", LAYOUTS["rnope-swa"].description, layout="rnope-swa"),
]


def all_rows() -> dict[str, Row]:
    """{name: row}: a row per encoding of the registry the tiny LM trains (read when called, so an encoding
    ``register``ed later has its row), each followed by the rows that read it another way, then the layouts'. An
    encoding registered under a layout's name is refused here: its row and the layout's would be one."""
    clash = sorted(set(one_axis()) & {row.trains for row in LAYOUT_ROWS})
    if clash:
        raise ValueError(f"encoding {clash[0]!r} has a layout's name (lm.layouts.LAYOUTS); register it as another")
    return {row.name: row for row in [
        *(row for name in one_axis() for row in [Row(name, name, ENTRIES[name].description),
                                                  *READ_ANOTHER_WAY.get(name, [])]),
        *LAYOUT_ROWS]}

DEFAULT_ROWS = ("none", "sinusoidal", "learned", "learned+interpolate", "alibi",
                "rope", "rope+pi", "rope+ntk", "rope+dynamic", "rope+dynamic1", "rope+yarn")


def parse_rows(spec: str) -> list[Row]:
    """'all', 'default', or comma-separated row names -> rows, in table order."""
    rows = all_rows()
    if spec == "all":
        return list(rows.values())
    names = DEFAULT_ROWS if spec == "default" else [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in rows]
    if unknown or not names:
        raise ValueError(f"--encodings: unknown rows {unknown}; valid: all, default, {', '.join(rows)}")
    checks.each_once("--encodings", names)
    return [rows[name] for name in rows if name in names]
