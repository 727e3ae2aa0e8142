"""STRING (An et al. 2024, arXiv:2410.18745, "Why Does the Effective Context Length of LLMs Fall Short?"): a RoPE
model reads with its well-trained small distances only, no training.

Pairs closer than ``shift`` keep their exact distance d; farther pairs are read with the query moved back by
``shift − local``, at distance d − shift + local, so the largest distances — the rarely trained ones, or those
past the context — are never used, and every far pair stays at least ``local`` apart. Both logit sets are scaled
by the reference code's attention factor squared, (1 + 0.1·ln 2)², which it multiplies into cos and sin (q and k
each) to sharpen the flatter attention. The two sets merge before one softmax (``kernels.two_scores``, as
Self-Extend's). The reference's fused version also counts the key at distance exactly ``shift`` in both sets;
here it is a far key only, as the position map says.

The largest distance a query at position T − 1 sees is T − 1 − shift + local; ``smallest_shift`` keeps it inside
the model's context, and never below the paper's in-context choice of a third of it.
"""

from __future__ import annotations

import math

from torch import Tensor

from .. import checks
from ..encodings.rotary import RoPE
from ..kernels.two_scores import two_score_attention
from ..positions import default_positions
from .self_extend import use_two_positions

ATTENTION_FACTOR = 1 + 0.1 * math.log(2)  # on cos and sin in the reference: logits times its square


def check_string(shift: int, local: int) -> None:
    checks.positive_int("string shift", shift)
    checks.positive_int("string local window", local, minimum=0)
    if local >= shift:
        raise ValueError(f"string local window ({local}) must be below the shift ({shift}): far pairs would read "
                         "farther than they are")


def shifted(shift: int, local: int):
    """STRING's far side: (q_pos, k_pos) -> (q_pos − shift + local, k_pos)."""
    return lambda q_pos, k_pos: (q_pos - shift + local, k_pos)


def farthest_distance(length: int, shift: int, local: int) -> int:
    """The largest distance a query at position length − 1 reads."""
    return length - 1 if length <= shift else length - 1 - shift + local


def smallest_shift(original: int, target: int, local: int) -> int:
    """The smallest shift keeping every distance of a ``target``-token sequence below ``original``, and at least a
    third of ``original`` (the paper's in-context setting)."""
    if local >= original:
        raise ValueError(f"string local window ({local}) must be below the model's context ({original})")
    return max(target - original + local, round(original / 3), local + 1)


def string_attention(q: Tensor, k: Tensor, v: Tensor, rope: RoPE, shift: int, local: int, *,
                     q_positions: Tensor | None = None, k_positions: Tensor | None = None, mask: Tensor | None = None,
                     scale: float | None = None) -> Tensor:
    """Causal STRING attention with posenc's RoPE. q: (B, H, Tq, Dh), k: (B, Hkv, Tk, Dh), v: (B, Hkv, Tk, Dv),
    unrotated; positions as in ``posenc.attention``. Returns (B, H, Tq, Dv)."""
    check_string(shift, local)
    default_q, default_k = default_positions(q.shape[2], k.shape[2], q.device)
    q_pos = default_q if q_positions is None else checks.positions("q_positions", q_positions, q.shape[2], q.shape[0])
    k_pos = default_k if k_positions is None else checks.positions("k_positions", k_positions, k.shape[2], k.shape[0])
    q_near, k_near = rope.rotate(q, k, q_pos, k_pos)
    q_far, k_far = rope.rotate(q, k, *shifted(shift, local)(q_pos, k_pos))
    scale = (q.shape[-1] ** -0.5 if scale is None else scale) * ATTENTION_FACTOR**2
    return two_score_attention(q_near, k_near, q_far, k_far, v, q_pos, k_pos, shift, scale=scale, mask=mask)


def use_string(model, shift: int, local: int) -> str:
    """Switch a transformers RoPE model's attention to STRING; ``self_extend.use_attention(model, "sdpa")`` switches
    back. The extra rotation uses the model's own frequencies, so it composes with its scaling."""
    check_string(shift, local)
    return use_two_positions(model, f"posenc_string_s{shift}_l{local}", shift, shifted(shift, local),
                             logit_factor=ATTENTION_FACTOR**2)
