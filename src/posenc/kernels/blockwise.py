"""Attention in query blocks with a hand-written backward, for what SDPA's CPU kernels run slowly: a score
bias that needs a gradient (T5, Kerple, FIRE, CoPE, Transformer-XL's bias form), q/k much wider than v
(Transformer-XL's score channels), and a long causal mask (SDPA cannot be told a mask is causal).

SDPA on CPU falls back to its math path for a mask that needs a gradient, keeping B·H·Tq·Tk probabilities for
the backward (about 2.1× causal attention at T = 512 here); its flash kernel takes q, k and v of one width, so
channels that widen q and k to 160 must widen v to 160 too. FlexAttention has no backward on CPU (torch 2.13).

Forward: SDPA's CPU flash kernel when q and v have one width (it returns the rows' log-sum-exp), told when the
mask is causal; otherwise each block's logits, their log-sum-exp and ``p·v``. Backward: that kernel's own when
the bias needs no gradient, else per query block, recomputing the probabilities from the log-sum-exp,
``p = exp(scale·q·kᵀ + bias − lse)``:

    dv += pᵀ·dout,   ds = p ⊙ (dout·vᵀ − rowsum(dout ⊙ out)),   dq = scale·ds·k,   dk += scale·dsᵀ·q,
    dbias = ds summed over the dimensions the bias broadcasts along.

At most B·H·block·Tk logits exist at once, and with ``causal`` a block reads only the keys up to its last
query (half the products, as the fused causal kernel skips them). Computed in float32 (float64 for float64).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import checks
from . import cpu_flash

#: keys from which a causal float mask runs faster through this kernel (SDPA's CPU flash kernel told the mask
#: is causal, so it skips the upper triangle) than through ``scaled_dot_product_attention``, which cannot be
#: told both: ALiBi's mask at 512 keys 1.09 vs 1.06× causal attention, at 1,024 1.11 vs 1.43, at 2,048 1.12 vs
#: 1.76 (fwd+bwd, B·T = 4,096, H = 4, Dh = 32, AMD EPYC)
CPU_CAUSAL_MASK_FROM_KEYS = 1024


def available(q: Tensor) -> bool:
    """Whether this kernel runs on q's device with this torch (CPU, with SDPA's flash kernel)."""
    return cpu_flash.available(q)


@dataclass(frozen=True)
class ChannelBlocks:
    """Query-side channels built one query block at a time: ``build(start, end, *inputs)`` returns the
    (B or 1, H, end − start, width) channels of queries start..end−1, differentiably in ``inputs``. The
    blockwise kernel then keeps only the inputs for the backward and rebuilds each block there, where a
    (B, H, Tq, width) tensor would be four times q for Transformer-XL's 128 channels on a 32-wide head."""

    build: Callable[..., Tensor]
    inputs: tuple[Tensor, ...]
    length: int
    width: int

    def full(self) -> Tensor:
        """Every query's channels, (B or 1, H, Tq, width)."""
        return self.build(0, self.length, *self.inputs)


@dataclass(frozen=True)
class ShiftedQueries:
    """Queries plus one vector per head, ``q + shift[h]`` (Transformer-XL's q + u), added inside the kernel so
    that the sum is never kept for the backward. q: (B, H, Tq, Dh); shift: (H, Dh)."""

    q: Tensor
    shift: Tensor

    def full(self) -> Tensor:
        return self.q + self.shift[None, :, None, :]


