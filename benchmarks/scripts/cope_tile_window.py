"""How many consecutive table rows one CoPE tile reads: for the last 64 queries of T tokens, and each key tile of 64,
⌈largest count⌉ − ⌊smallest count⌋ + 1 over the tile's allowed pairs. ``counts_triton`` computes q·eᵀ over windows
of 64 of those rows, skipping windows that no pair reads, rather than over the whole table (the tiny LM and the long
table build CoPE with one row per token): this says how many rows a tile reads, so about how many windows.

    python benchmarks/scripts/cope_tile_window.py [--length 16384]

Random q and k of width 64, gates at 1/√64: spread 1 gives gates σ(N(0, 1)), spread 0.05 gates near ½.
"""

from __future__ import annotations

import argparse

import torch

from posenc import checks

TILE = 64


def window_rows(length: int, width: int, spread: float) -> torch.Tensor:
    """(key tiles,) the table rows each key tile of the last query tile reads."""
    q, k = torch.randn(TILE, width) * spread, torch.randn(length, width) * spread  # the last 64 queries, every key
    allowed = torch.arange(length)[None, :] <= torch.arange(length - TILE, length)[:, None]  # (64, T)
    gates = torch.sigmoid(q @ k.T * width ** -0.5) * allowed
    counts = gates.flip(-1).cumsum(-1).flip(-1)  # counts[r, j]: the gates of keys j..(r's own), as CoPE sums them
    widths = []
    for start in range(0, length, TILE):
        tile, inside = counts[:, start:start + TILE], allowed[:, start:start + TILE]
        widths.append(float(tile[inside].max().ceil() - tile[inside].min().floor()) + 1)
    return torch.tensor(widths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    args = parser.parse_args()
    try:
        checks.positive_int("--length", args.length, minimum=TILE)
    except ValueError as error:
        parser.error(str(error))
    torch.manual_seed(0)
    for spread in (1.0, 0.05):
        rows = window_rows(args.length, 64, spread)
        print(f"T = {args.length}, q and k spread {spread}: table rows per key tile, median {rows.median():.0f}, "
              f"90th percentile {rows.quantile(0.9):.0f}, largest {rows.max():.0f}")


if __name__ == "__main__":
    main()
