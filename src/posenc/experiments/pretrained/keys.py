"""Keys planted in the documents of ``extend --hf``: the haystacks every row is asked from, the unscaled model's
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

CHOSEN_BY = "most keys found by the unscaled model on the dev documents at half its context"


def haystack(tokens, ids: torch.Tensor, length: int, config: PretrainedConfig, index: int,
             wording: str) -> retrieval.Haystack:
    """A document's first ``length`` tokens with ``bands × keys_per_band`` labelled keys planted in it, worded as
    the retrieval format ``wording`` (the same for every row: seeded by the document's index)."""
    return retrieval.make_haystack(tokens.encode, ids.tolist(), length, config.bands, config.keys_per_band,
                                  seed=config.seed * 1000 + index, format=wording)


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
    and the mean log-probability of the right word ("log_prob", which breaks ties)} for each retrieval format: what
    the run chooses its format by. Under ``torchrun`` the ranks split the documents and every rank reads them all
    back."""
    use_attention(model, "sdpa")  # the pristine, unscaled model: nothing is applied yet

    def ask_all(share: Share) -> dict:
        return {wording: [in_context(model, tokens, f"dev{i}", w["ids"], original // 2, config, out, i, wording,
                                     share) for i, w in enumerate(dev)] for wording in formats}

    if runtime.world_size > 1:
        ask_all(Share(runtime.rank, runtime.world_size))
        runtime.barrier()
    calibration = {}
    for wording, documents in ask_all(Share()).items():
        records = [k for d in documents for k in d]
        calibration[wording] = {**report.keys_cell(records, config.bands),
                                "log_prob": sum(r["log_prob"] for r in records) / len(records)}
    return calibration


def best_format(calibration: dict) -> str:
    """The wording with the most keys found in ``calibrate``'s record; ties go to the higher mean log-probability
    of the right word, then to the first in ``retrieval.FORMATS``' order."""
    return max(calibration, key=lambda name: (calibration[name]["accuracy"], calibration[name]["log_prob"]))
