"""What a ``posenc pretrained`` run folder pins (``config.json``): the config, the corpus's fingerprint, every
commit that measured for it, and the rows its first invocation planned, which date its family of comparisons. A
resumed run must match them, except where it only adds rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import pinning
from .config import PretrainedConfig, plan_rows

def pin(out: Path, config: PretrainedConfig, resume: bool, corpus: dict | None = None,
         commit: str | None = None) -> list:
    """Pin the config, the corpus's fingerprint and the commits that measured in ``out``; a resumed run must match
    the config, except where it only adds rows: other ``methods``, or fine-tuned rows added to a zero-shot run
    (``--finetune`` where the pinned run had none), and must read the same corpus (a run pinned before corpora were
    pinned takes this one's). Every finished measurement is a function of its row, document and the pinned fields,
    so the files of the rows both runs share stay valid. Returns every commit that has measured for the run, in
    order (this one last). ``first_rows``, the rows the first invocation planned, dates the run's family
    (``declared_family``). What an older pin meant by a field it lacks is ``pinning.WHEN_ABSENT``'s to say."""
    current = {"hf": config.to_dict(), "corpus": corpus, "commits": [commit], "first_rows": list(plan_rows(config))}
    held = pinning.open_pin(out, resume, kind="pretrained",
                            start=f"posenc pretrained {config.model} --out {out}")
    if held is not None:
        held = pinning.as_current(held, "pretrained")
        if corpus is not None and held["corpus"] not in (None, corpus):
            raise ValueError(f"--resume: {out} was measured on another corpus ({_corpus_name(held['corpus'])}, "
                             f"not {_corpus_name(corpus)}); its measurements cannot be merged with this one's")
        current["commits"] = [c for c in held["commits"] if c != commit] + [commit]
        current["first_rows"] = held["first_rows"]
        defaults = {field.name: field.default for field in dataclasses.fields(PretrainedConfig)}
        previous = pinning.as_current(held["hf"], "pretrained.hf", defaults)  # a run pinned before --finetune: none
        adds_rows = {"methods", "preset"} | ({"finetune"} if previous["finetune"] == "none" else set())
        changed = pinning.changed_fields(current["hf"], previous, "pretrained.hf", sorted(current["hf"]), defaults)
        pinning.refuse_changes(out, [k for k in changed if k not in adds_rows])
    pinning.write_pin(out, current)
    return current["commits"]


def declared_family(out: Path, rows: dict) -> dict:
    """{"declared": when the comparisons of a run's ``rows`` were fixed, "exploratory"}: with its first invocation,
    or (exploratory) after rows were added on --resume to a run whose earlier rows' results were known."""
    first = pinning.read_pin(out, "pretrained")["first_rows"]
    if first is None:
        return {"declared": "not recorded (the run was pinned before families were)", "exploratory": False}
    added = [name for name in rows if name not in first]
    if not added:
        return {"declared": "before the run: extend --hf's fixed comparisons of the rows its first invocation planned",
                "exploratory": False}
    return {"declared": f"after results were seen: {', '.join(added)} joined on --resume a run whose earlier rows "
                        "had been measured", "exploratory": True}


def _corpus_name(fingerprint: dict) -> str:
    return f"{fingerprint.get('source', '?')}, sha256 {str(fingerprint.get('sha256', '?'))[:12]}"
