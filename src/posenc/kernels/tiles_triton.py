"""Attention with the score bias inside its Triton tiles, forward and backward (CUDA; CPU under TRITON_INTERPRET=1).

The flash-attention scheme (an online softmax over key tiles; the backward recomputes each tile's weights from one
log-sum-exp per row; the programs are in ``tiles_jit``), with the position terms formed per tile from O(T) inputs,
never a (B, H, Tq, Tk) tensor:

- a **bias of offsets** o = q_pos − k_pos, either as a formula of per-head parameters (``Formula``: ALiBi's slope,
  Kerple's r1 and r2), whose gradient is summed per tile, or as a **table** ``table[h, o − lowest]`` (T5, Sandwich,
  FIRE below its threshold: ``PositionalEncoding.offset_table``), whose gradient is reduced per entry: at
  contiguous positions along each tile's diagonals (two gathers, 2·BLOCK atomic adds), at explicit ones pair by
  pair. Where the table's entries from some offset on share one value and one parameter (T5's last bucket:
  ``flat``), a tile that lies wholly there reads one number (float32: an entry per pair) and adds one sum.
- **token values** ``c[b, h, q_i] − c[b, h, k_j]`` (FoX's cumulative log forget gates), kept in float64 and
  differenced in float32 against a per-program reference; their gradient is two row/column sums.

Masks: causal (``k_pos <= q_pos``), at contiguous positions (queries the last Tq of keys 0..Tk−1: a training step,
a prefill, a KV-cache step) with the tiles above the diagonal skipped and the mask applied only on tiles that
cross it, or at explicit positions (B or 1, T) with every tile visited. Grouped-query attention reads each
key/value head for its H/Hkv query heads; the key/value backward loops over the group, so no repeated k or v
exists. Products accumulate in float32 (exact float32 products for float32 inputs: no TF32); bias and softmax are
float32. A row with no allowed key returns zeros.

Shapes: B batch, H query heads, Hkv key/value heads, Tq/Tk query/key lengths, Dh head width, Dv value width, N
table entries.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
from torch import Tensor

from .. import checks
from . import tiles_jit

LOG2E = 1.4426950408889634  # exp(x) = exp2(x · log2 e): the kernels work in base 2
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FORMULAS = {"linear": tiles_jit.LINEAR, "linear_abs": tiles_jit.LINEAR_ABS, "kerple_log": tiles_jit.KERPLE_LOG,
            "kerple_power": tiles_jit.KERPLE_POWER, "fire": tiles_jit.FIRE}
#: the formulas timed and checked on a GPU so far; a GPU offers the others beside a dense form, which its first-use
#: timing keeps should the tiles fail there
CHECKED_ON_GPU = ("linear", "linear_abs", "kerple_log", "kerple_power")
#: the widest heads and values (bf16/fp16, float32) whose tiles (``_blocks``) fit an H100's shared memory, compiled
#: for sm_90 (wider values run by blocks of columns: ``by_value_columns``)
WIDEST = (256, 128)


@dataclass(frozen=True)
class Formula:
    """A bias computed inside the tiles: ``kind`` one of FORMULAS, ``params`` float, differentiable: (H, 2) with
    a_h in column 0 for the linear kinds, r1_h and r2_h for Kerple's; for FIRE (H, 3P + 2), P a power of two ≥ 2,
    per head its MLP as segments [keys (P), slopes (P), intercepts (P), c, L] (``kernels.fire_segments``; a bias
    of the query's position too, not of the offset alone)."""

    def __post_init__(self):
        columns = 2 if self.kind != "fire" else self.params.shape[-1] if self.params.dim() == 2 else 0
        keys = (columns - 2) // 3
        if self.kind not in FORMULAS or self.params.dim() != 2 or self.params.shape[-1] != columns or (
                self.kind == "fire" and (keys < 2 or columns != 3 * keys + 2 or keys & (keys - 1))):
            raise ValueError(f"formula must be one of {sorted(FORMULAS)} with params (H, 2), or (H, 3P + 2) with P "
                             f"a power of two >= 2 for fire, got {self.kind!r} with {tuple(self.params.shape)}")

    kind: str
    params: Tensor


def serves(q: Tensor) -> bool:
    """Whether the kernel runs on q's device and dtype here: CUDA (or CPU tensors under ``TRITON_INTERPRET=1``, which
    the tests set), float16/bfloat16/float32, eager (not inside a ``torch.compile`` graph)."""
    interpreted = q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    return (q.is_cuda or interpreted) and q.dtype in DTYPES and not torch.compiler.is_compiling()


def offered(q: Tensor) -> bool:
    """Whether ``forms`` offers these tiles for q: they ``serve`` it, at a head width they fit (``WIDEST``); which
    terms they are offered for on a GPU is ``forms``' (``CHECKED_ON_GPU``)."""
    return serves(q) and fits_shared_memory(q, WIDEST)


def fits_shared_memory(q: Tensor, widest: tuple[int, int]) -> bool:
    """Whether a kernel's tiles at q's head width fit an H100's shared memory: ``widest`` (16-bit, float32), the
    widest heads its tiles fit at, compiled for sm_90 (``tests/kernels/triton_targets``)."""
    return q.shape[-1] <= widest[q.dtype == torch.float32]


def offered_once_checked(q: Tensor, checked: bool, switch: str, widest: tuple[int, int]) -> bool:
    """Whether ``forms`` offers a Triton kernel for q: it ``serves`` q at a head width its tiles fit
    (``fits_shared_memory``), and on a GPU it has been checked there (``checked``: its CUDA tests passed on one) or
    is asked for by the environment variable ``switch`` = 1 (``benchmarks/scripts/gpu.sh`` sets it); until then the
    encoding computes on a GPU as it did before."""
    return serves(q) and fits_shared_memory(q, widest) and (checked or os.environ.get(switch) == "1" or not q.is_cuda)


def widths(q: Tensor, value_dim: int) -> dict:
    """HEAD_DIM (q's width), VALUE_DIM and the blocks that hold them: the next power of two, at least 16, the
    narrowest operand a GPU's ``tl.dot`` takes (tiles of width 8 failed to compile for sm_90)."""
    return dict(HEAD_DIM=q.shape[-1], VALUE_DIM=value_dim, BLOCK_D=max(16, triton.next_power_of_2(q.shape[-1])),
                BLOCK_DV=max(16, triton.next_power_of_2(value_dim)))


def check_inputs(q: Tensor, k: Tensor, v: Tensor, widest: tuple[int, int]) -> None:
    """Refuses, in one line, q, k and v of more than one dtype (the kernels read each in q's; under the interpreter
    mixed ones ran and were wrong), and a head wider than a kernel's tiles fit a GPU's shared memory at
    (``widest``: 16-bit, float32), which Triton would refuse only at launch, deep in its stack."""
    checks.one_dtype(q, k, v)
    if not fits_shared_memory(q, widest):
        raise ValueError(f"q's head width must be at most {widest[q.dtype == torch.float32]} in {q.dtype} for this "
                         f"kernel (wider tiles do not fit a GPU's shared memory), got {q.shape[-1]}")


def check_own_positions(q: Tensor, k: Tensor, v: Tensor, widest: tuple[int, int]) -> None:
    """Refuses, in one line, q, k and v that a kernel at the model's own positions cannot take.

    Raises:
        ValueError: unless q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv) with Tq ≤ Tk, H a multiple of
            Hkv, in one of ``DTYPES`` (all three), Dh within ``widest`` (``check_inputs``).
    """
    batch, heads, q_len, width = q.shape
    if k.dim() != 4 or k.shape[0] != batch or heads % k.shape[1] or k.shape[2] < q_len or k.shape[3] != width or (
            v.shape[:3] != k.shape[:3]) or q.dtype not in DTYPES:
        raise ValueError(f"q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv) with Tq <= Tk, H a multiple of "
                         f"Hkv, in one of {DTYPES}; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} {q.dtype}")
    check_inputs(q, k, v, widest)


def by_value_columns(attend: Callable[..., Tensor], v: Tensor, widest: tuple[int, int],
                     *beside_v: Tensor | None) -> Tensor:
    """``attend(v, *beside_v)``, or, for v (B, Hkv, Tk, Dv) wider than a kernel's tiles fit (``widest``: 16-bit,
    float32), ``attend`` over blocks of that many of v's columns (and the same columns of each of ``beside_v``, by
    its last dim; None passes), side by side. The weights do not read v, so the output is v whole's, and autograd
    sums each block's gradients of q, k and the position terms (in 16-bit dtypes each block's is rounded first: a
    rounding step from v whole's). Returns (B, H, Tq, Dv) token-major, as the kernels return it."""
    step = widest[v.dtype == torch.float32]
    if v.shape[-1] <= step:
        return attend(v, *beside_v)
    blocks = [attend(*(None if x is None else x[..., start:start + step] for x in (v, *beside_v)))
              for start in range(0, v.shape[-1], step)]
    return torch.cat([block.transpose(1, 2) for block in blocks], -1).transpose(1, 2)


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool = True,
                    table: Tensor | None = None, lowest: int = 0, flat: tuple[int, int] | None = None,
                    formula: Formula | None = None, token_values: Tensor | None = None,
                    q_pos: Tensor | None = None, k_pos: Tensor | None = None) -> Tensor:
    """``softmax(scale·q·kᵀ + bias(o) + c_i − c_j)·v`` with o = q_pos_i − k_pos_j, the position terms inside the
    tiles.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv); H a multiple of Hkv; float16, bfloat16 or
            float32; v of any width (past ``WIDEST`` by blocks of columns: ``by_value_columns``).
        scale: the logit scale.
        causal: keys after their query (k_pos > q_pos) are masked.
        table: (H, N) float, the bias of offsets lowest .. lowest + N − 1, covering every offset an allowed pair
            reaches; its gradient flows back (float32).
        flat: (low, high) table entries: entries ≤ low share one value and one parameter, and so do entries
            ≥ high (−1 and N: none); a tile wholly inside either adds one gradient sum and, except in float32,
            reads one number.
        formula: the bias as a ``Formula`` instead of a table (not both).
        token_values: (B or 1, H, Tk) float (FoX's c = cumsum log f), queries being the last Tq keys; its gradient
            flows back.
        q_pos, k_pos: (B or 1, Tq) and (B or 1, Tk) int64 explicit positions; None for both: queries at the last
            Tq of keys 0..Tk−1 (then the tiles above a causal diagonal are skipped).
    Returns:
        (B, H, Tq, Dv) in q's dtype, laid out token-major as SDPA returns it.
    Raises:
        ValueError: for terms that contradict each other or q's shape, q, k and v of more than one dtype, or Dh
            past ``WIDEST`` (``check_inputs``).
    """
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    check_inputs(q, k, v, WIDEST)
    if (q_pos is None) != (k_pos is None):
        raise ValueError("pass both q_pos and k_pos, or neither (contiguous positions)")
    if q_pos is not None and token_values is not None:
        raise ValueError("token_values take the queries as the last Tq keys: leave q_pos and k_pos out")
    if table is not None and formula is not None:
        raise ValueError("pass the bias as a table or as a formula, not both")
    if table is not None and (table.dim() != 2 or table.shape[0] != heads or table.shape[1] < 1):
        raise ValueError(f"table must be (H, N) = ({heads}, N >= 1), got {tuple(table.shape)}")
    if formula is not None and formula.params.shape[0] != heads:
        raise ValueError(f"the formula's params must have a row per head ({heads}), got {tuple(formula.params.shape)}")
    q_values = k_values = None
    if token_values is not None:
        if token_values.dim() != 3 or token_values.shape[0] not in (1, batch) or (
                token_values.shape[1:] != (heads, k_len)) or q_len > k_len:
            raise ValueError(f"token_values must be (B or 1, H, Tk) = ({batch}, {heads}, {k_len}) with Tq <= Tk, "
                             f"got {tuple(token_values.shape)}")
        values = token_values.to(torch.float64)
        q_values, k_values = values[..., k_len - q_len:], values
    positions = [None, None] if q_pos is None else [p.to(torch.int64).contiguous() for p in (q_pos, k_pos)]
    bias = table if formula is None else formula.params
    bias = None if bias is None else bias.to(torch.float32).contiguous()
    kind = tiles_jit.NONE if bias is None else tiles_jit.TABLE if formula is None else FORMULAS[formula.kind]
    entries = 1 if bias is None else bias.shape[1]
    flat = (-1, entries) if flat is None or table is None else (int(flat[0]), int(flat[1]))
    settings = _Settings(kind, int(lowest), flat, causal, float(scale))
    return by_value_columns(
        lambda columns: _TiledAttention.apply(q, k, columns, bias, q_values, k_values, *positions, settings), v, WIDEST)


