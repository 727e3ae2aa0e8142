"""The rows of ``posenc pretrained`` that keep the model's trained RoPE and swap its attention: Self-Extend, ReRoPE,
STRING and dual chunk attention. Each ``Swap`` carries how it is installed and which flags apply to it alone, so
the plan, the flag checks and the stages ask the swap, never its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...extension.dual_chunk import default_sizes, use_dual_chunk
from ...extension.self_extend import use_self_extend
from ...extension.shifted import use_string


@dataclass(frozen=True)
class Sizes:
    """What the swaps read, fixed once per run: the model's context, Self-Extend's window and group (None:
    ReRoPE's plain window), STRING's shift and local window."""

    original: int
    window: int
    group: int | None
    shift: int | None
    local: int


@dataclass(frozen=True)
class Swap:
    name: str
    install: Callable[..., object]  # (model, Sizes) -> None: the model's attention swapped in place
    #: config fields that apply only where a row of this swap runs
    flags: tuple[str, ...] = ()
    #: the row's keys and targets read through a window of ``--self-extend-window`` near tokens
    windowed: bool = False


_GROUPING = ("self_extend_window", "self_extend_group")
SWAPS = (
    Swap("self-extend", lambda model, s: use_self_extend(model, s.window, s.group), _GROUPING, windowed=True),
    Swap("rerope", lambda model, s: use_self_extend(model, s.window, None), _GROUPING, windowed=True),
    Swap("string", lambda model, s: use_string(model, s.shift, s.local), ("string_shift", "string_local")),
    Swap("dca", lambda model, s: use_dual_chunk(model, *default_sizes(s.original))),
)
BY_NAME = {swap.name: swap for swap in SWAPS}


def owners(flag: str) -> tuple[str, ...]:
    """The swaps a flag (a config field) applies to."""
    return tuple(swap.name for swap in SWAPS if flag in swap.flags)
