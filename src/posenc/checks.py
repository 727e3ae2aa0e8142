"""Argument checks that raise a ValueError naming the parameter and the valid range.

Every public entry point validates its input here, before any tensor work, so a
user sees "head_dim must be an even integer >= 2, got 7" instead of a shape error
from deep inside a matmul.
"""

from __future__ import annotations

import torch
from torch import Tensor


def positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def even_int(name: str, value: object) -> int:
    if positive_int(name, value, minimum=2) % 2:
        raise ValueError(f"{name} must be an even integer >= 2, got {value!r}")
    return int(value)


def positive_float(name: str, value: object, *, minimum: float = 0.0, inclusive: bool = False) -> float:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    number = float(value) if is_number else float("nan")
    if not (number >= minimum if inclusive else number > minimum):
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")
    return number


def choice(name: str, value: object, options: tuple[str, ...] | list[str]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {sorted(options)}, got {value!r}")
    return value


def positions(name: str, value: Tensor, length: int, batch: int) -> Tensor:
    """Validate explicit positions and return them as int64 (B or 1, T)."""
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value)
    if value.dtype.is_floating_point or value.dtype == torch.bool or value.is_complex():
        raise ValueError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if value.dim() == 1:
        value = value.unsqueeze(0)
    if value.dim() != 2 or value.shape[-1] != length or value.shape[0] not in (1, batch):
        raise ValueError(
            f"{name} must have shape ({length},) or ({batch}, {length}) to match the tensors, "
            f"got {tuple(value.shape)}"
        )
    if not torch.compiler.is_compiling() and value.numel() and int(value.min()) < 0:
        # Reading values would break a torch.compile graph: eager calls check them, compiled
        # ones (where positions are almost always the model's own arange) only their shape.
        raise ValueError(f"{name} must be >= 0, got minimum {int(value.min())}")
    return value.long()
