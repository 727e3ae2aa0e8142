"""Round-robin timing: one call of each contender per round, medians over rounds.

These machines drift by ±10% over seconds. Timing contender A for a while, then B,
lets the drift land on one of them; interleaving them lets it land on all alike.
Each round's time of a contender is divided by the baseline's time *in the same
round*, so the reported ratio is the median of per-round ratios, with its spread.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
from tqdm.auto import tqdm


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def round_robin(contenders: dict[str, Callable[[], object]], *, baseline: str, rounds: int,
                device: torch.device, warmup: int = 1, label: str = "rounds") -> dict[str, dict]:
    """Time every contender ``rounds`` times, interleaved.

    Returns {name: {"ms": median milliseconds, "ratio": median of per-round time / baseline's,
    "ratio_low"/"ratio_high": quartiles of those per-round ratios}}.
    """
    if baseline not in contenders:
        raise ValueError(f"baseline {baseline!r} is not one of the contenders {sorted(contenders)}")
    for fn in tqdm(contenders.values(), desc=f"{label}: warm-up", leave=False, mininterval=1.0, dynamic_ncols=True):
        for _ in range(warmup):
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in tqdm(range(rounds), desc=label, leave=False, mininterval=1.0, dynamic_ncols=True):
        for name, fn in contenders.items():
            _synchronize(device)
            start = time.perf_counter()
            fn()
            _synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    result = {}
    for name, samples in seconds.items():
        ratios = sorted(s / b for s, b in zip(samples, seconds[baseline]))
        quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        result[name] = {"ms": statistics.median(samples) * 1e3, "ratio": statistics.median(ratios),
                        "ratio_low": quartiles[0], "ratio_high": quartiles[2]}
    return result
