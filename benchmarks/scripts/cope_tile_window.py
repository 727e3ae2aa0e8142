"""How many consecutive table rows one CoPE tile reads, and how many windows of them ``counts_triton`` computes: for
the last 64 queries of T tokens and each key tile of 64, ⌈largest count⌉ − ⌊smallest count⌋ + 1 over the tile's
allowed pairs, and the windows of 64 rows it computes, each from the next row some pair reads. Each window costs the
tile one q·eᵀ product (two in bf16), so the windows are what CoPE's Triton tiles pay for a table of any size.

    python benchmarks/scripts/cope_tile_window.py [--length 16384]

Random q and k of width 64, gates at 1/√64: spread 1 gives gates σ(N(0, 1)), spread 0.05 gates near ½; "leaning":
keys share a direction that every other query opposes, so gates sit near 1 and near 0 by turns and neighbouring
rows' counts drift apart (the worst case for one window: a trained head whose queries count different things).
"""

from __future__ import annotations

import argparse

import torch

from posenc import checks

TILE = 64


def tile_reads(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For the last 64 queries q (64, Dh) and every key k (T, Dh): (key tiles,) the table rows each key tile reads,
    and (key tiles,) the windows of ``TILE`` rows it computes."""
    length, width = k.shape
    allowed = torch.arange(length)[None, :] <= torch.arange(length - TILE, length)[:, None]  # (64, T)
    gates = torch.sigmoid(q @ k.T * width ** -0.5) * allowed
    counts = gates.flip(-1).cumsum(-1).flip(-1)  # counts[r, j]: the gates of keys j..(r's own), as CoPE sums them
    rows, windows = [], []
    for start in range(0, length, TILE):
        tile = counts[:, start:start + TILE][allowed[:, start:start + TILE]]
        read = torch.cat([tile.floor(), tile.ceil()]).long().unique()  # sorted
        rows.append(float(read[-1] - read[0] + 1))
        computed, start = 0, int(read[0])
        while start >= 0:  # as the kernel walks them: each window from the next row some pair reads
            computed += 1
            later = read[read >= start + TILE]
            start = int(later[0]) if later.numel() else -1
        windows.append(float(computed))
    return torch.tensor(rows), torch.tensor(windows)


def cases(length: int, width: int = 64):
    """(name, q (64, Dh), k (T, Dh)) for each case of the docstring."""
    for spread in (1.0, 0.05):
        yield f"q and k spread {spread}", torch.randn(TILE, width) * spread, torch.randn(length, width) * spread
    leaning = torch.where(torch.arange(TILE) % 2 == 0, 1.0, -1.0)[:, None]
    yield "leaning", torch.randn(TILE, width) * 0.2 + 0.3 * leaning, torch.randn(length, width) * 0.2 + 0.3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    args = parser.parse_args()
    try:
        checks.positive_int("--length", args.length, minimum=TILE)
    except ValueError as error:
        parser.error(str(error))
    torch.manual_seed(0)
    for name, q, k in cases(args.length):
        rows, windows = tile_reads(q, k)
        print(f"T = {args.length}, {name}: table rows per key tile, median {rows.median():.0f}, 90th percentile "
              f"{rows.quantile(0.9):.0f}, largest {rows.max():.0f}; windows of {TILE} computed per key tile, median "
              f"{windows.median():.0f}, largest {windows.max():.0f}, mean {windows.mean():.2f}")

if __name__ == "__main__":
    main()
