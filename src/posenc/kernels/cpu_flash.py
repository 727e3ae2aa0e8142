"""SDPA's CPU flash kernel, called directly where a kernel needs what ``scaled_dot_product_attention`` does not
return: each row's log-sum-exp (to merge softmaxes over separate key spans: ``kernels.two_scores``, DCA's spans)
or a causal flag beside a float mask (``kernels.blockwise``)."""

from __future__ import annotations

import torch
from torch import Tensor

NAME = "_scaled_dot_product_flash_attention_for_cpu"  # returns (out, logsumexp); NAME + "_backward" its gradients


def available(q: Tensor) -> bool:
    """Whether the kernel runs on q's device with this torch (CPU only)."""
    return q.device.type == "cpu" and hasattr(torch.ops.aten, NAME)


def forward(*args, **kwargs) -> tuple[Tensor, Tensor]:
    """(out (B, H, Tq, Dv), logsumexp (B, H, Tq)) for ``torch.ops.aten`` 's op's arguments."""
    return getattr(torch.ops.aten, NAME)(*args, **kwargs)
