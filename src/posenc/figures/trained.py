"""Figures read from a finished ``posenc extrapolate`` run directory (``posenc plot --ckpt``)."""

from __future__ import annotations

from pathlib import Path

import torch
from matplotlib.figure import Figure

from . import storage
from .data import stdlib_corpus, text_corpus
from .experiments.extrapolate import ExperimentConfig
from .experiments.rows import ROWS
from .model import LanguageModel


def trained_models(run_dir: Path) -> dict[str, LanguageModel]:
    """Every finished checkpoint of the run (first seed), by encoding name, in eval mode."""
    if not (run_dir / "config.json").is_file():
        raise ValueError(f"--ckpt {run_dir}: not a posenc extrapolate run directory (no config.json)")
    config = ExperimentConfig.from_dict(storage.read_json(run_dir / "config.json"))
    models = {}
    for folder in sorted((run_dir / "checkpoints").glob("*-seed*")):
        weights = folder / "model.safetensors"
        name, seed = folder.name.rsplit("-seed", 1)
        if not weights.exists() or int(seed) != config.seed or name not in ROWS:
            continue
        model = LanguageModel(config.model_config(ROWS[name], {}))
        model.load_state_dict(storage.load_weights(weights))
        models[name] = model.eval()
    if not models:
        raise ValueError(f"--ckpt {run_dir}: no finished checkpoints under {run_dir / 'checkpoints'}")
    return models


def validation_window(run_dir: Path) -> torch.Tensor:
    """The first training-length window of the run's validation text: (1, T) int64."""
    config = ExperimentConfig.from_dict(storage.read_json(run_dir / "config.json"))
    corpus = text_corpus(config.text) if config.text else stdlib_corpus()
    return corpus.validation[: config.train_length].long().unsqueeze(0)


def learned_table_figure(table: torch.Tensor) -> Figure:
    """A trained absolute table (P, D): its values, and the cosine similarity between positions."""
    table = table.detach().double()
    unit = table / table.norm(dim=-1, keepdim=True)
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = figure.subplots(1, 2)
    limit = table.abs().max().item()
    image = left.imshow(table.numpy(), aspect="auto", cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
    figure.colorbar(image, ax=left)
    left.set_xlabel("dimension")
    left.set_ylabel("position")
    left.set_title("Learned absolute table after training (entry values)")
    image = right.imshow((unit @ unit.t()).numpy(), cmap="viridis", origin="lower")
    figure.colorbar(image, ax=right, label="cosine similarity")
    right.set_xlabel("position")
    right.set_ylabel("position")
    right.set_title("Similarity between learned position vectors")
    return figure


@torch.no_grad()
def attention_maps_figure(models: dict[str, LanguageModel], tokens: torch.Tensor, layer: int = 0) -> Figure:
    """Per-head attention weights of each trained model on one real validation window."""
    names = list(models)
    heads = max(m.config.num_heads for m in models.values())
    figure = Figure(figsize=(2.3 * heads, 2.3 * len(names) + 0.6))
    axes = figure.subplots(len(names), heads, squeeze=False)
    for row, name in enumerate(names):
        maps: list[torch.Tensor] = []
        models[name](tokens, maps=maps)
        weights = maps[min(layer, len(maps) - 1)][0]  # (H, T, T)
        for h in range(heads):
            ax = axes[row][h]
            if h < weights.shape[0]:
                ax.imshow(weights[h].numpy() ** 0.5, cmap="magma", vmin=0, vmax=1, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"head {h}", fontsize=9)
            if h == 0:
                ax.set_ylabel(name, fontsize=9)
    figure.suptitle(f"Attention weights (sqrt scale), layer {layer}, one {tokens.shape[1]}-byte validation window; "
                    "rows: query, columns: key")
    return figure