def blockwise_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None = None, *, scale: float,
                        causal: bool = False, block: int = 64, q_channels: Tensor | ChannelBlocks | None = None,
                        k_channels: Tensor | None = None, q_shift: Tensor | None = None) -> Tensor:
    """``softmax(scale·(q·kᵀ + q_channels·k_channelsᵀ) + bias)·v``; its backward also returns the gradients of
    the bias and the channels.

    Args:
        q: (B, H, Tq, Dh); k: (B, Hkv, Tk, Dh); v: (B, Hkv, Tk, Dv), any Dv; H a multiple of Hkv (grouped-query
            attention: each key/value head serves H/Hkv consecutive query heads).
        bias: float (B or 1, H or 1, Tq, Tk), −inf where a pair may not attend; None for no bias.
            A row with no allowed key returns zeros, as SDPA does.
        q_channels: (B or 1, H, Tq, C), or ``ChannelBlocks`` that build them per block, and
            k_channels: (B or 1, 1, Tk, C): score terms as channels (``PositionalEncoding.score_channel_parts``);
            the key side is shared by every head, so each block meets it in one product for all heads.
        q_shift: (H, Dh), added to every query (Transformer-XL's content bias u) inside the kernel, so that
            q + u is never kept for the backward.
        scale: logit scale.
        causal: also mask every key after its query; needs Tq = Tk with queries and keys at the same
            positions (a training step, a prefill). Blocks then skip the keys after their last query.
        block: queries per block.
    Returns:
        (B, H, Tq, Dv) in q's dtype.
    """
    checks.positive_int("block", block)
    if bias is not None and not bias.is_floating_point():
        raise ValueError(f"bias must be a float tensor (−inf where a pair may not attend), got {bias.dtype}")
    if k.shape[1] != q.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    if bias is not None and (bias.dim() != 4 or bias.shape[2:] != (q.shape[2], k.shape[2]) or any(
            b not in (1, n) for b, n in zip(bias.shape[:2], q.shape[:2]))):
        raise ValueError(f"bias must be (B or 1, H or 1, Tq, Tk) = {tuple(q.shape[:3]) + (k.shape[2],)}, "
                         f"got {tuple(bias.shape)}")
    if q_shift is not None and q_shift.shape != (q.shape[1], q.shape[3]):
        raise ValueError(f"q_shift must be (H, Dh) = {(q.shape[1], q.shape[3])}, got {tuple(q_shift.shape)}")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"causal needs as many queries as keys, got Tq={q.shape[2]} and Tk={k.shape[2]}")
    lazy = q_channels if isinstance(q_channels, ChannelBlocks) else None
    query_shape = None if q_channels is None else (
        (q.shape[1], lazy.length, lazy.width) if lazy else tuple(q_channels.shape[1:]))
    if (q_channels is None) != (k_channels is None) or q_channels is not None and (
            query_shape[:2] != q.shape[1:3] or k_channels.shape[1:3] != (1, k.shape[2])
            or query_shape[-1] != k_channels.shape[-1]):
        raise ValueError("q_channels and k_channels go together, shaped (B or 1, H, Tq, C) and (B or 1, 1, Tk, C): "
                         f"got (H, Tq, C) = {query_shape} and "
                         f"{None if k_channels is None else tuple(k_channels.shape)}")
    if lazy:
        return _BlockwiseAttention.apply(q, k, v, bias, None, k_channels, q_shift, scale, causal, block, lazy.build,
                                         *lazy.inputs)
    return _BlockwiseAttention.apply(q, k, v, bias, q_channels, k_channels, q_shift, scale, causal, block, None)


