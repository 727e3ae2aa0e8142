"""Intervals for every reported number: a seeded bootstrap over the files windows come from (and the seeds
that trained the models), and, over several seeds, a Student t interval of the seeds' means beside it.

A table cell is the mean of per-window scores (every window the same number of bytes). Its 95% interval
is a percentile bootstrap: resample units with replacement, recompute the mean, take the 2.5th and 97.5th
percentiles. The unit is always the file a window starts in: windows of one file are correlated, so resampling
them one by one would claim too much, and most where there are fewest files. Below ``MIN_FILES`` files the
interval is still over files and is labelled as too few to cover its share (a percentile bootstrap over 4 units
covers the truth about 79% of the time).
With several seeds every seed scores the same windows, so seeds and units are crossed, and each resample
draws both, independently (a pigeonhole bootstrap): seed-to-seed variance is inside the interval, not
averaged away before it. A handful of seeds is too few for a bootstrap to cover its share, so the cell also
carries ``seed_low``/``seed_high``, the t interval over the seeds' means (S − 1 degrees of freedom), and a
comparison is read as a difference only where both intervals exclude zero (``supported``).
A comparison of two rows is *paired*: the same windows and seeds scored by both, the per-window
differences resampled the same way; its mean equals the difference of the two rows' means.
"""

from __future__ import annotations

import torch

from .documents import t_interval

RESAMPLES = 2000
LEVEL = 0.95
MIN_FILES = 10
BOOTSTRAP_SEED = 0


def units(files: list[str] | tuple[str, ...]) -> tuple[list[int], str]:
    """(unit index per window, what a unit is): the file each window starts in, numbered in order of first
    appearance, and "N files" (", too few to cover 95%" below MIN_FILES)."""
    names = list(dict.fromkeys(files))
    index = {name: i for i, name in enumerate(names)}
    few = f", too few to cover {LEVEL:.0%}" if len(names) < MIN_FILES else ""
    return [index[f] for f in files], f"{len(names)} file{'s' if len(names) != 1 else ''}{few}"


def bootstrap_interval(values, groups: list[int], *, resamples: int = RESAMPLES, level: float = LEVEL,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile interval of the mean of ``values`` (N,), resampling the groups ``groups`` (N,) labels.

    Each resample draws as many groups as there are, with replacement, and takes the mean over the windows
    of the drawn groups (a group drawn twice counts twice). Deterministic for a seed.
    """
    values = torch.as_tensor(values, dtype=torch.float64)
    if values.ndim != 1:
        raise ValueError(f"values and groups must be equal-length 1-D sequences, got {values.shape}")
    return crossed_interval(values[None], groups, resamples=resamples, level=level, seed=seed)


def crossed_interval(per_seed, groups: list[int], *, resamples: int = RESAMPLES, level: float = LEVEL,
                     seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile interval of the mean of ``per_seed`` (S, N): S seeds' values on the same N windows, whose
    groups are ``groups`` (N,). Each resample draws S seeds and as many groups as there are, independently and
    with replacement, and takes the mean over every (drawn seed, window of a drawn group). One seed is the plain
    bootstrap over groups. Deterministic for a seed.
    """
    values = torch.as_tensor(per_seed, dtype=torch.float64)
    labels = torch.as_tensor(groups, dtype=torch.int64)
    if values.ndim != 2 or values.shape[1:] != labels.shape or values.numel() == 0:
        raise ValueError(f"values and groups must be equal-length 1-D sequences (one row per seed), got "
                         f"{tuple(values.shape)}, {tuple(labels.shape)}")
    _, labels = torch.unique(labels, return_inverse=True)
    count, seeds = int(labels.max()) + 1, values.shape[0]
    sums = torch.zeros(seeds, count, dtype=torch.float64).index_add_(1, labels, values)  # (S, U)
    sizes = torch.zeros(count, dtype=torch.float64).index_add_(0, labels, torch.ones_like(values[0]))
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, count, (resamples, count), generator=generator)
    seed_draws = torch.randint(0, seeds, (resamples, seeds), generator=generator)
    drawn = sums[seed_draws].gather(2, draws[:, None, :].expand(-1, seeds, -1))  # (R, S, U)
    means = drawn.sum(2).sum(1) / (sizes[draws].sum(1) * seeds)
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


def supported(interval: dict) -> bool:
    """Whether a paired difference is one: its interval excludes zero, and so does its seed-level t interval
    where several seeds ran."""
    seed_level = "seed_low" in interval and interval["seed_low"] <= 0 <= interval["seed_high"]
    return not covers_zero(interval) and not seed_level


def seed_mean(per_seed: list[list[float] | None]) -> list[float] | None:
    """Per-window values averaged over seeds (the same windows in each); None when a seed has none."""
    if not per_seed or any(values is None for values in per_seed):
        return None
    return torch.tensor(per_seed, dtype=torch.float64).mean(0).tolist()


def cell(per_seed: list[list[float] | None], groups: list[int]) -> dict | None:
    """A table cell from each seed's per-window values: {"mean", "low", "high", "seed_std", "per_seed"}, with
    "seed_low" and "seed_high" when more than one seed ran; None when a seed has no values.

    The interval resamples seeds and units (``crossed_interval``); ``seed_std`` is the standard deviation of the
    seeds' means (0 for one seed), ``per_seed`` those means, ``seed_low``/``seed_high`` their t interval."""
    values = seed_mean(per_seed)
    if values is None:
        return None
    table = torch.tensor(per_seed, dtype=torch.float64)  # (S, N)
    means = table.mean(1)
    low, high = crossed_interval(table, groups)
    result = {"mean": torch.tensor(values, dtype=torch.float64).mean().item(), "low": low, "high": high,
              "seed_std": means.std().item() if len(means) > 1 else 0.0, "per_seed": means.tolist()}
    if len(means) > 1:
        result["seed_low"], result["seed_high"] = t_interval(means)
    return result


def paired(per_seed_a: list[list[float] | None], per_seed_b: list[list[float] | None], groups: list[int]
           ) -> dict | None:
    """The paired difference a − b of two cells scored on the same windows and seeds, or None: per-seed,
    per-window differences, as a cell (``cell``) without its spread."""
    if seed_mean(per_seed_a) is None or seed_mean(per_seed_b) is None:
        return None
    a, b = torch.tensor(per_seed_a, dtype=torch.float64), torch.tensor(per_seed_b, dtype=torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"a paired difference needs the same windows, got {tuple(a.shape)} and {tuple(b.shape)}")
    difference = cell((a - b).tolist(), groups)
    del difference["seed_std"]
    return difference


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
            "interval": f"95% bootstrap over {unit} (and seeds, drawn independently, where several ran), "
                        f"{RESAMPLES} resamples; with several seeds also a Student t interval over their means",
            "window_files": list(windows.files)}
