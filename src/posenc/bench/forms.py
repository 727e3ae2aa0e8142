"""Score terms in each form ``attention()`` can run them in on CPU, per length: the bias as a table of offsets
inside ``kernels.offset_bias``, as a mask (SDPA, or the blockwise kernel), or as extra q/k channels. On CPU
``kernels.dispatch`` times the forms that serve a call at first use and runs the fastest; this table shows the
same race at the training step's shapes.

Forward and backward of one attention call with B·T = 4096 tokens (the training step's
budget), 4 heads of width 32 as in the default model; every form is timed against NoPE
on SDPA's causal path in the same round.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..encodings import build_for_model
from ..encodings.registry import having
from ..kernels import blockwise, offset_bias
from ..kernels.channels import attend_with_channels
from .timing import round_robin

HEADS, HEAD_DIM, TOKENS = 4, 32, 4096


def offset_terms() -> tuple[str, ...]:
    """The encodings whose score term has more than one form to time: a bias of the offset alone, or q/k channels."""
    return having(lambda cls: cls.has_score_channels or (cls.has_bias and cls.bias_from_offset))


def _bias_form(at, q, k, v, scale):
    """The reference door: the score terms as an additive mask, on SDPA, or on ``kernels.blockwise`` where it
    needs a gradient (Transformer-XL) or is long, as ``attention()`` runs them."""
    additive = at.score_bias(q.dtype) if at.encoding.has_bias else at.relative_logits(q, k, None, scale)
    allowed = at.k_pos[:, None, :] <= at.q_pos[:, :, None]
    mask = additive.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    if blockwise.available(q) and (mask.requires_grad or k.shape[2] >= blockwise.CPU_CAUSAL_MASK_FROM_KEYS):
        return blockwise.blockwise_attention(q, k, v, mask, scale=scale, causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _channel_form(at, q, k, v, scale):
    content, query_side, key_side = at.score_channel_parts(q, k, scale)
    return attend_with_channels(content, k, v, query_side, key_side, scale=scale, is_causal=True)


def _table_form(at, q, k, v, scale):
    table, lowest = at.offset_table(True, q.dtype)
    return offset_bias.offset_bias_attention(q, k, v, table, lowest, scale=scale, causal=True)


def bench_score_forms(device: str = "cpu", lengths=(64, 256, 512, 1024, 2048), rounds: int = 7) -> list[dict]:
    """Rows {encoding, form, length, batch, ms, ratio (to NoPE causal), ratio_low, ratio_high}."""
    device = torch.device(device)
    scale = HEAD_DIM**-0.5
    rows = []
    for length in lengths:
        batch = max(1, TOKENS // length)
        q, k, v = (torch.randn(batch, HEADS, length, HEAD_DIM, device=device, requires_grad=True) for _ in range(3))
        positions = torch.arange(length, device=device)[None]
        contenders = {"none (causal)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)}
        for name in offset_terms():
            enc = build_for_model(name, sizes={"head_dim": HEAD_DIM, "num_heads": HEADS}).to(device)
            at = lambda enc=enc: enc.at(positions, positions, contiguous=True)  # noqa: E731 - fresh tables per call
            if enc.has_bias and offset_bias.serves(q):
                contenders[f"{name} table"] = lambda at=at: _table_form(at(), q, k, v, scale)
            contenders[f"{name} bias"] = lambda at=at: _bias_form(at(), q, k, v, scale)
            if enc.has_score_channels:
                contenders[f"{name} channels"] = lambda at=at: _channel_form(at(), q, k, v, scale)
        timed = round_robin({name: (lambda fn=fn: fn().sum().backward()) for name, fn in contenders.items()},
                            baseline="none (causal)", rounds=rounds, device=device, label=f"score forms T={length}")
        rows += [{"encoding": name.split()[0], "form": name.split(maxsplit=1)[1], "length": length, "batch": batch,
                  **numbers} for name, numbers in timed.items()]
    return rows
