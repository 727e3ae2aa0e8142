"""RoPE applied as one fused operation with its own backward pass.

A rotation is orthogonal: the gradient of ``y = R(θ) x`` with respect to x is
``R(−θ) dy``. So the backward pass is the same kernel with sin negated, and the
only tensors kept for it are cos and sin (T × F each), never the activations
(autograd through the plain formula keeps x's halves and several temporaries).

The kernel writes each output half straight into its slice of one output tensor
(``mul`` then ``addcmul_``), so nothing is concatenated or stacked. Math runs in
float32 for bf16/fp16 activations (float64 for float64 ones); the result has the
activations' dtype.

Shapes: B batch, H heads, T positions, Dh head width, F rotated pairs (2F <= Dh).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import rope_cpu

LAYOUTS = ("half", "interleaved")  # pairs (c, c + F) as transformers rotates them; pairs (2c, 2c + 1) as the paper


def rope_angles(positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Angles position · inv_freq in float64, exact for positions far beyond 2^20.

    Args:
        positions: (..., T) integer positions.
        inv_freq: (F,) inverse frequencies.
    Returns:
        (..., T, F) float64.
    """
    return positions.to(torch.float64)[..., None] * inv_freq.to(device=positions.device, dtype=torch.float64)


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, attention_factor: float = 1.0,
                 dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos and sin of position · inv_freq, times attention_factor, ready for ``rotate_pairs``.

    Angles are formed in float64 from int64 positions (exact far beyond 2^20) and only
    the results are rounded to ``dtype``.

    Args:
        positions: (B or 1, T) integer positions.
        inv_freq: (F,) inverse frequencies.
        attention_factor: multiplies cos and sin (YaRN, LongRoPE).
        dtype: float32, or float64 for oracles.
    Returns:
        cos, sin: (B or 1, 1, T, F) in ``dtype``, broadcasting over heads.
    """
    angles = rope_angles(positions, inv_freq).unsqueeze(1)  # (B or 1, 1, T, F)
    return (angles.cos() * attention_factor).to(dtype), (angles.sin() * attention_factor).to(dtype)


def _pairs(x: Tensor, pairs: int, layout: str) -> tuple[Tensor, Tensor]:
    """The two members of every rotated pair, as views: (..., F) each."""
    if layout == "half":
        return x[..., :pairs], x[..., pairs : 2 * pairs]
    return x[..., 0 : 2 * pairs : 2], x[..., 1 : 2 * pairs : 2]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str, inverse: bool = False) -> Tensor:
    """(x1, x2) -> (x1 cos − x2 sin, x2 cos + x1 sin) on every pair (sin negated when ``inverse``);
    other channels copied. On CPU by the C++ kernel where it serves."""
    if rope_cpu.serves(x, cos, sin):
        return rope_cpu.rotate_into(x, torch.empty_like(x), cos, sin, layout, inverse)
    if inverse:
        sin = -sin
    source = x if x.dtype == cos.dtype else x.to(cos.dtype)
    pairs = cos.shape[-1]
    x1, x2 = _pairs(source, pairs, layout)
    if torch.compiler.is_compiling():
        # Under torch.compile write the formula: inductor fuses it into one loop, and
        # dynamo does not trace the strided ``out=`` writes below.
        y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        rotated = torch.cat((y1, y2), -1) if layout == "half" else torch.stack((y1, y2), -1).flatten(-2)
        return torch.cat((rotated, source[..., 2 * pairs :]), -1).to(x.dtype)
    out = torch.empty_like(source)  # (B, H, T, Dh), in x's memory order (no transposing copy)
    y1, y2 = _pairs(out, pairs, layout)
    torch.mul(x1, cos, out=y1)
    y1.addcmul_(x2, sin, value=-1.0)
    torch.mul(x2, cos, out=y2)
    y2.addcmul_(x1, sin)
    if 2 * pairs < x.shape[-1]:
        out[..., 2 * pairs :] = source[..., 2 * pairs :]  # partial rotary: the rest passes through
    return out if out.dtype == x.dtype else out.to(x.dtype)


class _RotatePairs(torch.autograd.Function):
    @staticmethod
    def forward(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
        return _rotate(x, cos, sin, layout)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _, cos, sin, layout = inputs
        ctx.save_for_backward(cos, sin)
        ctx.layout = layout

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, sin, ctx.layout, inverse=True), None, None, None


class _RotatePairsInPlace(_RotatePairs):
    """The same rotation written into x; the backward pass is inherited."""

    @staticmethod
    def forward(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
        if rope_cpu.serves(x, cos, sin):
            return rope_cpu.rotate_into(x, x, cos, sin, layout)
        x1, x2 = _pairs(x, cos.shape[-1], layout)
        y1 = x1 * cos  # (B, H, T, F) temporaries in the math dtype, one per pair member
        y1.addcmul_(x2, sin, value=-1.0)
        y2 = x2 * cos
        y2.addcmul_(x1, sin)
        x1.copy_(y1)
        x2.copy_(y2)
        return x

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        _RotatePairs.setup_context(ctx, inputs, output)
        ctx.mark_dirty(inputs[0])


def rotate_pairs_(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half") -> Tensor:
    """``rotate_pairs`` written into x itself; returns x.

    For a caller that owns x (a model rotating the q/k slices of its own qkv projection):
    no output is allocated, and whatever keeps q and k for the backward pass (SDPA does)
    keeps the projection's storage rather than two new tensors. Under ``torch.compile``
    it returns a new tensor instead (inductor plans the memory itself): use the result.
    """
    if torch.compiler.is_compiling():
        return rotate_pairs(x, cos, sin, layout)
    return _RotatePairsInPlace.apply(x, cos, sin, _checked(layout))


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half") -> Tensor:
    """Rotate the first 2F channels of x by the angles behind (cos, sin).

    Differentiable in x (the backward rotates the gradient back); cos and sin are
    treated as constants, which they are: functions of positions and fixed frequencies.

    Args:
        x: (B, H, T, Dh) queries or keys, any float dtype, any strides.
        cos, sin: (B or 1, 1, T, F) from ``rope_cos_sin``; their dtype is the math dtype.
        layout: "half" (pairs c, c + F) or "interleaved" (pairs 2c, 2c + 1).
    Returns:
        (B, H, T, Dh) contiguous, x's dtype.
    """
    return _RotatePairs.apply(x, cos, sin, _checked(layout))


def _checked(layout: str) -> str:
    """``layout`` itself, or a ValueError naming the two layouts: any other string would rotate as "half" on the
    C++ path and as "interleaved" in Python."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return layout
