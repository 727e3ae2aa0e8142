"""Bits-per-byte at many lengths, on text every encoding shares.

Two protocols (ALiBi paper, App. B):
  - non-overlapping (default): the eval span is cut into windows of length W;
    early tokens of each window see little context (the "early-token curse").
  - sliding (stride S): windows of length W advance by S; every token is scored
    once, with up to W tokens of context.
For every W the same bytes are scored, so columns compare like with like.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm


def _window_losses(model, inputs: Tensor, targets: Tensor, batch: int, autocast_dtype, label: str) -> Tensor:
    """Per-token NLL in nats: inputs/targets (N, W) -> (N, W) float32."""
    losses = []
    device = next(model.parameters(), torch.empty(0)).device
    chunks = range(0, inputs.shape[0], batch)
    for chunk in tqdm(chunks, desc=label, leave=False, mininterval=1.0, dynamic_ncols=True):
        x, y = inputs[chunk : chunk + batch].to(device), targets[chunk : chunk + batch].to(device)
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(x)
        losses.append(F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").cpu())
    return torch.cat(losses)


def sliding_windows(num_tokens: int, length: int, stride: int) -> list[tuple[int, int]]:
    """(start, first scored index within the window) for windows of ``length`` over ``num_tokens``.

    Each token index in [0, num_tokens) is scored exactly once; the first window scores
    all its tokens, later ones only those not scored before.
    """
    windows, scored_until, start = [], 0, 0
    while scored_until < num_tokens:
        start = min(start, num_tokens - length)
        windows.append((start, scored_until - start))
        scored_until = start + length
        start += stride
    return windows


@torch.no_grad()
def evaluate(
    model: nn.Module,
    tokens: Tensor,
    lengths: list[int],
    *,
    stride: int | None = None,
    batch: int = 8,
    bins: int = 32,
    autocast_dtype: torch.dtype | None = None,
    label: str = "eval",
) -> dict:
    """Bits-per-byte of ``model`` at each window length.

    Args:
        tokens: (S + 1,) int64 bytes; S must be a multiple of max(lengths).
        lengths: window lengths W.
        stride: None for non-overlapping windows, else the sliding stride.
    Returns:
        {"bits_per_byte": {W: float or None}, "errors": {W: message},
         "position_bits": {"length": W_max, "bin_edges": [...], "bits": [...]} or None}
        A length the model cannot run (a learned table too short) gets None and its error.
    """
    model.eval()
    span = tokens.shape[0] - 1
    results, errors, position = {}, {}, None
    for length in lengths:
        try:
            if stride is None:
                inputs = tokens[:span].view(-1, length)
                targets = tokens[1 : span + 1].view(-1, length)
                losses = _window_losses(model, inputs, targets, batch, autocast_dtype, label)  # (N, W)
                total = losses.sum().item()
                if length == max(lengths):
                    position = _binned(losses.mean(0), bins)
            else:
                windows = sliding_windows(span, length, min(stride, length))
                inputs = torch.stack([tokens[s : s + length] for s, _ in windows])
                targets = torch.stack([tokens[s + 1 : s + length + 1] for s, _ in windows])
                losses = _window_losses(model, inputs, targets, batch, autocast_dtype, label)
                total = sum(losses[i, first:].sum().item() for i, (_, first) in enumerate(windows))
            results[length] = total / span / math.log(2)
        except ValueError as error:  # e.g. positions beyond a learned table
            results[length], errors[length] = None, str(error)
    return {"bits_per_byte": results, "errors": errors, "position_bits": position}


def _binned(per_position: Tensor, bins: int) -> dict:
    """Mean loss (bits) over equal bins of positions. per_position: (W,) nats."""
    length = per_position.shape[0]
    bins = min(bins, length)
    edges = [round(i * length / bins) for i in range(bins + 1)]
    bits = [(per_position[a:b].mean() / math.log(2)).item() for a, b in zip(edges[:-1], edges[1:])]
    return {"length": length, "bin_edges": edges, "bits": bits}
