"""Command-line value types the commands share: comma-separated lists, checked as argparse reads them."""

from __future__ import annotations

import argparse
import math


def comma_ints(text: str) -> tuple[int, ...]:
    """"1,2,4" -> (1, 2, 4)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def comma_positive_floats(text: str) -> tuple[float, ...]:
    """"1e-3,3e-3" -> (0.001, 0.003): at least one, each finite and > 0."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or min(values) <= 0 or not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers > 0, got {text!r}")
    return values
