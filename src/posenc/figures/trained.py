"""Figures of trained models: a learned absolute table, and per-head attention maps on real text."""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from ..lm.model import LanguageModel


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