@dataclass(frozen=True)
class _Settings:
    """What a call fixes besides its tensors: the bias kind (``tiles_jit``'s BIAS), the table's first offset and
    flat entries, the mask and the logit scale."""

    kind: int
    lowest: int
    flat: tuple[int, int]
    causal: bool
    scale: float


class Tiles(NamedTuple):
    """A launch's tile sizes: the forward's query × key tile and warps, the backward's square tile and warps, and the
    pipeline stages of both."""

    forward_m: int
    forward_n: int
    forward_warps: int
    backward: int
    backward_warps: int
    stages: int


#: under the interpreter: small tiles, so a test at a few dozen tokens crosses tiles
INTERPRETED = Tiles(16, 16, 1, 16, 1, 1)
#: on an H200 (bf16, Dh 64, 16,384 tokens; no term, a fixed and a learned table, token values, at contiguous
#: positions) the fastest of four settings (benchmarks/h200/h200-tiles-first.log); halving the backward's tile made
#: it 2.4× slower there
TIMED = Tiles(128, 64, 4, 64, 4, 3)
#: not timed: head widths over 64 in bf16/fp16, where 4 warps spill (the same tiles as the first lend's fastest;
#: compiled for sm_90 by Triton 3.6 no forward of the kinds ``TIMED`` serves spills, the keys' backward up to 312
#: bytes per thread)
WIDE = Tiles(128, 64, 8, 64, 8, 3)
#: not timed: FIRE and positions given explicitly. Compiled for sm_90 (Triton 3.6,
#: ``benchmarks/scripts/sm90_tiles.py``, bf16) their forwards spill nothing at widths 64 and 128 (128 × 64 with 8
#: warps: FIRE's 16 and 176 bytes per thread; explicit positions' 1,136 at width 64 with 4 warps, 176 at 128 with
#: 8); the backward keeps its 64 × 64 tile with 8 warps (FIRE's queries' backward still spills 464 bytes at width
#: 64, 1,272 at 128: its parameters' gradient)
UNTIMED = Tiles(64, 64, 8, 64, 8, 3)
#: not timed: float32, whose exact products run on the CUDA cores, each thread holding its rows and columns of both
#: operands. With ``TIMED`` most programs spilled 2–21 KB per thread (ALiBi's keys' backward kept 32 registers and
#: 15,328 bytes of stack); with these the formulas, FIRE and token values spill at most 56 at width 64, a table
#: (read an entry per pair) at most 32, and 496 at 128. A 16 × 16 backward spills nothing, but a quarter tile is
#: four times the programs and the table's atomic adds; half of it cost 2.4× in bf16
FLOAT32 = Tiles(64, 32, 8, 32, 8, 3)


