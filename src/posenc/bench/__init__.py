"""``posenc bench``: speed and memory, always as ratios to a baseline measured in the same run.

Tables (each a function returning rows of plain dicts):
  - ``attention``: ``attention()`` per encoding and backend, time / eager.
  - ``training``: a training step of the default preset's model per encoding, time / NoPE.
  - ``rope``: RoPE apply on q and k, time / ``copy_`` of the same bytes, beside peers.
  - ``forms``: ALiBi and Transformer-XL as a bias vs as q/k channels, attention fwd+bwd / NoPE.
  - ``memory``: activation memory of a training step per encoding, bytes / NoPE's.
  - ``long`` (``long_context``, for a GPU): attention forward+backward at long context per encoding, beside
    FlexAttention's causal and ALiBi recipes, time / SDPA without positions, and peak memory; each row in its own
    process (``python -m posenc.bench.long_context``, which is why this package does not import it).
Timings are round-robin (``timing.round_robin``): one call of each contender per round,
per-round ratios, medians and quartiles over rounds.
"""

from __future__ import annotations

from .attention import bench_attention
from .forms import bench_score_forms
from .machine import describe, one_line
from .report import TABLES, markdown, plain
from .rope_apply import bench_rope_apply
from .training import bench_activation_memory, bench_training_step, saved_activation_bytes

__all__ = ["TABLES", "bench_activation_memory", "bench_attention", "bench_rope_apply", "bench_score_forms",
           "bench_training_step", "describe", "markdown", "one_line", "plain", "saved_activation_bytes"]
