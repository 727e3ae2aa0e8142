"""``attention()``: compose an encoding's doors with a backend.

Shapes: B batch, H heads, Tq/Tk query/key lengths, Dh head width, Dv value width. Logits are ``scale · (q·kᵀ +
content-position terms) + bias``, each term as its paper adds it: Shaw's and Transformer-XL's content-position terms
are scaled with q·kᵀ, CoPE's is added after the scale (``relative_logits_scaled = False``), score biases (ALiBi, T5)
are added unscaled. A NaN from an encoding is a ValueError naming it (CPU). Weights are their softmax, or, for an
encoding that replaces it (stick-breaking, causal only), its ``weights(logits, allowed)``, which only eager serves.

Backends (every one agrees with ``eager``; the tests say so for every encoding):
  - ``eager``: the reference; logits materialized in float32 (float64 for float64 inputs); serves every encoding.
  - ``sdpa``: ``scaled_dot_product_attention``. Score terms that factor into query and key sides (causal ALiBi,
    Transformer-XL) ride along q and k as extra channels (``score_channels``), so the fused causal path runs them
    with no bias tensor, wherever that stays within ``verify``'s tolerance; other biases are folded into a float
    mask. On CPU, a mask that needs a gradient (a learned bias) and channels much wider than v run on
    ``kernels.blockwise`` (query blocks, hand-written backward), where SDPA would fall back to its math path or pad
    v. A value-side term is served only where it has a band form (Shaw at integer offsets): causal attention at the
    model's own positions runs as attention plus K diagonals (inside ``kernels.offset_lookup``'s tiles on CPU, KV-cache
    steps too; ``kernels.band`` where those do not serve, and there no KV-cache step), other calls (bidirectional,
    a mask, explicit positions) compute as eager does.
  - ``flex``: FlexAttention; the bias is a ``score_mod`` and the masks a block mask, so no H×Tq×Tk tensor is built;
    serves the input, rotation and bias doors. It is compiled on CUDA (``POSENC_FLEX_COMPILE=1`` compiles on CPU
    too, with the system compiler; ``0`` never compiles); it has no backward pass on CPU.
  - ``auto``: sdpa where it serves, else eager. On a GPU sdpa offers the Triton tiles (``kernels.tiles_triton``)
    where they serve, else times its forms for a bias (q/k channels, a float mask, FlexAttention's score_mod) at
    first use per shape, as on CPU (``kernels.dispatch``). On a GPU, dense logits past ``query_blocks``' budget
    (eager, or a float mask) are formed one block of queries at a time, so memory stays linear in the keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import checks
from .kernels import dispatch, query_blocks
from .kernels.local import check_span, joined_mask, local_attention
from .kernels.flex import flex_backend
from .kernels.forms import BAND, STICKS, allowed_pairs, masked, math_dtype, repeat_kv_heads, score_forms, sticks_serve
from .kernels.sinks import sdpa_with_sink, softmax_with_sink
from .encodings.base import NoPE, PositionalEncoding
from .encodings.positioned import PositionedEncoding
from .positions import default_positions

BACKENDS = ("auto", "eager", "sdpa", "flex")
_NOPE = NoPE()


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: PositionalEncoding | None = None,
    *,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    causal: bool = True,
    mask: Tensor | None = None,
    backend: str = "auto",
    scale: float | None = None,
    sink: Tensor | None = None,
    window: int | None = None,
    chunk: int | None = None,
) -> Tensor:
    """Attention with any positional encoding.

    Args:
        q: (B, H, Tq, Dh) queries; k: (B, Hkv, Tk, Dh) keys; v: (B, Hkv, Tk, Dv) values, of one dtype, with H a
            multiple of Hkv (Hkv < H: grouped-query attention, each key/value head serving H/Hkv consecutive query
            heads).
        encoding: any module from ``posenc.build``; None means no positional encoding. Input-door encodings act
            before attention (``embed``) and are ignored here. Or ``encoding.at(q_pos, k_pos)``, the encoding at
            fixed positions, which a model builds once per forward so that all its layers share RoPE's cos/sin and
            score biases (then leave q_positions and k_positions None).
        q_positions: (Tq,) or (B, Tq) int64; default: the last Tq key positions (of k_positions when given).
        k_positions: (Tk,) or (B, Tk) int64; default: 0..Tk-1.
        causal: mask keys whose position is after the query's (k_pos <= q_pos is kept), so it is right for
            KV-cache decoding where Tq < Tk.
        mask: bool, broadcastable to (B, H, Tq, Tk); True = may attend (padding, documents; see
            ``posenc.document_mask``). Combined with ``causal``.
        backend: one of "auto", "eager", "sdpa", "flex".
        scale: logit scale; default 1/√Dh.
        sink: (H,) learned sink logits (``kernels.sinks``): each query may also attend to a zero value with logit
            sink_h. Served by eager and sdpa.
        window: a sliding window: only keys with 0 <= q_pos − k_pos < window (Gemma 3's local layers).
        chunk: chunked attention: only keys with q_pos // chunk == k_pos // chunk (Llama 4's chunked layers).
            Self-attention at the default positions runs as blocks (``kernels.local``: no Tq×Tk tensor) where the
            encoding only rotates and the backend is not eager; otherwise the pairs join the mask.
    Returns:
        (B, H, Tq, Dv) in q's dtype. A query row with no allowed key returns zeros (eager by construction; sdpa
        and flex do the same in torch 2.13, tested).
    """
    at = _positioned(q, k, v, encoding, q_positions, k_positions, mask)
    encoding = at.encoding
    checks.attention_scale(scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    checks.sink_logits(sink, q.shape[1])
    name = choose_backend(backend, encoding, q, k, v, sink=sink is not None)
    _check_normalization(encoding, causal, sink, window, chunk)
    q, k = at.rotate(q, k)
    if k.shape[1] != q.shape[1] and (name == "eager" or encoding.has_relative_logits or encoding.has_relative_values):
        k, v = repeat_kv_heads(k, q.shape[1]), repeat_kv_heads(v, q.shape[1])
    plain_causal = causal and at.contiguous and q.shape[2] == k.shape[2]
    if window is not None or chunk is not None:
        if name != "eager" and plain_causal and mask is None and sink is None and encoding.only_rotates:
            k, v = repeat_kv_heads(k, q.shape[1]), repeat_kv_heads(v, q.shape[1])
            return local_attention(q, k, v, window=window, chunk=chunk, scale=scale)
        mask = joined_mask(mask, at.q_pos, at.k_pos, window, chunk)
    if sink is not None:
        return (_eager if name == "eager" else _sdpa_sink)(q, k, v, at, causal, mask, scale, sink=sink)
    return _BACKENDS[name](q, k, v, at, causal, mask, scale, plain_causal)


def _positioned(q, k, v, encoding, q_positions, k_positions, mask) -> PositionedEncoding:
    """Check the tensors and return the encoding at validated positions."""
    if isinstance(encoding, PositionedEncoding):
        if q_positions is not None or k_positions is not None:
            raise ValueError("pass positions either to encoding.at(...) or to attention(), not both")
        checks.attention_tensors(q, k, v, encoding.encoding)
        if encoding.q_pos.shape[-1] != q.shape[2] or encoding.k_pos.shape[-1] != k.shape[2]:
            raise ValueError(f"the positioned encoding has {encoding.q_pos.shape[-1]} query and "
                             f"{encoding.k_pos.shape[-1]} key positions but the tensors have "
                             f"Tq={q.shape[2]} and Tk={k.shape[2]}")
        if mask is not None:
            checks.attention_mask(mask, q.shape[:2] + (q.shape[2], k.shape[2]))
        return encoding
    encoding = _NOPE if encoding is None else encoding
    checks.attention_tensors(q, k, v, encoding)
    q_pos, k_pos = _resolve_positions(q, k, q_positions, k_positions, mask)
    return encoding.at(q_pos, k_pos, contiguous=q_positions is None and k_positions is None)


def _check_normalization(encoding: PositionalEncoding, causal: bool, sink: Tensor | None, window: int | None,
                         chunk: int | None) -> None:
    """A causal-only encoding (stick-breaking, FoX) refuses causal=False; one whose weights replace the softmax
    (stick-breaking) takes no sink logit; a window or chunk is None or an integer >= 1."""
    check_span(window, chunk)
    if encoding.causal_only and not causal:
        raise ValueError(f"{type(encoding).__name__} is causal only: it has no bidirectional form; pass causal=True")
    if encoding.replaces_softmax and sink is not None:
        raise ValueError(f"{type(encoding).__name__} replaces the softmax, which a sink logit would join; leave "
                         "sink out")


def serves(backend: str, encoding: PositionalEncoding, q: Tensor, k: Tensor, v: Tensor, sink: bool = False) -> bool:
    """Whether a named backend (not "auto") can run this encoding on these tensors (with a sink logit)."""
    return _refusal(backend, encoding, q, _needs_grad(encoding, q, k, v), sink) is None


def _needs_grad(encoding: PositionalEncoding, q: Tensor, k: Tensor, v: Tensor) -> bool:
    return torch.is_grad_enabled() and (
        any(t.requires_grad for t in (q, k, v)) or any(p.requires_grad for p in encoding.parameters())
    )


def choose_backend(backend: str, encoding: PositionalEncoding, q: Tensor, k: Tensor, v: Tensor, sink: bool = False
                   ) -> str:
    """The backend ``attention`` will run (``sink``: with a sink logit), or a ValueError naming one that can."""
    checks.choice("backend", backend, BACKENDS)
    needs_grad = _needs_grad(encoding, q, k, v)
    if backend == "auto":
        return "sdpa" if _refusal("sdpa", encoding, q, needs_grad, sink) is None else "eager"
    reason = _refusal(backend, encoding, q, needs_grad, sink)
    if reason is not None:
        raise ValueError(f"backend={backend!r} cannot serve {type(encoding).__name__}: {reason}")
    return backend


def _refusal(backend: str, encoding: PositionalEncoding, q: Tensor, needs_grad: bool, sink: bool = False
             ) -> str | None:
    if encoding.replaces_softmax and backend != "eager" and not (
            backend == "sdpa" and STICKS.accepts(encoding) and not sink and sticks_serve(q)):
        return f"its weights replace the softmax that {backend} computes; use backend='eager' (or 'auto')"
    if backend == "sdpa" and encoding.has_relative_values and (sink or not BAND.accepts(encoding)):
        return "its value-side term is outside SDPA's softmax(QKᵀ+mask)·V; use backend='eager'"
    if backend == "flex" and sink:
        return "a sink logit is one more key, outside a score_mod; use backend='sdpa' or 'eager'"
    if backend == "flex":
        if encoding.has_relative_logits or encoding.has_relative_values:
            alternative = "'eager'" if encoding.has_relative_values else "'sdpa' or 'eager'"
            return f"its content-position terms are not a score_mod; use backend={alternative}"
        if needs_grad and not q.is_cuda:
            return "FlexAttention has no backward pass on CPU; use backend='sdpa' or 'eager'"
    return None


def _weights(q, k, at: PositionedEncoding, causal, mask, scale, sink=None) -> Tensor:
    """Softmax weights (B, H, Tq, Tk) from already-rotated q, k, in q's dtype (short of 1 by the sink's share)."""
    encoding = at.encoding
    allowed = allowed_pairs(at.q_pos, at.k_pos, causal, mask, encoding.attends_to_itself)
    logits = (q @ k.transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    if encoding.has_relative_logits:
        logits = logits + at.relative_logits(q, k, allowed, scale)
    if encoding.has_bias:
        logits = logits + at.score_bias(q.dtype)
    if encoding.replaces_softmax:
        return encoding.weights(logits, allowed)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(logits, dim=-1) if sink is None else softmax_with_sink(logits, sink)
    if allowed is None:
        return probs
    return probs.masked_fill(~allowed.any(-1, keepdim=True), 0.0)  # a row with no allowed key attends to nothing


def _eager(q, k, v, at: PositionedEncoding, causal, mask, scale, plain_causal=False, sink=None) -> Tensor:
    if query_blocks.needed(q, k) and not at.encoding.has_token_gates:  # FoX's bias needs every query at once
        def attend(rows: slice, q_rows: Tensor) -> Tensor:
            block = PositionedEncoding(at.encoding, at.q_pos[:, rows], at.k_pos, at.seq_len)
            block.rotated = True
            mask_rows = mask if mask is None or mask.shape[-2] == 1 else mask[..., rows, :]
            return _dense(q_rows, k, v, block, causal, mask_rows, scale, sink)
        return query_blocks.by_query_blocks(attend, q, query_blocks.rows_per_block(q, k))
    return _dense(q, k, v, at, causal, mask, scale, sink)


def _dense(q, k, v, at: PositionedEncoding, causal, mask, scale, sink=None) -> Tensor:
    dtype = q.dtype
    compute = math_dtype(q.dtype)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    probs = _weights(q, k, at, causal, mask, scale, sink)
    out = probs @ v  # (B, H, Tq, Dv)
    if at.encoding.has_relative_values:
        out = out + at.relative_values(probs)
    return out.to(dtype)


def attention_weights(
    q: Tensor,
    k: Tensor,
    encoding: PositionalEncoding | None = None,
    *,
    q_positions: Tensor | None = None,
    k_positions: Tensor | None = None,
    causal: bool = True,
    mask: Tensor | None = None,
    scale: float | None = None,
    sink: Tensor | None = None,
    window: int | None = None,
    chunk: int | None = None,
) -> Tensor:
    """The attention weights ``attention()`` uses, for inspection and plots.

    Same arguments as ``attention`` (without v and backend; window and chunk join the mask). Returns (B, H, Tq, Tk)
    float32 (float64 for float64 inputs); rows sum to 1 (0 for a row with no allowed key),
    less the sink's share when there is one; stick-breaking's rows sum to at most 1.
    """
    at = _positioned(q, k, k, encoding, q_positions, k_positions, mask)
    checks.attention_scale(scale)
    _check_normalization(at.encoding, causal, sink, window, chunk)
    mask = joined_mask(mask, at.q_pos, at.k_pos, window, chunk)
    compute = math_dtype(q.dtype)
    q, k = at.rotate(q.to(compute), k.to(compute))
    k = repeat_kv_heads(k, q.shape[1])
    return _weights(q, k, at, causal, mask, q.shape[-1] ** -0.5 if scale is None else scale, sink)


def _resolve_positions(q, k, q_positions, k_positions, mask) -> tuple[Tensor, Tensor]:
    """Validated (B or 1, Tq) and (B or 1, Tk) int64 positions on q's device; checks the mask too."""
    batch, _, q_len, _ = q.shape
    k_len = k.shape[2]
    defaults = default_positions(q_len, k_len, q.device) if q_positions is None or k_positions is None else None
    k_pos = defaults[1] if k_positions is None else checks.positions("k_positions", k_positions, k_len, batch)
    if q_positions is None:  # the last Tq key positions: the given keys' when they are given
        q_pos = k_pos[:, k_len - q_len:]
    else:
        q_pos = checks.positions("q_positions", q_positions, q_len, batch)
    if mask is not None:
        checks.attention_mask(mask, q.shape[:2] + (q_len, k_len))
    return q_pos.to(q.device), k_pos.to(q.device)


