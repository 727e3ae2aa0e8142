"""Self-Extend (Jin et al. 2024, arXiv:2401.01325): a RoPE model reads past its context with no training.

Within ``window`` tokens of a query, attention uses the exact positions. Beyond it, keys sit at grouped
positions ``⌊j/G⌋`` and the query at ``⌊i/G⌋ + window − ⌊window/G⌋``, so the grouped distance equals the exact
one at the window's edge and grows G times more slowly after it; the two score sets are merged before one
softmax (``kernels.two_scores``). With ``group=None`` the far side is ReRoPE's clipped distance (Su 2023):
every key past the window is read at distance ``window``.

The largest distance a query at position T − 1 then sees is ``(T − 1)//G + window − window//G``; it must stay
below the model's original context, which ``smallest_group`` ensures.

Two fronts, one computation: ``self_extend_attention`` takes posenc's RoPE and unrotated q, k;
``use_self_extend`` plugs into a transformers model through its ``AttentionInterface`` registry, where q and k
arrive rotated at their positions p and the grouped copies are one more rotation, by g(p) − p.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .. import checks
from ..encodings.rotary import RoPE, apply_rope
from ..kernels.two_scores import two_score_attention
from ..positions import default_positions


def check_self_extend(window: int, group: int | None, target: int | None = None) -> None:
    checks.positive_int("self-extend window", window)
    if group is not None:
        checks.positive_int("self-extend group", group, minimum=2)
    if target is not None and window >= target:
        raise ValueError(f"self-extend window ({window}) must be below --to ({target}): a window that covers "
                         "the whole context leaves nothing to group")


def grouped_positions(positions: Tensor, window: int, group: int | None) -> tuple[Tensor, Tensor]:
    """(query positions, key positions) of the far side, for exact ``positions`` (any shape, int64)."""
    if group is None:  # ReRoPE: every far key at distance `window`
        return torch.full_like(positions, window), torch.zeros_like(positions)
    return positions // group + window - window // group, positions // group


def grouped(window: int, group: int | None):
    """The far side's position map of Self-Extend (ReRoPE for ``group=None``): (q_pos, k_pos) -> far positions."""
    return lambda q_pos, k_pos: (grouped_positions(q_pos, window, group)[0], grouped_positions(k_pos, window, group)[1])


def farthest_distance(length: int, window: int, group: int | None) -> int:
    """The largest distance a query at position length − 1 reads (exact inside the window, grouped beyond)."""
    if length <= window:
        return length - 1
    return window if group is None else (length - 1) // group + window - window // group


def smallest_group(original: int, target: int, window: int) -> int:
    """The smallest group size G >= 2 that keeps every distance of a ``target``-token sequence below ``original``."""
    if window >= original:
        raise ValueError(f"self-extend window ({window}) must be below the model's context ({original})")
    group = 2
    while farthest_distance(target, window, group) > original - 1:
        group += 1
    return group


def self_extend_attention(q: Tensor, k: Tensor, v: Tensor, rope: RoPE, window: int, group: int | None, *,
                          q_positions: Tensor | None = None, k_positions: Tensor | None = None,
                          mask: Tensor | None = None, scale: float | None = None) -> Tensor:
    """Causal Self-Extend attention with posenc's RoPE.

    q: (B, H, Tq, Dh), k: (B, Hkv, Tk, Dh), v: (B, Hkv, Tk, Dv), unrotated; positions as in ``posenc.attention``
    (default: keys 0..Tk−1, queries the last Tq). Returns (B, H, Tq, Dv).
    """
    check_self_extend(window, group)
    default_q, default_k = default_positions(q.shape[2], k.shape[2], q.device)
    q_pos = default_q if q_positions is None else checks.positions("q_positions", q_positions, q.shape[2], q.shape[0])
    k_pos = default_k if k_positions is None else checks.positions("k_positions", k_positions, k.shape[2], k.shape[0])
    q_near, k_near = rope.rotate(q, k, q_pos, k_pos)
    q_group, _ = grouped_positions(q_pos, window, group)
    _, k_group = grouped_positions(k_pos, window, group)
    q_far, k_far = rope.rotate(q, k, q_group, k_group)
    return two_score_attention(q_near, k_near, q_far, k_far, v, q_pos, k_pos, window,
                               scale=q.shape[-1] ** -0.5 if scale is None else scale, mask=mask)


def _rotated_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                       *, inv_freq: Tensor, window: int, far, logit_factor: float = 1.0, scaling: float | None = None,
                       position_ids: Tensor | None = None, **_) -> tuple[Tensor, None]:
    """transformers' attention-function signature: query (B, H, Tq, Dh) and key (B, Hkv, Tk, Dh) already rotated
    at their positions (keys at 0..Tk−1: one unpadded sequence per row). ``far(q_pos, k_pos)``: the far side's
    positions (Self-Extend's ``grouped``, STRING's ``shifted``); ``logit_factor`` multiplies both logit sets.
    Returns ((B, Tq, H, Dv), None)."""
    q_pos, k_pos = default_positions(query.shape[2], key.shape[2], query.device)
    if position_ids is not None and not bool((position_ids.to(q_pos.device) == q_pos).all()):
        raise ValueError("self-extend and STRING in a transformers model need each row's positions to be 0..T−1 "
                         "(one unpadded sequence per row, keys cached in order)")
    q_moved, k_moved = far(q_pos, k_pos)
    inv_freq = inv_freq.to(query.device)  # already-applied rotation + (g(p) − p) = rotation at g(p)
    q_far = apply_rope(query, q_moved - q_pos, inv_freq)
    k_far = apply_rope(key, k_moved - k_pos, inv_freq)
    allowed = attention_mask
    if allowed is not None and allowed.dtype != torch.bool:  # an additive mask: 0 where allowed, very negative not
        allowed = allowed == 0
    scale = (query.shape[-1] ** -0.5 if scaling is None else scaling) * logit_factor
    out = two_score_attention(query, key, q_far, k_far, value, q_pos, k_pos, window, scale=scale, mask=allowed)
    return out.transpose(1, 2).contiguous(), None


def use_self_extend(model, window: int, group: int | None) -> str:
    """Switch a transformers RoPE model's attention to Self-Extend (``group=None``: ReRoPE); returns the
    registered implementation's name. ``use_attention(model, "sdpa")`` switches back.

    The extra rotation uses the model's own frequencies (its rotary module's ``inv_freq``), so it composes
    with whatever scaling the model carries; the attention factor, already in q and k, is not applied twice.
    """
    check_self_extend(window, group)
    return use_two_positions(model, f"posenc_self_extend_w{window}_g{group or 'clip'}", window, grouped(window, group))


def use_two_positions(model, name: str, window: int, far, logit_factor: float = 1.0) -> str:
    """Register ``name`` as a transformers attention function whose pairs at distance >= ``window`` are read at
    the positions ``far(q_pos, k_pos)`` gives, and switch ``model`` to it."""
    from transformers import AttentionInterface

    inv_freq = model.model.rotary_emb.inv_freq.detach().float().cpu()
    AttentionInterface.register(name, functools.partial(_rotated_attention, inv_freq=inv_freq, window=window,
                                                        far=far, logit_factor=logit_factor))
    use_attention(model, name)
    return name


def use_attention(model, name: str) -> None:
    """Set a transformers model's attention implementation (every layer reads it from the config)."""
    model.set_attn_implementation(name)
