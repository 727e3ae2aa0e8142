"""The forms a score term runs in inside ``attention``'s sdpa backend, and which of them a call offers to
``dispatch``'s timing. Each ``Form`` declares, by trait, which encodings it serves and on which calls:

  - for weights or value terms a float mask cannot carry, one form or none (then ``attention`` computes as eager
    does): ``sticks`` (stick-breaking's weights inside ``sticks``) and ``band`` (Shaw's terms as a table of its
    nearest offsets inside ``offset_lookup``'s tiles, KV-cache steps too; on a GPU, once checked there, inside
    ``lookups_triton``'s; elsewhere as a band of diagonals, ``band``);
  - for score terms, every form that serves is timed: ``counts`` (CoPE inside ``gated_counts``; on a GPU inside
    ``counts_triton``'s tiles), ``gates`` (FoX's c_i − c_j inside ``offset_bias``), ``table`` (a bias of offsets
    there too), ``segments`` (FIRE's MLP as linear segments per pair there, at any query position), ``lookups``
    (Transformer-XL inside ``offset_lookup``; on a GPU inside ``lookups_triton``'s tiles), ``channels`` (extra
    q/k channels) and ``mask`` (a float mask on SDPA or ``blockwise``); on a GPU ``tiles`` (an
    offset table, FIRE's segments or FoX's token values inside ``tiles_triton``'s tiles) and ``flex``
    (FlexAttention's score_mod). The Triton kernels not yet run on a GPU are offered there only when asked for
    (``tiles_triton.offered_once_checked``).

A kernel that serves one kind of encoding says what it reads from it as a ``Protocol`` in its own module
(``gated_counts.GatedCounts``, ``offset_lookup.OffsetLookups``, ``sticks.BreaksSticks``, ``band.Banded``): an
encoding with those members is served, whatever its name.

Every form is ``form(q, k, v, at, causal, mask, scale, plain_causal) -> (B, H, Tq, Dv)`` with q (B, H, Tq, Dh) and k
(B, Hkv, Tk, Dh) already rotated, v (B, Hkv, Tk, Dv) and ``at`` the encoding at its positions (a
``PositionedEncoding``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from . import band, blockwise, gated_counts, offset_bias, offset_lookup, sticks, triton_available
from .channels import attend_with_channels
from .flex import FLEX_DTYPES, flex_backend


@dataclass(frozen=True)
class Form:
    """A way to run an encoding's terms: ``run`` serves the encodings ``accepts(encoding)`` admits (a trait of
    the encoding, never its name), on the calls ``fits(q, at, causal, mask, plain_causal)`` admits. Where it serves
    and ``spares_mask(encoding)``, the float mask is not offered beside it: the mask would keep a (B, H, Tq, Tk)
    tensor for the backward."""

    name: str
    run: Callable[..., Tensor]
    accepts: Callable[..., bool]
    fits: Callable[..., bool]
    spares_mask: Callable[..., bool] = lambda encoding: False

    def serves(self, q: Tensor, at, causal: bool, mask: Tensor | None, plain_causal: bool) -> bool:
        return self.accepts(at.encoding) and self.fits(q, at, causal, mask, plain_causal)


def allowed_pairs(q_pos: Tensor, k_pos: Tensor, causal: bool, mask: Tensor | None, itself: bool = True) -> Tensor | None:
    """Bool (B or 1, 1 or H, Tq, Tk) of the pairs that may attend, or None for all; ``itself``: causally, a query
    may attend to the key at its own position."""
    earlier = (k_pos[:, None, :] <= q_pos[:, :, None]) if itself else (k_pos[:, None, :] < q_pos[:, :, None])
    allowed = earlier.unsqueeze(1) if causal else None
    if mask is not None:
        allowed = mask if allowed is None else allowed & mask
    return allowed


def score_forms(q, at, causal, mask, plain_causal) -> dict:
    """The forms that serve this call, {name: form(q, k, v, at, causal, mask, scale, plain_causal)}. For weights or
    value terms a mask cannot carry: the one of ``WHOLE_FORMS`` that serves, or none. For score terms: every form
    that serves, to be timed (on a GPU those of ``gpu_score_forms``); inside a compiled graph the one a rule picks
    (channels where ``channels_serve`` says, else the mask)."""
    encoding = at.encoding
    if encoding.replaces_softmax or encoding.has_relative_values:
        return {f.name: f.run for f in WHOLE_FORMS if f.serves(q, at, causal, mask, plain_causal)}
    if torch.compiler.is_compiling():
        return {"channels": _channel_form} if at.channels_serve(q.dtype) else {"mask": _mask_form}
    if q.device.type != "cpu":
        return gpu_score_forms(q, at, causal, mask, plain_causal)
    offered = [f for f in CPU_FORMS if f.serves(q, at, causal, mask, plain_causal)]
    forms = {f.name: f.run for f in offered}
    return forms if any(f.spares_mask(encoding) for f in offered) else {**forms, "mask": _mask_form}


def gpu_score_forms(q: Tensor, at, causal: bool, mask: Tensor | None, plain_causal: bool) -> dict:
    """``score_forms`` on a GPU: the ``GPU_FORMS`` that serve. Where one of ``OWN_TILES`` serves (the encoding's
    terms inside Triton tiles: Transformer-XL's lookups, CoPE's counts, a bias of offsets, FIRE's or FoX's), it
    beside the q/k channels where they are exact, and nothing else: no form offered then builds a (B, H, Tq, Tk)
    tensor, so timing them cannot run out of memory; a tile formula not yet checked on a GPU
    (``tiles_triton.CHECKED_ON_GPU``) also gets the float mask (by query blocks past their budget), which the
    timing keeps should the tiles fail. Elsewhere the channels, FlexAttention's score_mod (``FLEX``) and the float
    mask, unless a form offered spares it."""
    offered = [form for form in GPU_FORMS if form.serves(q, at, causal, mask, plain_causal)]
    if any(form in OWN_TILES for form in offered):
        kept = {form.name: form.run for form in offered if form is not FLEX}
        formula = offset_formula(at, q.device) if TILES in offered else None
        unchecked = formula is not None and formula.kind not in tiles_triton().CHECKED_ON_GPU
        return {**kept, **({"mask": _mask_form} if unchecked else {})}
    forms = {form.name: form.run for form in offered}
    return forms if any(form.spares_mask(at.encoding) for form in offered) else {**forms, "mask": _mask_form}


def tiles_serve(q: Tensor, at, causal: bool) -> bool:
    """Whether ``tiles_triton`` runs these score terms on q's device: Triton there, at a head width its tiles fit,
    and a bias of offsets at any positions (a formula, or ``PositionedEncoding.spanning_offset_table``) or FoX's
    token values at the model's own positions."""
    encoding = at.encoding
    if not encoding.has_bias or encoding.has_relative_logits or encoding.has_relative_values or (
            not triton_available()) or not tiles_triton().offered(q):
        return False
    if encoding.has_token_gates:
        return causal and at.contiguous and at.log_forget is not None
    return offset_formula(at, q.device) is not None or at.spanning_offset_table(causal) is not None