def _sdpa(q, k, v, at: PositionedEncoding, causal, mask, scale, plain_causal) -> Tensor:
    encoding = at.encoding
    if encoding.only_rotates and plain_causal and mask is None:
        gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, **gqa)
    forms = score_forms(q, at, causal, mask, plain_causal)
    if encoding.replaces_softmax or encoding.has_relative_values:  # the one form that serves, or eager's sums
        if forms:
            return next(iter(forms.values()))(q, k, v, at, causal, mask, scale, plain_causal)
        return _eager(q, repeat_kv_heads(k, q.shape[1]), repeat_kv_heads(v, q.shape[1]), at, causal, mask, scale)
    if "mask" in forms and query_blocks.needed(q, k):  # a (B, H, Tq, Tk) float mask: the dense path by blocks
        forms = {name: form for name, form in forms.items() if name != "mask"} or {"blocks": _eager}
    # where several serve: the fastest here, timed once per shape bucket (``kernels.dispatch``)
    needs_grad = _needs_grad(encoding, q, k, v)
    key = dispatch.shape_key(type(encoding).__name__, q, k, v, causal, needs_grad)
    stand_ins = lambda: dispatch.stand_ins(forms, q, k, v, at, (causal, mask, scale, plain_causal), needs_grad)  # noqa: E731
    return forms[dispatch.choose(key, list(forms), stand_ins)](q, k, v, at, causal, mask, scale, plain_causal)


def _sdpa_sink(q, k, v, at: PositionedEncoding, causal, mask, scale, sink) -> Tensor:
    """SDPA with a sink: every score term as one float mask, and a zero key with the sink's logit."""
    encoding, compute = at.encoding, math_dtype(q.dtype)
    additive = torch.zeros(1, 1, q.shape[2], k.shape[2], dtype=compute, device=q.device)
    allowed = allowed_pairs(at.q_pos, at.k_pos, causal, mask)
    if encoding.has_relative_logits:
        additive = additive + at.relative_logits(q.to(compute), k.to(compute), allowed, scale)
    if encoding.has_bias:
        additive = additive + at.score_bias(compute)
    return sdpa_with_sink(q, k, v, masked(additive, allowed), sink, scale)


_BACKENDS = {"eager": _eager, "sdpa": _sdpa, "flex": flex_backend}