def _blocks(q: Tensor, value_dim: int, kind: int, contiguous: bool) -> Tiles:
    """The tiles for q's device and dtype, the wider of its head and the values, the bias kind and whether
    positions are contiguous; two pipeline stages beyond a width of 64, where three do not fit an H100's shared
    memory, and a backward tile of 32 beyond 128: in bf16 at 256 the 64 × 64 backward spilled up to 2,392 bytes a
    thread (FIRE's queries), 32 × 32 at most 232 (compiled for sm_90 by Triton 3.6; not timed)."""
    if q.device.type == "cpu":
        return INTERPRETED
    width = max(q.shape[-1], value_dim)
    if q.dtype == torch.float32:
        tiles = FLOAT32
    elif not contiguous or kind == tiles_jit.FIRE:
        tiles = UNTIMED
    else:
        tiles = WIDE if width > 64 else TIMED
    if width > 128:
        tiles = tiles._replace(backward=min(tiles.backward, 32))
    return tiles._replace(stages=2) if width > 64 else tiles


def product_kind(q: Tensor) -> int:
    """How ``tiles_terms.dot`` multiplies q's dtype here: exact float32 (IEEE), the tensor cores' own (NATIVE), or
    widened first where the interpreter's bfloat16 products are wrong (UPCAST)."""
    if q.dtype == torch.float32:
        return tiles_jit.IEEE
    interpreted_bf16 = q.device.type == "cpu" and q.dtype == torch.bfloat16
    return tiles_jit.UPCAST if interpreted_bf16 else tiles_jit.NATIVE


