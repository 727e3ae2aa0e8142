"""A one-input ReLU MLP as the piecewise-linear function it is: FIRE's f_θ as a table of segments, which
``tiles_triton`` reads per pair instead of evaluating the MLP's hidden units.

    f_h(x) = b2_h + Σ_k W2_hk · relu(W1_k · x + b1_k)

Hidden unit k bends at x_k = −b1_k / W1_k: for W1_k > 0 it is active past its kink, for W1_k < 0 before it, and for
W1_k = 0 it is the constant relu(b1_k). Between consecutive kinks (sorted) the active set is fixed, so on segment s

    f_h(x) = a_hs · x + c_hs,  a_hs = Σ_{k active on s} W2_hk · W1_k,  c_hs = b2_h + Σ_{k active on s} W2_hk b1_k.

The active sets are discrete (no gradient); a and c are differentiable in the weights, and at a fixed x the
derivative of a_hs · x + c_hs is the MLP's own (exact away from an x on a kink; there, as torch's
relu'(0) = 0, a unit counts as inactive). The kinks are shared by the heads: the hidden layer is.

The kernel's segment of x is the number of ``keys`` below it, ``#{r : keys[r] < x}`` (a binary search). The keys
are the kinks rounded to float32 so that for every float32 x this count crosses a unit exactly where
W1_k · x + b1_k > 0 changes in exact arithmetic; FIRE's x is never negative, so a kink below 0 is crossed by every
x (key −inf). Shapes: H heads, W hidden units, P = next power of two ≥ W + 1 keys (+inf past the W kinks), so the
search takes log2 P steps and its last key is never below x.
"""

from __future__ import annotations

import torch
from torch import Tensor


def key_count(width: int) -> int:
    """P: the power of two ≥ width + 1, so a search over P sorted keys whose last is +inf lands in 0 .. P − 1."""
    return 1 << width.bit_length()


def relu_segments(w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
                  precision: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
    """The segments of f_h(x) = b2_h + Σ_k w2_hk · relu(w1_k · x + b1_k) for x ≥ 0.

    Args:
        w1, b1: (W,) the hidden layer's weights (its single input column) and biases.
        w2: (H, W) and b2: (H,): the output layer.
        precision: the dtype of the x the keys are compared with (``kink_keys``): float32, or float64.
    Returns:
        keys (P,) in ``precision``, sorted, no gradient; slopes and intercepts (H, P) in the weights' dtype, differentiable:
        for x with s = #{r : keys[r] < x}, f_h(x) = slopes[h, s] · x + intercepts[h, s]. Entries past the last
        reachable segment repeat nothing useful (their keys are +inf).
    """
    width, keys_total = w1.shape[0], key_count(w1.shape[0])
    with torch.no_grad():
        keys = kink_keys(w1.detach(), b1.detach(), precision)  # (W,)
        padded = torch.cat([keys, keys.new_full((keys_total - width,), float("inf"))])  # (P,)
        order = torch.sort(padded, stable=True).indices  # units first among equal keys: the padding is +inf anyway
        rank = torch.empty_like(order)
        rank[order] = torch.arange(keys_total, device=order.device)
        crossed = rank[None, :width] < torch.arange(keys_total, device=w1.device)[:, None]  # (P, W): key below x
        active = torch.where(w1 > 0, crossed, torch.where(w1 < 0, ~crossed, (b1 > 0).expand_as(crossed)))
        active = active.to(w1.dtype)  # (P, W): unit k active on segment s
    slopes = (active * w1) @ w2.T  # (P, H)
    intercepts = (active * b1) @ w2.T + b2  # (P, H)
    return padded[order], slopes.T, intercepts.T


def kink_keys(w1: Tensor, b1: Tensor, precision: torch.dtype = torch.float32) -> Tensor:
    """(W,) keys in ``precision`` (float32 or float64): for x ≥ 0 of that dtype, ``key_k < x`` exactly where unit k
    is no longer as it is at small x (inactive for W1_k > 0, active for W1_k < 0), by W1_k · x + b1_k > 0 in exact
    arithmetic (float64: up to t's own rounding). With t = −b1_k / W1_k: W1_k > 0, active iff x > t: key = t
    rounded down; W1_k < 0, inactive iff x ≥ t: key = the number below t rounded up; W1_k = 0 never changes: +inf."""
    t = -b1.double() / w1.double()  # the kink, ±inf or nan where w1 = 0 (replaced below)
    nearest = t.to(precision)
    down = torch.where(nearest.double() > t, torch.nextafter(nearest, nearest.new_tensor(-float("inf"))), nearest)
    up = torch.where(nearest.double() < t, torch.nextafter(nearest, nearest.new_tensor(float("inf"))), nearest)
    below_up = torch.nextafter(up, up.new_tensor(-float("inf")))
    keys = torch.where(w1 > 0, down, below_up)
    keys = torch.where(keys < 0, -float("inf"), keys)  # x ≥ 0 crosses it always (and no float32 denormal key)
    return torch.where(w1 == 0, float("inf"), keys)


def segment_of(x: Tensor, keys: Tensor) -> Tensor:
    """The segment of each x, #{r : keys[r] < x}, as the kernel's search finds it (x in the keys' dtype): int64, x's
    shape."""
    return torch.searchsorted(keys, x.to(keys.dtype).contiguous(), right=False)


def piecewise_mlp(x: Tensor, keys: Tensor, slopes: Tensor, intercepts: Tensor) -> Tensor:
    """f(x) from the segments: x (...) ≥ 0 → (H, ...), in the slopes' dtype, differentiable in slopes and intercepts
    (and x)."""
    segment = segment_of(x, keys)  # (...)
    return slopes[:, segment] * x.to(slopes.dtype) + intercepts[:, segment]
