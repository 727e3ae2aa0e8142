"""A run folder's pin, ``<out>/config.json``: what a command's first invocation writes, and what ``--resume`` reads
back to refuse a config that would change a finished result. Every command opens, reads and checks its pin here.

``open_pin`` opens a run folder for a first invocation or a resume, refusing a pin without --resume and --resume
without a pin; ``as_current`` (``read_pin``) reads a pin as the current version reads it; ``changed_fields`` names
the fields a resume would change and ``refuse_changes`` refuses them.

``WHEN_ABSENT`` is the one place the shims for old pins live: what a pin written before each field existed meant
by that field's absence. A reader of config.json goes through ``as_current``, never through ``.get`` with a default
of its own. Pins carry no version number: a field is only ever added to a pin, never given a new meaning under its
old name, so a field's absence dates a pin exactly where it matters. A version would be one more key for every
reader to strip (``ExperimentConfig.from_dict`` builds a dataclass from a pin), and nothing would read it. A
changed protocol gets a new field name (extend's ``finetune_lr`` became ``finetune_lrs``), and a resume names that
field when it refuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import storage

PIN = "config.json"

#: rate grids came after the first runs, which trained at --lr alone: no grid, so none widened and every seed swept
_BEFORE_RATE_GRIDS = {"lrs": [], "lr_widenings": 2, "lr_sweep_seeds": 0}

#: What a pin written before each field existed meant by that field's absence, one table for each dict that a pin
#: holds (a command's config.json, or a section of one); ``as_current`` reads a pin through its table.
WHEN_ABSENT: dict[str, dict[str, Any]] = {
    # extrapolate's config.json (ExperimentConfig.to_dict), and the "base" section of extend's pin (its training
    # fields, ExperimentConfig.training_dict, which leaves out a field at the value its absence means)
    # (a run pinned before --compare existed declared no comparisons)
    "extrapolate": {**_BEFORE_RATE_GRIDS, "compare": ""},
    "tasks": _BEFORE_RATE_GRIDS,  # posenc task's config.json (TaskConfig.to_dict)
    # the "extend" section of extend's pin: none. A pin written before one of its result fields existed ran under
    # another protocol (one fine-tuning rate, not a sweep chosen on dev) and is refused with that field named
    "extend": {},
    # the "hf" section of pretrained's pin (PretrainedConfig.to_dict): keys planted before wordings were calibrated
    # read "The secret word for ...". Any other field newer than the run reads as its default (``defaults``), since
    # that is what the run did
    "pretrained.hf": {"retrieval_format": "secret-word"},
    # pretrained's pin around it: pinned before corpora were (a resume takes this one's), before commits were
    # listed, or before families were declared (``declared_family`` says the family was not recorded)
    "pretrained": {"corpus": None, "commits": [], "first_rows": None},
}


def pin_kind(held: Mapping) -> str:
    """The command whose pin ``held`` is, by the section or field only its pin has: "extend" (its "extend"
    section), "pretrained" ("hf"), "task" ("task") or else "extrapolate"."""
    return next((kind for key, kind in (("extend", "extend"), ("hf", "pretrained"), ("task", "task")) if key in held),
                "extrapolate")


def read_run(folder: Path, kind: str, flag: str) -> dict:
    """The pin of the run ``flag`` names, as written: a ValueError naming the flag where ``folder`` holds no run or
    another command's."""
    pinned = folder / PIN
    if not pinned.is_file():
        raise ValueError(f"{flag} {folder}: not a posenc {kind} run (no config.json there)")
    held = storage.read_json(pinned)
    if pin_kind(held) != kind:
        raise ValueError(f"{flag} {folder}: a posenc {pin_kind(held)} run, not a posenc {kind} run")
    return held


def open_pin(out: Path, resume: bool, *, kind: str, start: str | None = None) -> dict | None:
    """The pin ``out`` holds, as written, on --resume; None on a first invocation. Refuses a pin without ``resume``,
    ``resume`` without a pin, and the pin of another command than ``kind`` ("extrapolate"); ``start`` is the command
    line that starts one."""
    pinned = out / PIN
    if pinned.exists() and not resume:
        raise ValueError(f"--out {out} already holds a run; pass --resume to continue it or choose another --out")
    if resume and not pinned.exists():
        how = f"; start one with: {start}" if start else ""
        raise ValueError(f"--resume: {out} holds no posenc {kind} run (no config.json there){how}")
    return read_run(out, kind, "--resume --out") if resume else None


def write_pin(out: Path, pin: dict) -> None:
    storage.write_json(out / PIN, pin)


def read_pin(out: Path, table: str) -> dict:
    """``out``'s pin as the current version reads it (``as_current``)."""
    return as_current(storage.read_json(out / PIN), table)


def as_current(held: Mapping, table: str, defaults: Mapping | None = None) -> dict:
    """``held``, a pin or a section of one, as the current version reads it. A field that the pin was written
    before reads as what its absence meant (``WHEN_ABSENT[table]``). If the table does not list the field, it reads
    as ``defaults`` has it."""
    return {**(defaults or {}), **WHEN_ABSENT[table], **held}


def changed_fields(current: Mapping, held: Mapping, table: str, fields: Iterable[str] | None = None,
                   defaults: Mapping | None = None) -> list[str]:
    """The ``fields`` (in their order; None: every field either holds, sorted) in which ``current`` and the pin's
    ``held`` differ, both read as current (``as_current``). A tuple and the list that JSON turns it into are equal."""
    now, was = (_as_written(as_current(values, table, defaults)) for values in (current, held))
    return [name for name in (sorted(now.keys() | was.keys()) if fields is None else fields)
            if now.get(name) != was.get(name)]


def refuse_changes(out: Path, changed: list[str], *, did: str = "run", may_change: str | None = None) -> None:
    """Refuse a resume that would change a finished result, naming the fields (``changed``) in which it differs;
    ``did`` says what the run did with its config ("trained"), ``may_change`` what a resume may change instead."""
    if changed:
        rest = f"; only {may_change} may change" if may_change else ""
        raise ValueError(f"--resume: {out} was {did} with a different config (differs in {changed}){rest}")


def _as_written(value: Any) -> Any:
    """``value`` as a pin gives it back: JSON writes tuples as lists."""
    if isinstance(value, Mapping):
        return {key: _as_written(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [_as_written(item) for item in value]
    return value