def last_unit(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


class _TiledAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, q_values, k_values, q_pos, k_pos, settings):
        q, k, v = (last_unit(x) for x in (q, k, v))
        batch, heads, q_len, _ = q.shape
        # A learned term's gradient sums dS = P·(dP − D) over many pairs whose exact sums cancel, so D = Σ dout·out
        # taken from a bf16-rounded output misses it by that rounding: such a call keeps its output in float32.
        wide = q.dtype != torch.float32 and any(ctx.needs_input_grad[3:6])
        out = q.new_empty(batch, q_len, heads, v.shape[-1], dtype=torch.float32 if wide else q.dtype).transpose(1, 2)
        lse = torch.empty(batch * heads, q_len, device=q.device, dtype=torch.float32)
        terms = _Terms(q, k, v, bias, q_values, k_values, q_pos, k_pos, settings)
        tiles = _blocks(q, v.shape[-1], settings.kind, q_pos is None)
        tiles_jit.forward[(triton.cdiv(q_len, tiles.forward_m) * batch * heads,)](
            q, k, v, out, lse, *terms.pointers(), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *out.stride()[:3], *terms.strides(), heads, terms.group, *terms.sizes(), BLOCK_M=tiles.forward_m,
            BLOCK_N=tiles.forward_n, num_warps=tiles.forward_warps, num_stages=tiles.stages, **terms.flags())
        ctx.save_for_backward(q, k, v, out, lse, bias, q_values, k_values, q_pos, k_pos)
        ctx.settings = settings
        return out.to(q.dtype)  # token-major, as SDPA returns it

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, bias, q_values, k_values, q_pos, k_pos = ctx.saved_tensors
        terms = _Terms(q, k, v, bias, q_values, k_values, q_pos, k_pos, ctx.settings)
        grad_out = last_unit(grad_out)
        delta = (grad_out.float() * out.float()).sum(-1).contiguous()  # (B, H, Tq): Σ_d dout·out
        batch, heads, q_len = q.shape[:3]
        kv_heads, k_len = k.shape[1], k.shape[2]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        d_bias = torch.zeros_like(bias) if ctx.needs_input_grad[3] else None
        table_grad = d_bias is not None and ctx.settings.kind in (tiles_jit.TABLE, tiles_jit.FIRE)
        token_grad = q_values is not None and (ctx.needs_input_grad[4] or ctx.needs_input_grad[5])
        d_q_values = lse.new_empty(batch, heads, q_len) if token_grad else None
        d_k_values = lse.new_empty(batch, heads, k_len) if token_grad else None
        tiles = _blocks(q, v.shape[-1], ctx.settings.kind, q_pos is None)
        block = tiles.backward
        common = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3])
        launch = dict(num_warps=tiles.backward_warps, num_stages=tiles.stages, TOKEN_GRAD=token_grad, **terms.flags())
        tiles_jit.backward_keys[(triton.cdiv(k_len, block) * batch * kv_heads,)](
            q, k, v, grad_out, lse, delta, dk, dv, *terms.pointers(), terms.or_stand_in(d_k_values), *common,
            *dk.stride()[:3], *dv.stride()[:3], *terms.strides(), heads, terms.group, kv_heads, *terms.sizes(),
            terms.settings.scale, BLOCK_M=block, BLOCK_N=block, **launch)
        table, params, *positions_and_values = terms.pointers()
        d_table = d_bias if table_grad else None
        d_params = d_bias if d_bias is not None and not table_grad else None
        tiles_jit.backward_queries[(triton.cdiv(q_len, block) * batch * heads,)](
            q, k, v, grad_out, lse, delta, dq, table, terms.or_stand_in(d_table), params, terms.or_stand_in(d_params),
            *positions_and_values, terms.or_stand_in(d_q_values), *common, *dq.stride()[:3], *terms.strides(), heads,
            terms.group, *terms.sizes(), terms.settings.scale, BLOCK=block, TABLE_GRAD=table_grad,
            PARAM_GRAD=d_params is not None, **launch)
        return dq, dk, dv, d_bias, d_q_values, d_k_values, None, None, None