def offset_formula(at, device: torch.device):
    """The encoding's ``offset_formula`` as a ``tiles_triton.Formula`` on ``device``, built once per forward (the
    layers of a model share it); None where it has none."""
    def build():
        formula = at.encoding.offset_formula()
        return None if formula is None else tiles_triton().Formula(formula[0], formula[1].to(device))
    return at.memo(("offset_formula", device), build)


def tiles_triton():
    """The ``tiles_triton`` module, imported on first use (Triton is optional)."""
    from . import tiles_triton as module

    return module


def _tiles_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    kernel, encoding = tiles_triton(), at.encoding
    if encoding.has_token_gates:
        return kernel.tiled_attention(q, k, v, scale=scale, causal=causal, token_values=at.cumulative_gates())
    positions = {} if at.contiguous else {"q_pos": at.q_pos, "k_pos": at.k_pos}
    formula = offset_formula(at, q.device)
    if formula is not None:
        return kernel.tiled_attention(q, k, v, scale=scale, causal=causal, formula=formula, **positions)
    table, lowest = at.spanning_offset_table(causal)
    highest = lowest + table.shape[1] - 1
    runs = at.memo(("flat_offsets", lowest, highest), lambda: encoding.flat_offsets(lowest, highest))
    flat = None if runs is None else (runs[0] - lowest, runs[1] - lowest)
    return kernel.tiled_attention(q, k, v, scale=scale, causal=causal, table=table, lowest=lowest, flat=flat,
                                  **positions)