class _BlockwiseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, q_channels, k_channels, q_shift, scale, causal, block, build, *build_inputs):
        compute = compute_dtype(q.dtype)
        mask = None if bias is None else bias.to(compute)
        shifted = q if q_shift is None else q + q_shift[None, :, None, :]
        fused = q.shape[-1] == v.shape[-1] and k_channels is None
        # with no gradient for the bias, the fused kernel's own backward serves (it skips the upper triangle too)
        ctx.fused_backward = fused and q_shift is None and not ctx.needs_input_grad[3]
        if fused:
            out, lse = cpu_flash.forward(shifted, k, v, is_causal=causal, attn_mask=mask, scale=scale)
        else:
            q_, k_, v_, q_channels_, k_channels_ = _cast(compute, shifted, k, v, q_channels, k_channels)
            scores = _Scores(q_, k_, mask, q_channels_, k_channels_, scale, causal, build, _cast(compute, *build_inputs))
            out, lse = _forward_in_blocks(scores, v_, block)
        ctx.save_for_backward(q, k, v, bias, q_channels, k_channels, q_shift, out, lse, *build_inputs)
        ctx.scale, ctx.causal, ctx.block, ctx.build = scale, causal, block, build
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors
        compute = compute_dtype(saved[0].dtype)
        if ctx.fused_backward:
            q, k, v, bias, out, lse = saved[0], saved[1], saved[2], saved[3], saved[7], saved[8]
            grads = getattr(torch.ops.aten, cpu_flash.NAME + "_backward")(
                grad_out.contiguous(), q, k, v, out, lse, 0.0, ctx.causal,
                attn_mask=None if bias is None else bias.to(compute), scale=ctx.scale)
            return (*grads, *(None,) * (8 + len(saved) - 9))
        q, k, v, bias, q_channels, k_channels, q_shift, out, grad_out = _cast(compute, *saved[:8], grad_out)
        lse, build_inputs = saved[8], saved[9:]
        q = q if q_shift is None else q + q_shift[None, :, None, :]  # lives for this backward only
        wants = ctx.needs_input_grad
        built = _Rebuilt(ctx.build, _cast(compute, *build_inputs), wants[11:]) if ctx.build else None
        scores = _Scores(q, k, bias, q_channels, k_channels, ctx.scale, ctx.causal, built and built.block)
        row_terms = (grad_out * out).sum(-1, keepdim=True)  # (B, H, Tq, 1): Σ_j p_ij dp_ij
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        grad_bias = torch.zeros_like(bias) if wants[3] else None  # (B or 1, H or 1, Tq, Tk)
        grad_q_channels = torch.zeros_like(q_channels) if wants[4] else None
        grad_k_channels = torch.zeros_like(k_channels) if wants[5] else None
        for start, end, keys in query_blocks(q.shape[2], k.shape[2], ctx.block, ctx.causal):
            dout_block = grad_out[:, :, start:end]
            probs = scores.block(start, end, keys).sub_(lse[:, :, start:end, None]).exp_()  # (B, H, b, keys)
            grad_v[:, :, :keys] += probs.transpose(-1, -2) @ dout_block
            grad_scores = probs.mul_((dout_block @ v[:, :, :keys].transpose(-1, -2)).sub_(row_terms[:, :, start:end]))
            grad_q[:, :, start:end] = (grad_scores @ k[:, :, :keys]).mul_(ctx.scale)
            grad_k[:, :, :keys] += (grad_scores.transpose(-1, -2) @ q[:, :, start:end]).mul_(ctx.scale)
            if grad_bias is not None:
                grad_bias[:, :, start:end, :keys] = _sum_to(grad_scores, grad_bias.shape[:2])
            if grad_q_channels is not None or built is not None:  # heads folded into rows, as in the scores
                rows = (grad_scores.flatten(1, 2) @ k_channels[:, 0, :keys]).unflatten(1, (q.shape[1], -1))
                if built is not None:
                    built.backward(rows.mul_(ctx.scale))
                else:
                    grad_q_channels[:, :, start:end] = _sum_to(rows.mul_(ctx.scale), grad_q_channels.shape[:2])
            if grad_k_channels is not None:
                query_side = scores.q_channels_block(start, end).flatten(1, 2)  # (B or 1, H·b, C)
                rows = grad_scores.flatten(1, 2).transpose(-1, -2) @ query_side
                grad_k_channels[:, 0, :keys] += _sum_to(rows.mul_(ctx.scale)[:, None], grad_k_channels.shape[:2])[:, 0]
        grad_q_shift = grad_q.sum((0, 2)) if wants[6] else None
        grads = (grad_q, grad_k, grad_v, grad_bias, grad_q_channels, grad_k_channels, grad_q_shift)
        built_grads = built.grads if built else ()
        return (*(None if g is None else g.to(t.dtype) for g, t in zip(grads, saved)), None, None, None, None,
                *(None if g is None else g.to(t.dtype) for g, t in zip(built_grads, build_inputs)))


class _Rebuilt:
    """``ChannelBlocks`` in the backward: each block rebuilt with autograd on, its channels' gradient sent back
    through the build into the inputs' gradients."""

    def __init__(self, build, inputs, wanted):
        self.build, self.wanted = build, wanted
        self.inputs = [t.detach().requires_grad_(w) for t, w in zip(inputs, wanted)]
        self.grads = [torch.zeros_like(t) if w else None for t, w in zip(inputs, wanted)]
        self._block = None

    def block(self, start: int, end: int) -> Tensor:
        with torch.enable_grad():
            self._block = self.build(start, end, *self.inputs)
        return self._block.detach()

    def backward(self, grad_channels: Tensor) -> None:
        """Add the inputs' share of the channel gradient of the block ``block(start, end)`` built last."""
        needed = [t for t, w in zip(self.inputs, self.wanted) if w]
        if not needed:
            return
        shares = iter(torch.autograd.grad(self._block, needed, _sum_to(grad_channels, self._block.shape[:2])))
        for index, wanted in enumerate(self.wanted):
            if wanted:
                self.grads[index] += next(shares)


