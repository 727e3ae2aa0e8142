"""Intervals for every reported number: a seeded bootstrap over windows or the files they come from.

A table cell is the mean of per-window scores (every window the same number of bytes). Its 95% interval
is a percentile bootstrap: resample units with replacement, recompute the mean, take the 2.5th and 97.5th
percentiles. The unit is the file a window starts in when the windows span at least ``MIN_FILES`` files
(windows of one file are correlated, so resampling them one by one would claim too much), else the window.
A comparison of two rows is *paired*: the same windows (and seeds) scored by both, the per-window
differences bootstrapped the same way; its mean equals the difference of the two rows' means.
"""

from __future__ import annotations

import torch

RESAMPLES = 2000
LEVEL = 0.95
MIN_FILES = 10
BOOTSTRAP_SEED = 0


def units(files: list[str] | tuple[str, ...]) -> tuple[list[int], str]:
    """(unit index per window, what a unit is): files when there are at least MIN_FILES of them, else windows."""
    names = list(dict.fromkeys(files))
    if len(names) >= MIN_FILES:
        index = {name: i for i, name in enumerate(names)}
        return [index[f] for f in files], "files"
    return list(range(len(files))), "windows"


def bootstrap_interval(values, groups: list[int], *, resamples: int = RESAMPLES, level: float = LEVEL,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` (N,), resampling the groups ``groups`` (N,) labels.

    Each resample draws as many groups as there are, with replacement, and takes the mean over the windows
    of the drawn groups (a group drawn twice counts twice). Deterministic for a seed.
    """
    values = torch.as_tensor(values, dtype=torch.float64)
    labels = torch.as_tensor(groups, dtype=torch.int64)
    if values.ndim != 1 or values.shape != labels.shape or values.numel() == 0:
        raise ValueError(f"values and groups must be equal-length 1-D sequences, got {values.shape}, {labels.shape}")
    _, labels = torch.unique(labels, return_inverse=True)
    count = int(labels.max()) + 1
    sums = torch.zeros(count, dtype=torch.float64).index_add_(0, labels, values)
    sizes = torch.zeros(count, dtype=torch.float64).index_add_(0, labels, torch.ones_like(values))
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, count, (resamples, count), generator=generator)
    means = sums[draws].sum(1) / sizes[draws].sum(1)
    tail = (1 - level) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return low, high


def summary(values, groups: list[int]) -> dict:
    """{"mean", "low", "high"} of per-window ``values``."""
    values = torch.as_tensor(values, dtype=torch.float64)
    low, high = bootstrap_interval(values, groups)
    return {"mean": values.mean().item(), "low": low, "high": high}


def paired_difference(a, b, groups: list[int]) -> dict:
    """{"mean", "low", "high"} of a − b over the same windows: per-window differences, bootstrapped."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"a paired difference needs the same windows, got {a.shape} and {b.shape}")
    return summary(a - b, groups)


def covers_zero(interval: dict) -> bool:
    return interval["low"] <= 0 <= interval["high"]


def seed_mean(per_seed: list[list[float] | None]) -> list[float] | None:
    """Per-window values averaged over seeds (the same windows in each); None when a seed has none."""
    if not per_seed or any(values is None for values in per_seed):
        return None
    return torch.tensor(per_seed, dtype=torch.float64).mean(0).tolist()


def cell(per_seed: list[list[float] | None], groups: list[int]) -> dict | None:
    """A table cell from each seed's per-window values: {"mean", "low", "high", "seed_std"}, or None.

    The interval is over windows (or files) of the seed-averaged values; ``seed_std`` is the standard
    deviation of the seeds' means (0 for one seed)."""
    values = seed_mean(per_seed)
    if values is None:
        return None
    means = torch.tensor(per_seed, dtype=torch.float64).mean(1)
    return {**summary(values, groups), "seed_std": means.std().item() if len(means) > 1 else 0.0}


def paired(per_seed_a: list[list[float] | None], per_seed_b: list[list[float] | None], groups: list[int]
           ) -> dict | None:
    """The paired difference a − b of two cells scored on the same windows and seeds, or None."""
    a, b = seed_mean(per_seed_a), seed_mean(per_seed_b)
    return None if a is None or b is None else paired_difference(a, b, groups)


def position_bands(position: dict | None, files: list[str] | tuple[str, ...]) -> dict | None:
    """evaluate()'s position bins with per-window values -> the mean per bin and its interval ("low", "high")."""
    if position is None:
        return None
    groups, _ = units(files)
    per_bin = [summary(column, groups) for column in zip(*position["window_bits"])]
    return {"length": position["length"], "bin_edges": position["bin_edges"], "bits": position["bits"],
            "low": [b["low"] for b in per_bin], "high": [b["high"] for b in per_bin]}


def describe_windows(windows, split, name: str = "test") -> dict:
    """What a results file says about the windows its cells score (``windows`` from ``split``): how many, how
    long, from how many files, and how the intervals were made. Each window's file is kept, so that with each
    row's per-window scores any two rows can be compared later."""
    _, unit = units(windows.files)
    return {"split": name, "count": len(windows.files), "length": windows.length,
            "bytes": len(windows.files) * windows.length, "files": len(set(windows.files)),
            "split_files": len(split.files), "split_bytes": len(split),
            "interval": f"95% bootstrap over {unit}, {RESAMPLES} resamples", "window_files": list(windows.files)}
