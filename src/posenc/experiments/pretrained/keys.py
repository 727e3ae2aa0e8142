"""Keys planted in the documents of ``pretrained``: the haystacks every row is asked from, the unscaled model's
retrieval inside its context (the baseline every retrieval table shows), and the calibration that picks the
wording of the keys (``retrieval.FORMATS``) on the dev documents, before any row is measured."""

from __future__ import annotations

from pathlib import Path

import torch

from ...extension import retrieval
from ...extension.self_extend import use_attention
from . import report
from .config import PretrainedConfig
from .share import Share

CHOSEN_BY = (f"the first wording (in retrieval.CALIBRATION_ORDER) whose keys the unscaled model finds at "
             f"{retrieval.CALIBRATION_BAR:.0%} on the dev documents at half its context; if none does, the most keys")


def far_length(original: int) -> int:
    """The longest in-context haystack: the context less a sixteenth for the question and its answer (7,680 of
    8,192), so the farthest band's keys sit up to about 7.5k tokens before the question, inside the context."""
    return original - original // 16


def haystack(tokens, ids: torch.Tensor, length: int, config: PretrainedConfig, index: int,
             wording: str) -> retrieval.Haystack:
    """A document's first ``length`` tokens with ``bands × keys_per_band`` labelled keys planted in it, and the
    questions of ``--retrieval-tasks``, worded as the retrieval format ``wording`` (the same for every row: seeded by
    the document's index)."""
    return retrieval.make_haystack(tokens.encode, ids.tolist(), length, config.bands, config.keys_per_band,
                                  seed=config.seed * 1000 + index, format=wording,
                                  tasks=config.task_counts,
                                  task_size=config.task_size)


def in_context(model, tokens, key: str, ids: torch.Tensor, length: int, config, out: Path, index: int,
               wording: str, share: Share) -> list | None:
    """The unscaled model asked for keys planted in a document's first ``length`` tokens (inside its context),
    worded as ``wording``: the baseline every retrieval table shows, and on dev the calibration of the format."""
    def measure() -> list:
        planted = haystack(tokens, ids[:length], length, config, index, wording)
        return retrieval.retrieve(model, planted, tokens.encode, tokens.decode)

    return share.measured(out / "measurements" / f"in-context-{key}-{wording}.json", measure)


def calibrate(model, tokens, dev, formats: list[str], config, original: int, out: Path, runtime) -> dict:
    """{format: keys found by the unscaled model on every dev document at half its context (``report.keys_cell``)
    and the mean log-probability of the right word ("log_prob", which breaks ties)} for each retrieval format asked:
    ``formats`` in order, stopping after the first whose share of keys found reaches ``retrieval.CALIBRATION_BAR``.
    Under ``torchrun`` the ranks split each format's documents and every rank reads them all back before the next."""
    use_attention(model, "sdpa")  # the pristine, unscaled model: nothing is applied yet

    def ask(wording: str, share: Share) -> list:
        return [in_context(model, tokens, f"dev{i}", w["ids"], original // 2, config, out, i, wording, share)
                for i, w in enumerate(dev)]

    calibration = {}
    for wording in formats:
        if runtime.world_size > 1:
            ask(wording, Share(runtime.rank, runtime.world_size))
            runtime.barrier()
        records = report.of_task([k for document in ask(wording, Share()) for k in document])
        calibration[wording] = {**report.keys_cell(records, config.bands),
                                "log_prob": sum(r["log_prob"] for r in records) / len(records)}
        if calibration[wording]["accuracy"] >= retrieval.CALIBRATION_BAR:
            break
    return calibration


def best_format(calibration: dict) -> str:
    """The wording with the most keys found in ``calibrate``'s record; ties go to the higher mean log-probability
    of the right word, then to the first asked."""
    return max(calibration, key=lambda name: (calibration[name]["accuracy"], calibration[name]["log_prob"]))
