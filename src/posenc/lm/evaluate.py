"""Bits-per-byte at many lengths, on windows every encoding shares.

The text is a stack of N windows of C + 1 bytes (``data.sample_windows``); C is a multiple of
every evaluated length W. Two protocols (ALiBi paper, App. B), each applied inside every window:
  - non-overlapping (default): the window is cut into C / W pieces of length W;
    early tokens of each piece see little context (the "early-token curse").
  - sliding (stride S): pieces of length W advance by S; every token is scored
    once, with up to W tokens of context.
For every W the same bytes are scored, so columns compare like with like, and every
window gets its own score at every W: the unit of the intervals and paired differences.
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


def protocol(stride: int | None) -> str:
    """How a results file names the evaluation ``evaluate`` ran with ``stride``."""
    return "non-overlapping windows" if stride is None else f"sliding windows, stride {stride}"


@torch.no_grad()
def evaluate(
    model: nn.Module,
    windows: Tensor,
    lengths: list[int],
    *,
    stride: int | None = None,
    tokens_per_batch: int = 4096,
    bins: int = 32,
    autocast_dtype: torch.dtype | None = None,
    label: str = "eval",
) -> dict:
    """Bits-per-byte of ``model`` at each length, in all and per window.

    Args:
        windows: (N, C + 1) int64 bytes; C must be a multiple of every length.
        lengths: lengths W.
        stride: None for non-overlapping pieces, else the sliding stride.
        tokens_per_batch: pieces go through the model in batches of about this many tokens.
    Returns:
        {"bits_per_byte": {W: float or None}, "window_bits": {W: [N floats] or None}, "errors": {W: message},
         "position_bits": {"length": W_max, "bin_edges": [...], "bits": [...], "window_bits": [N × bins]} or None}
        A length the model cannot run (a learned table too short) gets None and its error.
    """
    model.eval()
    count, span = windows.shape[0], windows.shape[1] - 1
    uneven = [length for length in lengths if span % length]
    if uneven:
        raise ValueError(f"windows of {span} bytes are not a whole number of lengths {uneven}")
    results, per_window, errors, position = {}, {}, {}, None
    for length in lengths:
        batch = max(1, tokens_per_batch // length)
        try:
            if stride is None:
                inputs = windows[:, :-1].reshape(-1, length)  # window-major: pieces of one window are adjacent
                targets = windows[:, 1:].reshape(-1, length)
                losses = _window_losses(model, inputs, targets, batch, autocast_dtype, label)  # (N * C/W, W)
                sums = losses.view(count, span).sum(1)
                if length == max(lengths):
                    position = _binned(losses.view(count, span // length, length).mean(1), bins)
            else:
                pieces = sliding_windows(span, length, min(stride, length))
                inputs = torch.stack([windows[:, s : s + length] for s, _ in pieces], 1).reshape(-1, length)
                targets = torch.stack([windows[:, s + 1 : s + length + 1] for s, _ in pieces], 1).reshape(-1, length)
                losses = _window_losses(model, inputs, targets, batch, autocast_dtype, label)
                losses = losses.view(count, len(pieces), length)
                sums = sum(losses[:, i, first:].sum(1) for i, (_, first) in enumerate(pieces))
            bits = sums.double() / span / math.log(2)  # (N,)
            per_window[length] = bits.tolist()
            results[length] = bits.mean().item()
        except ValueError as error:  # e.g. positions beyond a learned table
            results[length], per_window[length], errors[length] = None, None, str(error)
    return {"bits_per_byte": results, "window_bits": per_window, "errors": errors, "position_bits": position}


def _binned(per_position: Tensor, bins: int) -> dict:
    """Mean loss (bits) over equal bins of positions, in all and per window. per_position: (N, W) nats."""
    length = per_position.shape[1]
    bins = min(bins, length)
    edges = [round(i * length / bins) for i in range(bins + 1)]
    per_window = torch.stack([per_position[:, a:b].mean(1) for a, b in zip(edges[:-1], edges[1:])], 1) / math.log(2)
    return {"length": length, "bin_edges": edges, "bits": per_window.mean(0).tolist(),
            "window_bits": per_window.tolist()}
