"""What the commands' parsers share: comma-separated value types, checked as argparse reads them, and flags
generated from a config dataclass's fields."""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

from .. import storage


def comma_ints(text: str) -> tuple[int, ...]:
    """"1,2,4" -> (1, 2, 4)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def comma_positive_floats(text: str) -> tuple[float, ...]:
    """"1e-3,3e-3" -> (0.001, 0.003): at least one, each finite and > 0."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) <= 0 or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0, got {text!r}")
    return values


#: a config field's annotation -> how its flag reads the value (optional fields by their first type)
_FIELD_TYPES = {"int": int, "float": float, "str": str, "tuple[int, ...]": comma_ints,
                "tuple[float, ...]": comma_positive_floats, "tuple[str, ...]": str}


def add_config_flags(p: argparse.ArgumentParser, config_class, helps: dict[str, str],
                     spellings: dict[str, str] | None = None) -> None:
    """A flag per field of the dataclass ``config_class`` that ``helps`` describes, in its order: ``--field-name``
    (or ``spellings[field]``), read as the field's type (a tuple comma-separated; a tuple of strings stays the
    string the config parses; a bool is a switch), default None: the preset's value."""
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    for name, text in helps.items():
        annotation = fields[name].type  # a string under ``from __future__ import annotations``
        kind = (annotation.__name__ if isinstance(annotation, type) else str(annotation)).split(" | ")[0]
        if kind not in _FIELD_TYPES and kind != "bool":
            raise TypeError(f"{config_class.__name__}.{name}: no flag type for {kind!r}")
        flag = (spellings or {}).get(name, "--" + name.replace("_", "-"))
        if kind == "bool":  # a switch: given, True; left out, the preset's
            p.add_argument(flag, dest=name, action="store_true", default=None, help=text)
        else:
            p.add_argument(flag, dest=name, type=_FIELD_TYPES[kind], help=text)


def given(args: argparse.Namespace, helps: dict[str, str]) -> dict:
    """The config fields among ``helps`` whose flags were given."""
    return {name: getattr(args, name) for name in helps if getattr(args, name) is not None}


def add_run_folder(p: argparse.ArgumentParser, name: str, shown: str) -> None:
    """--out and --resume. ``name``: a new run's folder under runs/, a ``time.strftime`` pattern that may name the
    command's other arguments in braces ("{task}-%Y%m%d-%H%M%S"); ``shown``: how the help spells it."""
    p.add_argument("--out", type=Path, help=f"run directory (default: runs/{shown})")
    p.add_argument("--resume", action="store_true", help="continue the run in --out, skipping finished work")
    p.set_defaults(run_folder=name)


def run_folder(args: argparse.Namespace) -> Path:
    """--out, or runs/<the command's name for a new run> (with -2, -3, … when a run started in the same second
    holds that name), kept as ``args.folder`` (an interrupted run names it); --resume needs --out."""
    if args.resume and args.out is None:
        raise ValueError("--resume needs --out: the run directory to continue")
    if args.out is not None:
        args.folder = storage.check_folder("--out", args.out)
        return args.folder
    named = Path("runs") / time.strftime(args.run_folder.format_map(vars(args)), time.localtime())
    folder = next(p for p in (named, *(named.with_name(f"{named.name}-{n}") for n in range(2, 10 ** 6)))
                  if not p.exists())
    args.folder = storage.check_folder("--out", folder)
    return args.folder


def check_widenings(args: argparse.Namespace) -> None:
    """--lr-widenings only widens a grid that --lrs gives."""
    if args.lr_widenings is not None and args.lrs is None:
        raise ValueError("--lr-widenings widens a grid of --lrs; give --lrs too")