class _Scores:
    """``scale·(q·kᵀ + q_channels·k_channelsᵀ) + bias`` one query block at a time, −inf after the query when
    causal; every tensor already in the compute dtype."""

    def __init__(self, q, k, bias, q_channels, k_channels, scale, causal, build=None, build_inputs=()):
        """``build``: the query side is built per block, ``build(start, end, *build_inputs)``."""
        self.q, self.k, self.bias, self.scale, self.causal = q, k, bias, scale, causal
        self.q_channels, self.k_channels = q_channels, k_channels
        self.build, self.build_inputs = build, build_inputs
        self._last = None

    def q_channels_block(self, start: int, end: int) -> Tensor:
        """(B or 1, H, end − start, C): the query side of the channels, built once per block."""
        if self.build is None:
            return self.q_channels[:, :, start:end]
        if self._last is None or self._last[0] != (start, end):
            self._last = ((start, end), self.build(start, end, *self.build_inputs))
        return self._last[1]

    def block(self, start: int, end: int, keys: int) -> Tensor:
        """(B, H, end − start, keys) logits of queries start..end−1 against keys 0..keys−1."""
        logits = self.q[:, :, start:end] @ self.k[:, :, :keys].transpose(-1, -2)
        if self.k_channels is not None:  # heads folded into rows: one product against the shared key side
            query_side = self.q_channels_block(start, end).flatten(1, 2)
            rows = query_side @ self.k_channels[:, 0, :keys].transpose(-1, -2)
            logits.add_(rows.unflatten(1, (self.q.shape[1], -1)))
        logits.mul_(self.scale)
        if self.bias is not None:
            logits.add_(self.bias[:, :, start:end, :keys])
        if self.causal:  # only the block's diagonal square has keys after their query
            after = torch.ones(end - start, end - start, dtype=torch.bool, device=logits.device).triu_(1)
            logits[..., start:end].masked_fill_(after, float("-inf"))
        return logits


def _forward_in_blocks(scores: _Scores, v: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """(out (B, H, Tq, Dv), log-sum-exp (B, H, Tq)); a row with no allowed key: zeros and log-sum-exp 0."""
    q_len, k_len = scores.q.shape[2], v.shape[2]
    out = token_major_zeros(scores.q.shape[:3] + v.shape[-1:], v)
    lse = v.new_zeros(scores.q.shape[:3])
    for start, end, keys in query_blocks(q_len, k_len, block, scores.causal):
        logits = scores.block(start, end, keys)
        row_lse = torch.logsumexp(logits, dim=-1).nan_to_num(0.0, posinf=0.0, neginf=0.0)  # as the flash kernel
        lse[:, :, start:end] = row_lse
        out[:, :, start:end] = logits.sub_(row_lse[..., None]).exp_() @ v[:, :, :keys]
    return out, lse


def token_major_zeros(shape: tuple[int, int, int, int], like: Tensor) -> Tensor:
    """Zeros (B, H, T, D) laid out as (B, T, H, D), as SDPA returns its output: a model's
    ``out.transpose(1, 2).reshape(B, T, H·D)`` is then a view, not a copy autograd keeps once more."""
    batch, heads, length, width = shape
    return like.new_zeros(batch, length, heads, width).transpose(1, 2)


def query_blocks(q_len: int, k_len: int, block: int, causal: bool):
    """(start, end, keys) per query block: causal blocks read only the keys up to their last query."""
    for start in range(0, q_len, block):
        end = min(start + block, q_len)
        yield start, end, end if causal else k_len


def _cast(dtype: torch.dtype, *tensors: Tensor | None) -> list[Tensor | None]:
    return [None if t is None else t.to(dtype) for t in tensors]


def _sum_to(grad: Tensor, leading: tuple[int, int]) -> Tensor:
    """Sum (B, H, …) down to the bias's leading (B or 1, H or 1) dimensions."""
    dims = [d for d in range(2) if leading[d] == 1 and grad.shape[d] != 1]
    return grad.sum(dims, keepdim=True) if dims else grad


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32