def _table_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    table, lowest = at.offset_table(causal, math_dtype(q.dtype))
    return offset_bias.offset_bias_attention(q, k, v, table, lowest, scale=scale, causal=causal)


def _no_offset_bias(q: Tensor, k: Tensor, causal: bool) -> tuple[Tensor, int]:
    """(table, lowest) of zeros for ``offset_bias``: a call whose bias is all per pair."""
    lowest, highest = offset_bias.offsets(q.shape[2], k.shape[2], causal)
    return q.new_zeros(q.shape[1], highest - lowest + 1, dtype=math_dtype(q.dtype)), lowest


def _gate_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    return offset_bias.offset_bias_attention(q, k, v, *_no_offset_bias(q, k, causal), scale=scale, causal=causal,
                                             token_values=at.cumulative_gates())


def _segments_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    compute = math_dtype(q.dtype)
    segments = at.memo(("distance_segments", compute), lambda: at.encoding.distance_segments(compute))
    first_position = int(at.k_pos[0, 0]) if at.k_pos.shape[-1] else 0
    return offset_bias.offset_bias_attention(q, k, v, *_no_offset_bias(q, k, causal), scale=scale, causal=causal,
                                             segments=segments, first_position=first_position)


def _counts_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    table, gate_scale = at.counts_table()
    if triton_counts(q):  # a GPU: the Triton tiles, which read grouped k and v heads as they are
        return counts_triton().counts_attention(q, k, v, table, scale=scale, gate_scale=gate_scale)
    k, v = repeat_kv_heads(k, q.shape[1]), repeat_kv_heads(v, q.shape[1])
    return gated_counts.gated_counts_attention(q, k, v, table, scale=scale, gate_scale=gate_scale)


def _lookup_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    table, content_shift, lookup_shift = at.offset_lookup_parts(k.shape[2], math_dtype(q.dtype))  # never bf16
    return _in_lookup_tiles(q, k, v, table, content_shift=content_shift, lookup_shift=lookup_shift, scale=scale)


def _in_lookup_tiles(q: Tensor, k: Tensor, v: Tensor, table: Tensor, **terms) -> Tensor:
    """Offset-lookup attention (``offset_lookup_attention``'s arguments): on a GPU inside the Triton tiles, which
    read grouped k and v heads as they are; on CPU inside the C++ tiles."""
    if triton_lookups(q):
        return lookups_triton().lookup_attention(q, k, v, table, **terms)
    k, v = repeat_kv_heads(k, q.shape[1]), repeat_kv_heads(v, q.shape[1])
    return offset_lookup.offset_lookup_attention(q, k, v, table, **terms)


def _channel_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    skip_upper = plain_causal and mask is None  # the causal fast path, and no mask at all
    allowed = None if skip_upper else allowed_pairs(at.q_pos, at.k_pos, causal, mask)
    content, query_side, key_side = at.score_channel_parts(q, k, scale)
    return attend_with_channels(content, k, v, query_side, key_side, scale=scale, is_causal=skip_upper,
                                allowed=allowed)


