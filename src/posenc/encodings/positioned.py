"""An encoding at the positions of one forward pass: ``PositionalEncoding.at(q_pos, k_pos)``.

What depends on positions (and parameters) but not on q, k or v — RoPE's cos/sin, a dense score bias, a table of
offsets, CoPE's position table — is built here on first use and shared by every layer that attends with it. A term
that holds a NaN is a ValueError naming the encoding (on CPU), never a row a backend silently zeroes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..kernels.offset_bias import offsets

if TYPE_CHECKING:
    from .base import PositionalEncoding

MAX_SPANNED_OFFSETS = 1 << 23  # the widest table ``spanning_offset_table`` builds: H · 2^23 float32 at most


class PositionedEncoding:
    """An encoding at the query/key positions of one forward pass.

    Everything that depends on positions (and parameters) but not on q, k or v is
    built on first use and memoized here, so the layers of a model share it. It lives
    for one forward pass (a new one per call), so it never goes stale when parameters
    change or a cache grows.

    Args:
        encoding: the module whose doors to open.
        q_pos: (B or 1, Tq) int64 positions; k_pos: (B or 1, Tk).
        seq_len: the context length a length-dependent scaling (dynamic NTK, LongRoPE)
            should see; None reads it from the positions (largest + 1), which needs their
            values and so breaks a ``torch.compile`` graph: models pass it.
        contiguous: the caller guarantees k_pos = s..s+Tk-1 for every row and q_pos its
            last Tq entries (prefill, decoding), which lets backends use their causal fast path.
    """

    def __init__(self, encoding: PositionalEncoding, q_pos: Tensor, k_pos: Tensor, seq_len: int | None = None,
                 contiguous: bool = False):
        self.encoding, self.q_pos, self.k_pos = encoding, q_pos, k_pos
        self.seq_len, self.contiguous = seq_len, contiguous
        self.rotated = False  # True: q and k were already rotated by the caller
        self.log_forget: Tensor | None = None  # (B or 1, H, Tk): the keys' forget gates, for FoX (``with_gates``)
        self._memo: dict = {}

    def after_rotation(self) -> PositionedEncoding:
        """The same positions and tables, for q and k that ``rotate`` has already turned."""
        done = PositionedEncoding(self.encoding, self.q_pos, self.k_pos, self.seq_len, self.contiguous)
        done.rotated, done._memo, done.log_forget = True, self._memo, self.log_forget
        return done

    def unmemoized(self) -> PositionedEncoding:
        """The same positions, gates and rotation with nothing built yet: a stand-in call's own tables. The gates
        are cut from the caller's graph, so a stand-in's backward never runs into (and frees) the caller's."""
        fresh = PositionedEncoding(self.encoding, self.q_pos, self.k_pos, self.seq_len, self.contiguous)
        fresh.rotated = self.rotated
        fresh.log_forget = None if self.log_forget is None else self.log_forget.detach()
        return fresh

    def with_gates(self, log_forget: Tensor) -> PositionedEncoding:
        """The same positions with the keys' log forget gates (B or 1, H, Tk), from which a token-gates encoding
        (FoX) builds its score bias; the queries are the last Tq keys."""
        if not self.encoding.has_token_gates:
            raise ValueError(f"{type(self.encoding).__name__} takes no forget gates")
        q_len, k_len = self.q_pos.shape[-1], self.k_pos.shape[-1]
        if not isinstance(log_forget, Tensor) or log_forget.dim() != 3 or log_forget.shape[-1] != k_len or (
                log_forget.shape[1] != self.encoding.num_heads) or q_len > k_len:
            shape = tuple(log_forget.shape) if isinstance(log_forget, Tensor) else type(log_forget).__name__
            raise ValueError(f"log_forget must be (B, {self.encoding.num_heads}, Tk={k_len}) with the queries the "
                             f"last Tq={q_len} of the keys, got {shape}")
        gated = PositionedEncoding(self.encoding, self.q_pos, self.k_pos, self.seq_len, self.contiguous)
        gated.rotated, gated.log_forget = self.rotated, log_forget
        return gated

    def memo(self, key: tuple, build):
        """``build()`` once per key for the lifetime of this object."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def new_tokens(self) -> PositionedEncoding:
        """The encoding at this pass's own tokens: the query positions for queries *and* keys,
        for rotating fresh keys once before they join a cache. Memoized, so tables are shared."""
        return self.memo(("new_tokens",), lambda: PositionedEncoding(
            self.encoding, self.q_pos, self.q_pos, self.seq_len, self.contiguous))

    def context_length(self) -> int:
        if self.seq_len is None:
            self.seq_len = int(max(self.q_pos.max(), self.k_pos.max())) + 1
        return self.seq_len

    def rotate(self, q: Tensor, k: Tensor, in_place: bool = False) -> tuple[Tensor, Tensor]:
        """The q/k door, then the encoding's attention temperature on q, if it has one. ``in_place``: the caller
        owns q and k and lets them be overwritten."""
        if self.rotated:
            return q, k
        q, k = self.encoding.rotate_positioned(self, q, k, in_place)
        temperature = self.encoding.temperature
        return (q, k) if temperature is None else (temperature.apply(q, self.q_pos), k)

    def score_bias(self, dtype: torch.dtype) -> Tensor:
        def build() -> Tensor:
            if not self.encoding.has_token_gates:
                return self.encoding.score_bias(self.q_pos, self.k_pos, dtype)
            return self.encoding.gate_bias(self._gates(), self.q_pos.shape[-1], dtype)
        return self.memo(("bias", dtype), lambda: _finite(self.encoding, "score bias", build()))

    def cumulative_gates(self) -> Tensor:
        """FoX's c = cumsum log f of the keys, (B or 1, H, Tk) float64: the bias is c_i − c_j (``kernels.offset_bias``
        forms the difference itself)."""
        return self.memo(("cumulative gates",), lambda: _finite(
            self.encoding, "forget gates", self.encoding.cumulative_gates(self._gates())))

    def _gates(self) -> Tensor:
        if self.log_forget is None:
            raise ValueError(f"{type(self.encoding).__name__}'s bias comes from its tokens' forget gates: attend "
                             "with encoding.at(q_pos, k_pos).with_gates(encoding.log_forget(x, layer))")
        return self.log_forget

    def offset_table(self, causal: bool, dtype: torch.dtype) -> tuple[Tensor, int] | None:
        """The score bias as (table (H, N), lowest): ``bias[h, i, j] = table[h, q_pos_i − k_pos_j − lowest]`` for the
        pairs this call reaches (causally, the offsets ≥ 0 only), for ``kernels.offset_bias``; None where the bias is
        no function of the offset here, or the positions are not contiguous."""
        def build() -> tuple[Tensor, int] | None:
            if not self.contiguous or not self.encoding.has_bias:
                return None
            lowest, highest = offsets(self.q_pos.shape[-1], self.k_pos.shape[-1], causal)
            last_query = int(self.q_pos.max()) if self.q_pos.numel() else 0
            table = self.encoding.offset_table(lowest, highest, last_query, self.q_pos.device, dtype)
            return None if table is None else (_finite(self.encoding, "score bias", table), lowest)
        return self.memo(("offset_table", causal, dtype), build)

    def spanning_offset_table(self, causal: bool) -> tuple[Tensor, int] | None:
        """``offset_table`` in float32 at any positions (``kernels.tiles_triton``): at explicit ones it spans the
        offsets the positions reach (causally from 0; a sync on a GPU), None past ``MAX_SPANNED_OFFSETS``."""
        if self.contiguous:
            return self.offset_table(causal, torch.float32)

        def build() -> tuple[Tensor, int] | None:
            if not self.encoding.has_bias or not self.q_pos.numel() or not self.k_pos.numel():
                return None
            last_query, lowest = int(self.q_pos.max()), int(self.q_pos.min()) - int(self.k_pos.max())
            lowest = max(lowest, 0) if causal else lowest
            highest = max(last_query - int(self.k_pos.min()), lowest)
            if highest - lowest + 1 > MAX_SPANNED_OFFSETS:
                return None
            table = self.encoding.offset_table(lowest, highest, last_query, self.q_pos.device, torch.float32)
            return None if table is None else (_finite(self.encoding, "score bias", table), lowest)
        return self.memo(("spanning_offset_table", causal), build)

    def relative_logits(self, q: Tensor, k: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
        """The content-position term as added to the *scaled* logits q·kᵀ·scale: ``scale ·`` the encoding's
        ``relative_logits`` (Shaw, Transformer-XL), or the term itself where ``relative_logits_scaled`` is False
        (CoPE, as its paper adds it)."""
        term = self.encoding.relative_logits(q, k, self.q_pos, self.k_pos, allowed)
        return _finite(self.encoding, "content-position logits",
                       scale * term if self.encoding.relative_logits_scaled else term)

    def counts_table(self) -> tuple[Tensor, float]:
        """CoPE's (P, Dh) position vectors, checked for NaN as every term is, and its gates' scale, for
        ``kernels.gated_counts``."""
        table, gate_scale = self.encoding.gated_counts_parts()
        return _finite(self.encoding, "position table", table), gate_scale

    def offset_lookup_parts(self, keys: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """The encoding's (table (H, keys, Dh), content shift (H, Dh), lookup shift (H, Dh)) for
        ``kernels.offset_lookup``, the table built once per forward."""
        device = self.k_pos.device
        table = self.memo(("lookup table", keys, dtype),
                          lambda: self.encoding.offset_lookup_table(keys, dtype, device))
        return table, *self.encoding.query_shifts(dtype)

    def relative_values(self, probs: Tensor) -> Tensor:
        return self.encoding.relative_values(probs, self.q_pos, self.k_pos)

    def channels_exact(self, dtype: torch.dtype) -> bool:
        """Whether the channel form is offered here and within verify's tolerance (``channels_exact``)."""
        return self.memo(("channels_exact", dtype), lambda: self.encoding.has_score_channels and (
            self.encoding.channels_exact(self.q_pos, self.k_pos, dtype, self.contiguous)))

    def channels_serve(self, dtype: torch.dtype) -> bool:
        """Where forms are not timed (a compiled graph): whether attention takes the channel form, offered,
        faster at this many keys (``channels_from_keys``) and exact."""
        return self.channels_exact(dtype) and self.k_pos.shape[-1] >= channels_from_keys(self.encoding,
                                                                                        self.k_pos.device)

    def score_channels(self, q: Tensor, k: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        return self.encoding.score_channels(q, k, self.q_pos, self.k_pos, scale)

    def score_channel_parts(self, q: Tensor, k: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        return self.encoding.score_channel_parts(q, k, self.q_pos, self.k_pos, scale)


def _finite(encoding: PositionalEncoding, what: str, term: Tensor) -> Tensor:
    """``term`` if it holds no NaN; else a ValueError naming the encoding, never a NaN that a backend could turn
    into a silent zero. Checked on CPU only: on a GPU the check would stall the stream, and the NaN propagates."""
    if term.device.type == "cpu" and not torch.compiler.is_compiling() and torch.isnan(term).any():
        raise ValueError(f"{type(encoding).__name__} gave a NaN {what}: its parameters have left the range they "
                         f"can take (non-finite after a diverged step?)")
    return term


def channels_from_keys(encoding: PositionalEncoding, device: torch.device) -> float:
    """Key count from which an encoding's channel form beats its reference door on ``device``.

    On CPU, SDPA's flash kernel runs an explicit bias nearly as fast as its causal path at a few hundred keys, while
    the channels widen every head; past a measured length (per encoding, ``cpu_channels_from_keys``) skipping the
    masked blocks wins. Elsewhere (CUDA), fused kernels take no bias at all, so the channels always serve.
    """
    return encoding.cpu_channels_from_keys if device.type == "cpu" else 0
