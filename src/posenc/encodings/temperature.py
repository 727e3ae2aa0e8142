"""Attention temperature: queries scaled by a function of their position, sharpening attention far into a
sequence, where a softmax over many keys flattens (Nakanishi 2025, "Scalable-Softmax Is Superior for
Attention", arXiv:2501.19399).

Two forms, both a factor per query position p applied to q after its rotation (so to every logit of the query):
  - ``llama4``: Llama 4's ``attn_temperature_tuning``, on its layers without RoPE:
    ``1 + beta · log(1 + ⌊(p + 1) / floor⌋)`` (transformers: ``attn_scale`` = beta 0.1, ``floor_scale`` = 8192), so
    1 for the first floor − 1 positions and rising by steps of the log beyond;
  - ``log_n``: the paper's scalable softmax, logits times ``s · log n`` with n the number of keys a causal query
    sees from the start of its sequence, n = p + 1 (s fixed here; the paper learns one per head).

Any encoding takes one: ``posenc.build(name, ..., temperature={"kind": "llama4", "beta": 0.1, "floor": 8192})``.
The factor is computed in float32 (float64 for float64 queries) from the positions alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .. import checks

KINDS = ("llama4", "log_n")


@dataclass(frozen=True)
class QueryTemperature:
    kind: str
    beta: float = 0.1  # llama4: the log's weight (transformers' attn_scale)
    floor: int = 8192  # llama4: positions per step (transformers' floor_scale)
    s: float = 1.0  # log_n: the scale of log n

    @classmethod
    def from_dict(cls, spec: dict) -> QueryTemperature:
        """From ``{"kind": ..., <its fields>}``; one ValueError naming what is wrong."""
        if not isinstance(spec, dict) or "kind" not in spec:
            raise ValueError(f"temperature must be a dict with a 'kind' ({', '.join(KINDS)}), got {spec!r}")
        checks.choice("temperature kind", spec["kind"], KINDS)
        fields = {"llama4": {"beta", "floor"}, "log_n": {"s"}}[spec["kind"]]
        unknown = sorted(set(spec) - fields - {"kind"})
        if unknown:
            raise ValueError(f"temperature {spec['kind']!r} takes {sorted(fields)}, got unknown {unknown}")
        made = cls(**spec)
        checks.positive_float("temperature beta", made.beta, inclusive=True)
        checks.positive_int("temperature floor", made.floor)
        checks.positive_float("temperature s", made.s)
        return made

    def scale(self, q_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """The factor per query position: q_pos (B or 1, Tq) int64 -> (B or 1, Tq) in ``dtype``."""
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        p = q_pos.to(compute)
        if self.kind == "llama4":
            return 1.0 + self.beta * torch.log1p(torch.floor((p + 1.0) / self.floor))
        return self.s * torch.log(p + 1.0)

    def apply(self, q: Tensor, q_pos: Tensor) -> Tensor:
        """q (B, H, Tq, Dh) scaled per query position, in q's dtype."""
        return (q * self.scale(q_pos, q.dtype)[:, None, :, None]).to(q.dtype)