def _mask_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    encoding = at.encoding
    if encoding.has_relative_logits:
        allowed = allowed_pairs(at.q_pos, at.k_pos, causal, mask)
        compute = math_dtype(q.dtype)  # content-position terms, like biases, never run in bf16
        additive = at.relative_logits(q.to(compute), k.to(compute), allowed, scale)
        if encoding.has_bias:
            additive = additive + at.score_bias(compute)
        attn_mask = masked(additive, allowed)
    elif mask is None:  # the usual case in a model: one mask for every layer
        attn_mask = at.memo(("sdpa_mask", causal, q.dtype), lambda: static_mask(at, causal, q.dtype))
    else:
        attn_mask = static_mask(at, causal, q.dtype, mask)
    if attn_mask is not None and attn_mask.is_floating_point() and blockwise.available(q) and (
            attn_mask.requires_grad or plain_causal and k.shape[2] >= blockwise.CPU_CAUSAL_MASK_FROM_KEYS):
        # SDPA would fall back to its math path for a mask that needs a gradient, and with a mask it visits
        # every block of the upper triangle, which the fused kernel skips when told the mask is causal
        return blockwise.blockwise_attention(q, k, v, attn_mask, scale=scale, causal=plain_causal)
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.to(q.dtype)
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale, **gqa)


def sticks_serve(q: Tensor) -> bool:
    """Whether a stick-breaking kernel runs on q here: the C++ one on CPU, the Triton one on a GPU
    (``sticks_triton.offered``: once checked there)."""
    return sticks.serves(q) or (triton_available() and sticks_triton().offered(q))


def lookups_serve(q: Tensor) -> bool:
    """Whether an offset-lookup kernel runs on q here: the C++ one on CPU, the Triton one on a GPU."""
    return offset_lookup.serves(q) or triton_lookups(q)


def triton_lookups(q: Tensor) -> bool:
    """Whether ``lookups_triton`` runs Transformer-XL's lookups and Shaw's band for q: on a GPU, once checked
    there (``lookups_triton.offered``)."""
    return q.device.type != "cpu" and triton_available() and lookups_triton().offered(q)


def triton_counts(q: Tensor) -> bool:
    """Whether ``counts_triton`` runs CoPE for q: on a GPU, once checked there (``counts_triton.offered``)."""
    return q.device.type != "cpu" and triton_available() and counts_triton().offered(q)


def counts_triton():
    """The ``counts_triton`` module, imported on first use (Triton is optional)."""
    from . import counts_triton as module

    return module


def lookups_triton():
    """The ``lookups_triton`` module, imported on first use (Triton is optional)."""
    from . import lookups_triton as module

    return module


def sticks_triton():
    """The ``sticks_triton`` module, imported on first use (Triton is optional)."""
    from . import sticks_triton as module

    return module


def _sticks_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    current = at.encoding.stick_breaking_current()
    if not sticks.serves(q):  # a GPU: the Triton tiles, which read grouped k and v heads as they are
        return sticks_triton().stick_breaking_attention(q, k, v, scale=scale, attend_current=current)
    k, v = repeat_kv_heads(k, q.shape[1]), repeat_kv_heads(v, q.shape[1])
    return sticks.stick_breaking_attention(q, k, v, scale=scale, attend_current=current)


def _band_form(q, k, v, at, causal, mask, scale, plain_causal) -> Tensor:
    key_band, value_band, value_floor = at.encoding.band_parts(math_dtype(q.dtype))
    if not lookups_serve(q):  # inside a torch.compile graph, no C++ build, a GPU where Triton is not checked
        return band.band_attention(q, k, v, key_band, value_band, value_floor, scale=scale)
    # the band as a table of K offsets, one for every head
    return _in_lookup_tiles(q, k, v, key_band[None], values=value_band[None], value_floor=value_floor, scale=scale)


def _own_positions(q, at, causal, mask, plain_causal) -> bool:
    """A causal call at the model's own positions (a training step, a prefill, a KV-cache step), no mask."""
    return causal and mask is None and at.contiguous


STICKS = Form("sticks", _sticks_form, lambda e: e.replaces_softmax and isinstance(e, sticks.BreaksSticks),
              lambda q, at, causal, mask, plain: at.contiguous and mask is None and sticks_serve(q))