class _Terms:
    """The position terms of one call as the kernels take them: pointers (a stand-in for an absent term, never
    read), strides, sizes and compile-time flags."""

    def __init__(self, q, k, v, bias, q_values, k_values, q_pos, k_pos, settings: _Settings):
        self.q, self.q_values, self.k_values, self.q_pos, self.k_pos = q, q_values, k_values, q_pos, k_pos
        self.settings = settings
        self.stand_in = q.new_zeros(1, 2, dtype=torch.float32)
        rows = settings.kind in (tiles_jit.TABLE, tiles_jit.FIRE)  # a row per head the programs read from
        self.table = bias if rows else self.stand_in
        self.params = bias if not rows and settings.kind != tiles_jit.NONE else self.stand_in
        self.group = q.shape[1] // k.shape[1]
        self.q_len, self.k_len, self.value_dim = q.shape[2], k.shape[2], v.shape[-1]

    def or_stand_in(self, x: Tensor | None) -> Tensor:
        return self.stand_in if x is None else x

    def pointers(self) -> tuple:
        """TABLE, PARAMS, QPOS, KPOS, QVAL, KVAL."""
        return (self.table, self.params,
                *(self.or_stand_in(x) for x in (self.q_pos, self.k_pos, self.q_values, self.k_values)))

    def strides(self) -> tuple[int, ...]:
        """The table's row stride, the positions' batch strides, the token values' batch and head strides (0 for a
        batch of one, broadcast)."""
        def batch(x):
            return 0 if x is None or x.shape[0] == 1 else x.stride(0)

        def head(x):
            return 0 if x is None else x.stride(1)
        return (self.table.stride(0), batch(self.q_pos), batch(self.k_pos), batch(self.q_values),
                head(self.q_values), batch(self.k_values), head(self.k_values))

    def sizes(self) -> tuple:
        """q_len, k_len, shift (Tk − Tq), lowest, N, flat low and high, the base-2 logit scale."""
        settings = self.settings
        return (self.q_len, self.k_len, self.k_len - self.q_len, settings.lowest, self.table.shape[1],
                *settings.flat, settings.scale * LOG2E)

    def flags(self) -> dict:
        return dict(**widths(self.q, self.value_dim), CAUSAL=self.settings.causal, CONTIGUOUS=self.q_pos is None,
                    BIAS=self.settings.kind, HAS_TOKENS=self.q_values is not None, DOT=product_kind(self.q))
