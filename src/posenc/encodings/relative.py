"""Relative-position encodings with learned tables.

- ``T5RelativeBias`` (Raffel et al. 2020, arXiv:1910.10683): a learned scalar per head
  and log-spaced offset bucket, added to the logits (score-bias door).
- ``Shaw`` (Shaw et al. 2018, arXiv:1803.02155): learned key *and* value vectors per
  clipped offset (content-position door).
- ``TransformerXL`` (Dai et al. 2019, arXiv:1901.02860): ``q·k + q·W_R r + u·k + v·W_R r``
  with sinusoidal ``r`` (content-position door).

Offsets follow the project convention ``offset = q_position - k_position``; T5 and
Shaw index their tables by ``k_position - q_position`` as their papers do.

Tables can be read at fractional offsets: ``interpolate_factor = s`` reads offset Δ
at Δ/s, linearly between the two neighbouring entries (position interpolation for
relative tables).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import checks
from ..kernels.blockwise import ChannelBlocks, ShiftedQueries
from .absolute import sinusoid
from .base import PositionalEncoding


def check_buckets(num_buckets: object, max_distance: object, bidirectional: bool) -> None:
    """T5's bucket counts, refused where its formula would divide by log(max_distance / exact) <= 0 and return
    garbage buckets (as transformers' does): at least one exact distance each way (num_buckets >= 4 both ways,
    >= 2 causal), and max_distance past the exact distances."""
    checks.positive_int("num_buckets", num_buckets, minimum=4 if bidirectional else 2)
    exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    checks.positive_int("max_distance", max_distance)
    if max_distance <= exact:
        each_way = " each way" if bidirectional else ""
        raise ValueError(f"max_distance must be an integer >= {exact + 1} (more than the distances "
                         f"num_buckets={num_buckets} holds exactly{each_way}), got {max_distance!r}")


def t5_bucket(
    relative_position: Tensor, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of ``relative_position = k_position - q_position``.

    Half the buckets (all, when causal) hold exact small distances; the rest are
    spaced logarithmically up to ``max_distance``, beyond which everything shares
    the last bucket. Bidirectional buckets give keys after the query the upper half.
    Causal buckets map every key after the query to bucket 0.

    Args:
        relative_position: integer tensor of any shape.
    Returns:
        int64 tensor of the same shape, values in [0, num_buckets).
    """
    check_buckets(num_buckets, max_distance, bidirectional)
    relative_position = torch.as_tensor(relative_position).long()
    bucket = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    exact = num_buckets // 2
    # float32 as in T5's reference, so bucket edges land on the same integers.
    log_ratio = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = exact + (log_ratio * (num_buckets - exact)).long()
    far = far.clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


def interpolated(offset: Tensor, factor: float) -> tuple[Tensor, Tensor, Tensor | None]:
    """Read integer offsets at offset/factor: (lower, upper, weight of upper).

    With factor 1 the weight is None and lower == upper == offset.
    """
    if factor == 1.0:
        return offset, offset, None
    scaled = offset.double() / factor
    lower = scaled.floor()
    return lower.long(), lower.long() + 1, (scaled - lower)


class T5RelativeBias(PositionalEncoding):
    """A learned bias per head and offset bucket; one table of shape (num_buckets, num_heads)."""

    has_bias = True

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = False,
        interpolate_factor: float = 1.0,
    ):
        super().__init__()
        self.num_heads = checks.positive_int("num_heads", num_heads)
        check_buckets(num_buckets, max_distance, bool(bidirectional))
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bool(bidirectional)
        self.interpolate_factor = checks.positive_float("interpolate_factor", interpolate_factor, minimum=1.0, inclusive=True)
        self.table = nn.Parameter(torch.randn(num_buckets, num_heads) * 0.02)  # (buckets, H)

    def bucket(self, relative_position: Tensor) -> Tensor:
        return t5_bucket(
            relative_position,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def bias_at(self, offset: Tensor, head: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        lower, upper, weight = interpolated(-offset, self.interpolate_factor)
        table = self.table.to(dtype)
        bias = table[self.bucket(lower), head]
        if weight is not None:
            bias = torch.lerp(bias, table[self.bucket(upper), head], weight.to(dtype))
        return bias

    def flat_offsets(self, lowest: int, highest: int) -> tuple[int, int]:
        """The runs at both ends of lowest..highest whose offsets read one bucket (both buckets of an
        interpolated read: one table entry)."""
        offset = torch.arange(lowest, highest + 1)
        lower, upper, _ = interpolated(-offset, self.interpolate_factor)
        bucket, other = self.bucket(lower), self.bucket(upper)
        one_entry = bucket == other
        tail = one_entry & (bucket == bucket[-1]) & (other == other[-1])
        head = one_entry & (bucket == bucket[0]) & (other == other[0])
        high = highest + 1 - int(tail.flip(0).long().cumprod(0).sum())
        low = lowest - 1 + int(head.long().cumprod(0).sum())
        return low, high

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}, interpolate_factor={self.interpolate_factor}"
        )