BAND = Form("band", _band_form,
            lambda e: e.has_relative_values and isinstance(e, band.Banded) and e.has_band_form,
            lambda q, at, causal, mask, plain: mask is None and (plain or (
                _own_positions(q, at, causal, mask, plain) and lookups_serve(q))))
#: the forms of weights or value terms that a float mask cannot carry
WHOLE_FORMS = (STICKS, BAND)
LOOKUPS = Form("lookups", _lookup_form,
               lambda e: e.has_relative_logits and not e.has_bias and isinstance(e, offset_lookup.OffsetLookups),
               lambda q, *call: _own_positions(q, *call) and lookups_serve(q))
COUNTS = Form("counts", _counts_form,
              lambda e: e.has_relative_logits and not e.has_bias and isinstance(e, gated_counts.GatedCounts),
              lambda q, at, *call: _own_positions(q, at, *call) and (gated_counts.serves(q) or triton_counts(q)),
              spares_mask=lambda e: True)
CHANNELS = Form("channels", _channel_form, lambda e: e.has_score_channels,
                lambda q, at, *rest: at.channels_exact(q.dtype), spares_mask=lambda e: e.has_relative_logits)

#: the forms of score terms on CPU, in the order ``dispatch`` times them; the mask form comes last unless spared
CPU_FORMS = (
    COUNTS,
    Form("gates", _gate_form, lambda e: e.has_token_gates,
         lambda q, *call: _own_positions(q, *call) and offset_bias.serves(q), spares_mask=lambda e: True),
    Form("table", _table_form, lambda e: e.has_bias and not e.has_relative_logits,
         lambda q, at, causal, mask, plain: mask is None and offset_bias.serves(q) and (
             at.offset_table(causal, math_dtype(q.dtype)) is not None)),
    Form("segments", _segments_form, lambda e: e.has_bias and isinstance(e, offset_bias.DistanceSegments),
         lambda q, at, causal, mask, plain: mask is None and at.contiguous and offset_bias.serves(q),
         spares_mask=lambda e: True),
    LOOKUPS,
    CHANNELS,
)
TILES = Form("tiles", _tiles_form,
             lambda e: e.has_bias and not e.has_relative_logits and not e.has_relative_values,
             lambda q, at, causal, mask, plain: mask is None and tiles_serve(q, at, causal))
#: FlexAttention's compiled score_mod for an offset bias of a full sequence: not for a KV-cache step, whose shape
#: changes every call while the compiled kernel is specialised to shapes; not for a bias that also reads the
#: query's position, whose captured dense bias crashed FlexAttention's compiled backward at 16,384 tokens on an H200
FLEX = Form("flex", flex_backend, lambda e: e.has_bias and e.bias_from_offset and not e.has_relative_logits,
            lambda q, at, *rest: q.dtype in FLEX_DTYPES and at.q_pos.shape[-1] == at.k_pos.shape[-1])
#: the forms of score terms on a GPU, in the order ``dispatch`` times them (the mask comes last unless spared)
GPU_FORMS = (LOOKUPS, COUNTS, TILES, CHANNELS, FLEX)
#: the encoding's own terms inside Triton tiles: where one serves, neither flex nor the mask is offered beside it
OWN_TILES = (LOOKUPS, COUNTS, TILES)


def repeat_kv_heads(x: Tensor, heads: int) -> Tensor:
    """Grouped-query attention: (B, Hkv, T, D) -> (B, H, T, D), each K/V head serving H/Hkv query heads."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for every other dtype: biases and softmax never run in bf16."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def masked(additive: Tensor, allowed: Tensor | None) -> Tensor:
    return additive if allowed is None else additive.masked_fill(~allowed, float("-inf"))


def static_mask(at, causal: bool, dtype: torch.dtype, mask: Tensor | None = None) -> Tensor | None:
    """SDPA's attn_mask from positions alone: the score bias with -inf where not allowed, or a bool mask."""
    allowed = allowed_pairs(at.q_pos, at.k_pos, causal, mask)
    if not at.encoding.has_bias:
        return allowed
    return masked(at.score_bias(math_dtype(dtype)), allowed).to(dtype)
