"""``posenc plot``: every figure as a PNG in one folder."""

from __future__ import annotations

from pathlib import Path

import torch

from ..encodings import Learned, T5RelativeBias
from ..lm.model import LanguageModel
from . import encodings as figures
from .style import save_figure
from .trained import attention_maps_figure, learned_table_figure


def write_figures(out: Path, models: dict[str, LanguageModel] | None = None,
                  window: torch.Tensor | None = None) -> list[Path]:
    """Write the encoding figures (and, given trained ``models`` and a (1, T) text ``window``, the
    trained-model figures) under ``out``."""
    written = [
        save_figure(figures.sinusoidal_heatmap(), out / "sinusoidal_heatmap.png"),
        save_figure(figures.similarity_figure(), out / "sinusoidal_similarity.png"),
        save_figure(figures.rope_decay_figure(), out / "rope_decay.png"),
        save_figure(figures.rope_scalings_figure(), out / "rope_scalings.png"),
        save_figure(figures.alibi_figure(), out / "alibi.png"),
    ]
    models = models or {}
    t5 = _trained(models, T5RelativeBias)
    learned = t5.encoding.table.detach() if t5 is not None else None
    bidirectional = bool(t5.encoding.bidirectional) if t5 is not None else False
    written.append(save_figure(figures.t5_buckets_figure(learned=learned, bidirectional_learned=bidirectional),
                               out / "t5_buckets.png"))
    if models:
        learned_model = _trained(models, Learned)
        if learned_model is not None:
            written.append(save_figure(learned_table_figure(learned_model.encoding.table), out / "learned_table.png"))
        written.append(save_figure(attention_maps_figure(models, window), out / "attention_maps.png"))
    return written


def _trained(models: dict[str, LanguageModel], kind: type) -> LanguageModel | None:
    """The first of ``models`` whose encoding is a ``kind`` (its learned parameters are what a figure draws)."""
    return next((model for model in models.values() if isinstance(model.encoding, kind)), None)