class Shaw(PositionalEncoding):
    """Learned key and value vectors per clipped offset k - q in [-max_distance, max_distance].

    logits_ij += q_i · a^K_{clip(j-i)};  out_i += Σ_j p_ij a^V_{clip(j-i)}.
    As in the paper the vectors are shared across heads: tables are (2K+1, Dh).
    Neither term builds a (Tq, Tk, Dh) tensor: queries meet the 2K+1 table rows
    once, and the result is gathered (keys) or scattered (values) by offset.
    """

    has_relative_logits = True
    has_relative_values = True

    def __init__(self, head_dim: int, num_heads: int, max_distance: int = 16, interpolate_factor: float = 1.0):
        super().__init__()
        self.head_dim = checks.positive_int("head_dim", head_dim)
        self.num_heads = checks.positive_int("num_heads", num_heads)
        self.max_distance = checks.positive_int("max_distance", max_distance)
        self.interpolate_factor = checks.positive_float("interpolate_factor", interpolate_factor, minimum=1.0, inclusive=True)
        rows = 2 * max_distance + 1
        self.key_table = nn.Parameter(torch.randn(rows, head_dim) * 0.02)  # (2K+1, Dh)
        self.value_table = nn.Parameter(torch.randn(rows, head_dim) * 0.02)  # (2K+1, Dh)

    def _rows(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Table rows for every pair: (lower, upper, weight), each (B or 1, 1, Tq, Tk)."""
        key_minus_query = (k_pos[:, None, :] - q_pos[:, :, None]).unsqueeze(1)  # (B, 1, Tq, Tk)
        lower, upper, weight = interpolated(key_minus_query, self.interpolate_factor)
        k = self.max_distance
        return lower.clamp(-k, k) + k, upper.clamp(-k, k) + k, weight

    def relative_logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, allowed: Tensor | None = None
                        ) -> Tensor:
        per_row = q @ self.key_table.to(q.dtype).t()  # (B, H, Tq, 2K+1)
        lower, upper, weight = self._rows(q_pos, k_pos)
        shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        logits = per_row.gather(-1, lower.expand(shape))  # (B, H, Tq, Tk)
        if weight is not None:
            logits = torch.lerp(logits, per_row.gather(-1, upper.expand(shape)), weight.to(q.dtype))
        return logits

    def relative_values(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        lower, upper, weight = self._rows(q_pos, k_pos)
        rows = torch.zeros(*probs.shape[:-1], self.key_table.shape[0], dtype=probs.dtype, device=probs.device)
        if weight is None:
            rows = rows.scatter_add(-1, lower.expand(probs.shape), probs)  # (B, H, Tq, 2K+1)
        else:
            weight = weight.to(probs.dtype)
            rows = rows.scatter_add(-1, lower.expand(probs.shape), probs * (1 - weight))
            rows = rows.scatter_add(-1, upper.expand(probs.shape), probs * weight)
        return rows @ self.value_table.to(probs.dtype)  # (B, H, Tq, Dh)

    @property
    def has_band_form(self) -> bool:
        """Causal attention at integer offsets can run as attention plus a band (``band_parts``)."""
        return self.interpolate_factor == 1.0

    def band_parts(self, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
        """Causal Shaw as ``kernels.band``'s attention plus a band of K = max_distance diagonals:
        (key_band (K, Dh), value_band (K, Dh), value_floor (Dh,)), with distance d = query − key reading
        table row K − d: key_band[d] = a^K_{−d} − a^K_{−K}, value_band[d] = a^V_{−d} − a^V_{−K}, and
        value_floor = a^V_{−K}, which every output gets (the logits' a^K_{−K} term is the same for every key
        of a row, which the softmax ignores)."""
        rows = self.max_distance - torch.arange(self.max_distance, device=self.key_table.device)  # (K,)
        keys, values = self.key_table.to(dtype), self.value_table.to(dtype)
        return keys[rows] - keys[0], values[rows] - values[0], values[0]

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}, max_distance={self.max_distance}"


class TransformerXL(PositionalEncoding):
    """Transformer-XL relative attention terms (b), (c), (d) of the paper's eq. (3).

    logits_ij += (q_i + v) · W_R r_{i-j} + u · k_j, with r the sinusoid of the offset
    i - j (width R = H·Dh, rounded up to even), and u, v learned per head.

    The paper's "relative shift" is replaced by the angle-addition identities
    sin((i−j)ω) = sin iω cos jω − cos iω sin jω and cos((i−j)ω) = cos iω cos jω + sin iω sin jω:
    with y_i = W_Rᵀ(q_i + v) split into its sin and cos coefficients (y^s, y^c),
        (q_i + v) · W_R r_{i−j} = Q_i · K_j,
        Q_i = [y^s sin iω + y^c cos iω, y^c sin iω − y^s cos iω],  K_j = [cos jω, sin jω],
    one (Tq × R)·(R × Tk) product. It is exact for any explicit positions (KV cache, packed
    documents), builds no per-offset table and reads no position values, so it has static
    shapes under ``torch.compile``. Angles are formed in float64 from int64 positions.
    """

    has_relative_logits = True
    has_score_channels = True
    #: keys from which the channel form is the faster on CPU (measured: benchmarks/history.md)
    cpu_channels_from_keys = 256

    def __init__(self, head_dim: int, num_heads: int, base: float = 10000.0):
        super().__init__()
        self.head_dim = checks.positive_int("head_dim", head_dim)
        self.num_heads = checks.positive_int("num_heads", num_heads)
        self.base = checks.positive_float("base", base, minimum=1.0)
        self.r_width = 2 * math.ceil(num_heads * head_dim / 2)
        self.position_proj = nn.Linear(self.r_width, num_heads * head_dim, bias=False)  # W_R
        self.content_bias = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)  # u: (H, Dh)
        self.position_bias = nn.Parameter(torch.randn(num_heads, head_dim) * 0.02)  # v: (H, Dh)

    def _position_factors(self, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[ChannelBlocks, Tensor]:
        """(Q, K (B or 1, 1, Tk, R)) with Q_i · K_j = (q_i + v) · W_R r_{i−j}; Q (B, H, Tq, R) is built per query
        block (``ChannelBlocks``) from q + v and W_R, so the blockwise kernel need not keep it."""
        exponent = torch.arange(0, self.r_width, 2, dtype=torch.float64, device=q.device) / self.r_width
        inv_freq = self.base**-exponent  # (R/2,), the frequencies of ``sinusoid``
        q_angles = (q_pos.to(torch.float64)[..., None] * inv_freq).unsqueeze(1)  # (B or 1, 1, Tq, R/2)
        k_angles = (k_pos.to(torch.float64)[..., None] * inv_freq).unsqueeze(1)  # (B or 1, 1, Tk, R/2)
        q_sin, q_cos = q_angles.sin(), q_angles.cos()

        def query_terms(start: int, end: int, q: Tensor, position_bias: Tensor, weight: Tensor) -> Tensor:
            query_side = q[:, :, start:end] + position_bias[None, :, None, :]  # (B, H, b, Dh): q + v
            y = torch.einsum("bhqd,hdr->bhqr", query_side, weight)  # W_Rᵀ (q + v)
            y_sin, y_cos = y[..., 0::2], y[..., 1::2]  # coefficients of sin and cos channels of r
            sin, cos = q_sin[:, :, start:end].to(y.dtype), q_cos[:, :, start:end].to(y.dtype)
            return torch.cat((y_sin * sin + y_cos * cos, y_cos * sin - y_sin * cos), dim=-1)  # (B, H, b, R)

        weight = self.position_proj.weight.to(q.dtype).view(self.num_heads, self.head_dim, self.r_width)
        key_terms = torch.cat((k_angles.cos(), k_angles.sin()), dim=-1).to(q.dtype)  # (B or 1, 1, Tk, R)
        inputs = (q, self.position_bias.to(q.dtype), weight)  # q is kept anyway: no (B, H, Tq, ·) tensor of its own
        return ChannelBlocks(query_terms, inputs, q.shape[2], self.r_width), key_terms

    def relative_logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, allowed: Tensor | None = None
                        ) -> Tensor:
        query_terms, key_terms = self._position_factors(q, q_pos, k_pos)
        position_terms = query_terms.full() @ key_terms.transpose(-1, -2)  # (B, H, Tq, Tk)
        content_terms = torch.einsum("hd,bhkd->bhk", self.content_bias.to(q.dtype), k)  # (B, H, Tk)
        return position_terms + content_terms[:, :, None, :]

    def score_channel_parts(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float
                            ) -> tuple[ShiftedQueries, ChannelBlocks, Tensor]:
        """q' = [q + u, Q] and k' = [k, K] (width Dh + R): q'·k' = q·k + u·k + (q + v)·W_R r, the whole logit,
        so one attention call with no mask tensor runs it and gradients reach u, v and W_R through q'."""
        query_terms, key_terms = self._position_factors(q, q_pos, k_pos)
        return ShiftedQueries(q, self.content_bias.to(q.dtype)), query_terms, key_terms

    def offset_lookup_table(self, keys: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """(H, keys, Dh): row d of head h is W_R,h r_d, the sinusoid of offset d (angles in float64)."""
        r = sinusoid(torch.arange(keys, dtype=torch.float64, device=device), self.r_width, self.base)
        projected = r.to(dtype) @ self.position_proj.weight.to(dtype).T  # (keys, H·Dh)
        return projected.view(keys, self.num_heads, self.head_dim).transpose(0, 1).contiguous()

    def query_shifts(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(u, v), each (H, Dh): the content term u·k rides on q·k as (q + u)·k, the position terms on q + v."""
        return self.content_bias.to(dtype), self.position_bias.to(dtype)

    def channels_exact(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype, contiguous: bool) -> bool:
        return True  # sums of O(1) products: no cancellation (tests: float32 and bf16 at offset 2^20)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}"
