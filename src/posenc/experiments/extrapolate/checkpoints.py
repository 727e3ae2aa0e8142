"""Reading a finished ``posenc extrapolate`` run directory: its trained models and its text.

``posenc plot --ckpt RUN`` draws figures of these; the figures themselves know nothing of run directories.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ... import storage
from ...lm.data import stdlib_corpus, text_corpus
from ...lm.model import LanguageModel
from ..pinning import read_run
from .config import ExperimentConfig
from .rows import all_rows


def trained_models(run_dir: Path) -> dict[str, LanguageModel]:
    """Every finished checkpoint of the run (first seed), by encoding name, in eval mode."""
    config = ExperimentConfig.from_dict(read_run(run_dir, "extrapolate", "--ckpt"))
    models, rows = {}, all_rows()
    for folder in sorted((run_dir / "checkpoints").glob("*-seed*")):
        weights = folder / "model.safetensors"
        name, seed = folder.name.rsplit("-seed", 1)
        if not weights.exists() or int(seed) != config.seed or name not in rows:
            continue
        model = LanguageModel(config.model_config(rows[name], {}))
        model.load_state_dict(storage.load_weights(weights))
        models[name] = model.eval()
    if not models:
        raise ValueError(f"--ckpt {run_dir}: no finished checkpoints under {run_dir / 'checkpoints'}")
    return models


def attention_window(run_dir: Path) -> torch.Tensor:
    """The first training-length window of the run's test text: (1, T) int64."""
    config = ExperimentConfig.from_dict(read_run(run_dir, "extrapolate", "--ckpt"))
    corpus = text_corpus(config.text) if config.text else stdlib_corpus()
    return corpus.test.data[: config.train_length].long().unsqueeze(0)
