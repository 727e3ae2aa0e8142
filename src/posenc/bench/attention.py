"""Attention speed per encoding and backend, as ratios to eager in the same run."""

from __future__ import annotations

import torch

from ..attention import attention, serves
from ..encodings import build_for_model
from ..encodings.registry import one_axis
from .timing import round_robin



def timed_encodings() -> tuple[str, ...]:
    """What ``attention()`` takes from positions alone: the encodings this table times."""
    return one_axis(in_attention=True, from_positions=True)


@torch.no_grad()
def bench_attention(device: str = "cpu", dtype: torch.dtype = torch.float32, lengths=(256, 1024), batch: int = 1,
                    heads: int = 8, head_dim: int = 64, rounds: int = 5, encodings=None) -> list[dict]:
    """Rows {encoding, backend, length, ms, ratio (to eager), ratio_low, ratio_high}, every backend that serves;
    ``encodings``: names (default: ``timed_encodings()``)."""
    device, encodings = torch.device(device), timed_encodings() if encodings is None else encodings
    sizes = {"head_dim": head_dim, "num_heads": heads}
    rows = []
    for length in lengths:
        q, k, v = (torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype) for _ in range(3))
        for name in encodings:
            enc = build_for_model(name, sizes=sizes).to(device=device, dtype=dtype)
            contenders = {backend: (lambda b=backend: attention(q, k, v, enc, backend=b))
                          for backend in ("eager", "sdpa", "flex") if serves(backend, enc, q, k, v)}
            timed = round_robin(contenders, baseline="eager", rounds=rounds, device=device,
                                label=f"attention {name} T={length}")
            rows += [{"encoding": name, "backend": backend, "length": length, **numbers}
                     for backend, numbers in timed.items()]
    return rows
