"""``posenc bench``: attention speed per encoding and backend, as ratios to eager in the same run.

Timings are medians over repeats after a warm-up call; the ratio column divides each
backend's time by eager's for the same encoding and length, measured in this process,
so numbers from different machines are never compared directly.
"""

from __future__ import annotations

import statistics
import time

import torch

from .encodings import build_for_model
from .attention import attention, serves

ENCODINGS = ("none", "rope", "alibi", "t5", "shaw", "transformer_xl")


def _time(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (and compile, for flex on CUDA)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


@torch.no_grad()
def bench_attention(device: str = "cpu", dtype: torch.dtype = torch.float32, lengths=(256, 1024), batch: int = 1,
                    heads: int = 8, head_dim: int = 64, repeats: int = 5) -> list[dict]:
    """Rows {encoding, backend, length, ms, vs_eager} for every backend that serves the encoding."""
    device = torch.device(device)
    sizes = {"head_dim": head_dim, "num_heads": heads}
    rows = []
    for length in lengths:
        q, k, v = (torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype) for _ in range(3))
        for name in ENCODINGS:
            enc = build_for_model(name, sizes=sizes).to(device=device, dtype=dtype)
            eager_s = None
            for backend in (b for b in ("eager", "sdpa", "flex") if serves(b, enc, q, k, v)):
                seconds = _time(lambda: attention(q, k, v, enc, backend=backend), device, repeats)
                eager_s = seconds if backend == "eager" else eager_s
                rows.append({"encoding": name, "backend": backend, "length": length, "ms": seconds * 1e3,
                             "vs_eager": seconds / eager_s})
    return rows


def format_rows(rows: list[dict]) -> str:
    header = ("encoding", "backend", "T", "ms", "time / eager")
    body = [(r["encoding"], r["backend"], str(r["length"]), f"{r['ms']:.2f}", f"{r['vs_eager']:.2f}") for r in rows]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    return "\n".join(lines + ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in body])
