"""Dense attention one block of queries at a time, each block recomputed in the backward, so that an encoding with
no fused form on a GPU (CoPE, FIRE past its threshold, stick-breaking, a masked call) holds (B, H, rows, Tk)
logits at once instead of (B, H, Tq, Tk): memory linear in the keys, at the dense path's speed plus one
recomputed forward.

Shapes: B batch, H heads, Tq/Tk query/key lengths, Dh head width, Dv value width.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

#: logits (B·H·Tq·Tk elements) past which a GPU call goes by query blocks: 1 GiB of float32 per dense tensor
GPU_DENSE_ELEMENTS = 1 << 28


def needed(q: Tensor, k: Tensor) -> bool:
    """Whether q (B, H, Tq, Dh) against k (B, Hkv, Tk, Dh) should go by query blocks: on a GPU, past
    ``GPU_DENSE_ELEMENTS`` logits (on CPU the fused kernels and SDPA's own blocks already bound memory)."""
    return q.device.type == "cuda" and _elements(q, k) > GPU_DENSE_ELEMENTS


def rows_per_block(q: Tensor, k: Tensor) -> int:
    """Queries per block so one block's logits stay within ``GPU_DENSE_ELEMENTS``."""
    return max(1, GPU_DENSE_ELEMENTS // max(1, q.shape[0] * q.shape[1] * k.shape[2]))


def by_query_blocks(attend: Callable[[slice, Tensor], Tensor], q: Tensor, rows: int) -> Tensor:
    """``attend(rows, q[:, :, rows])`` for consecutive blocks of ``rows`` queries, joined along the queries: each
    block keeps only its inputs and output for the backward (``torch.utils.checkpoint``, non-reentrant, so the
    gradients of whatever ``attend`` reads, k, v and the encoding's parameters, flow too)."""
    outputs = []
    for start in range(0, q.shape[2], rows):
        block = slice(start, start + rows)
        if torch.is_grad_enabled():
            outputs.append(checkpoint(attend, block, q[:, :, block], use_reentrant=False))
        else:
            outputs.append(attend(block, q[:, :, block]))
    return torch.cat(outputs, dim=2)


def _elements(q: Tensor, k: Tensor) -> int:
    return q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2]
