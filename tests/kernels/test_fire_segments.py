"""FIRE's MLP as linear segments (``kernels.fire_segments``): the values and the gradients of every weight equal the
MLP's in float64, whatever the width (a power of two or not) and the signs of W1 (negative and zero entries); an x
on a kink reads one value from both sides and torch's relu'(0) = 0 gradient; each key is crossed by float32 x
exactly where its unit's pre-activation changes sign. The kernel reads these tables: tests/kernels/test_tiles_triton.py.
"""

from fractions import Fraction

import pytest
import torch

import posenc
from posenc.kernels.fire_segments import key_count, kink_keys, piecewise_mlp, relu_segments, segment_of

HEADS = 3


def mlp(x, w1, b1, w2, b2):
    """f(x) = w2 · relu(w1 · x + b1) + b2: x (N,) -> (H, N), the MLP as FIRE evaluates it."""
    return (torch.relu(x[:, None] * w1 + b1) @ w2.T + b2).T


def weights(width: int, seed: int):
    """float64 (w1, b1, w2, b2) with W1 of both signs and two zeros (a unit always active, one never), and a bias of
    0 (a kink at x = 0) when W allows; kinks spread over [0, 1], where FIRE's x lies, and some outside it."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(width, generator=g, dtype=torch.float64) * 3
    kinks = torch.rand(width, generator=g, dtype=torch.float64) * 1.4 - 0.2
    b1 = -w1 * kinks
    if width >= 4:
        w1[1], w1[2], b1[3] = 0.0, -abs(float(w1[2])), 0.0
        b1[1] = 0.5  # constant relu(0.5)
    if width >= 5:
        w1[4], b1[4] = 0.0, -0.5  # constant relu(−0.5) = 0
    w2 = torch.randn(HEADS, width, generator=g, dtype=torch.float64)
    b2 = torch.randn(HEADS, generator=g, dtype=torch.float64)
    return [w.float().double() for w in (w1, b1, w2, b2)]  # float32 values, as a module's


def points(keys: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """float32-valued x ≥ 0: random in [0, 1.5] and 0, each finite key and its float32 neighbours (float64)."""
    g = torch.Generator().manual_seed(seed)
    finite = keys[torch.isfinite(keys) & (keys >= 0)]
    near = torch.cat([finite, torch.nextafter(finite, finite + 1), torch.nextafter(finite, finite - 1)])
    x = torch.cat([torch.rand(count, generator=g) * 1.5, torch.zeros(1), near.clamp_min(0)])
    return x.float().double()


@pytest.mark.parametrize("width", [1, 5, 8, 32, 33])
def test_segments_equal_the_mlp_in_value_and_in_every_weights_gradient(width):
    w1, b1, w2, b2 = weights(width, seed=width)
    keys, slopes, intercepts = relu_segments(w1, b1, w2, b2)
    x = points(keys, 400, seed=width)
    expected = mlp(x, w1, b1, w2, b2)
    torch.testing.assert_close(piecewise_mlp(x, keys, slopes, intercepts), expected, rtol=1e-12, atol=1e-12)
    # gradients at x off the kinks (a kink's float32 neighbours are off it: the keys count them on the right side)
    x = x[(x[:, None] * w1 + b1 != 0).all(1)]
    upstream = torch.randn(HEADS, x.shape[0], dtype=torch.float64)
    exact = [w.clone().requires_grad_() for w in (w1, b1, w2, b2)]
    table = [w.clone().requires_grad_() for w in (w1, b1, w2, b2)]
    wanted = torch.autograd.grad((mlp(x, *exact) * upstream).sum(), exact)
    got = torch.autograd.grad((piecewise_mlp(x, *relu_segments(*table)) * upstream).sum(), table)
    for name, a, b in zip(("w1", "b1", "w2", "b2"), got, wanted):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


def test_an_x_on_a_kink_reads_one_value_from_both_sides_and_torchs_relu_gradient():
    """Kinks exactly on float32 x (−b1/w1 exact), of both signs and at x = 0: the segments just left and right of
    each (those of its float32 neighbours) give f(x) too; the one chosen gives torch's gradient, where a unit at its
    kink is inactive."""
    w1 = torch.tensor([1.0, -1.0, 2.0, -2.0, 1.5, -0.5], dtype=torch.float64)
    x_on = torch.tensor([0.375, 0.375, 0.0, 0.0, 0.75, 0.25], dtype=torch.float64)  # float32 values
    b1 = -w1 * x_on
    w2 = torch.randn(HEADS, 6, dtype=torch.float64)
    b2 = torch.randn(HEADS, dtype=torch.float64)
    keys, slopes, intercepts = relu_segments(w1, b1, w2, b2)
    x = x_on.unique()
    expected = mlp(x, w1, b1, w2, b2)
    left, right = (segment_of(torch.nextafter(x.float(), x.float() + step), keys) for step in (-1, 1))
    assert ((left != segment_of(x, keys)) | (right != segment_of(x, keys))).all()  # another segment beside each
    for side in (left, segment_of(x, keys), right):
        torch.testing.assert_close(slopes[:, side] * x + intercepts[:, side], expected, rtol=1e-14, atol=1e-14)
    exact = [w.clone().requires_grad_() for w in (w1, b1, w2, b2)]
    table = [w.clone().requires_grad_() for w in (w1, b1, w2, b2)]
    upstream = torch.randn(HEADS, x.shape[0], dtype=torch.float64)
    wanted = torch.autograd.grad((mlp(x, *exact) * upstream).sum(), exact)
    got = torch.autograd.grad((piecewise_mlp(x, *relu_segments(*table)) * upstream).sum(), table)
    for name, a, b in zip(("w1", "b1", "w2", "b2"), got, wanted):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14, msg=name)


def test_each_key_is_crossed_where_its_units_preactivation_changes_sign():
    """For float32 x at and around every kink, (key < x) says whether unit k differs from its state at small x, as
    the sign of w1·x + b1 in exact arithmetic says (float64 holds a float32 product exactly and keeps the sign of
    the sum)."""
    g = torch.Generator().manual_seed(7)
    w1 = (torch.randn(64, generator=g) * torch.rand(64, generator=g).pow(4) * 10).double()
    b1 = torch.randn(64, generator=g).double()
    w1[:4] = torch.tensor([0.0, 0.0, -3.0, 3.0], dtype=torch.float64)
    b1[:4] = torch.tensor([0.5, -0.5, 0.0, 0.0], dtype=torch.float64)
    keys = relu_segments(w1, b1, torch.zeros(1, 64, dtype=torch.float64), torch.zeros(1, dtype=torch.float64))[0]
    unsorted = kink_keys(w1, b1)  # (W,) in the units' order
    assert keys.shape == (128,) and torch.equal(keys[:64], unsorted.sort().values) and (keys[64:] == float("inf")).all()
    assert keys.dtype == unsorted.dtype == torch.float32  # as the kernel compares them with its float32 x
    t = (-b1 / w1).float()
    x = torch.cat([t, torch.nextafter(t, t + 1), torch.nextafter(t, t - 1), torch.zeros(1)]).clamp_min(0)
    x = x[torch.isfinite(x)].double()
    assert torch.equal(unsorted.double() < x[:, None], changes_sign(x, w1, b1))
    # the search rounds x to the keys' dtype first: a float64 x just past a key, equal to it in float32, is not past
    finite = keys[torch.isfinite(keys) & (keys > 0)]
    assert torch.equal(segment_of(finite.double() * (1 + 1e-12), keys), segment_of(finite, keys))


def test_float64_keys_are_crossed_where_float64_x_changes_the_unit():
    """Keys for float64 x classify x two float64 steps either side of each kink as exact arithmetic does; keys
    rounded to float32 would not (a float32 key lies up to 2^-24 of the kink away: 16 x-unit pairs here)."""
    g = torch.Generator().manual_seed(8)
    w1, b1 = torch.randn(32, generator=g).double(), torch.randn(32, generator=g).double()
    keys = relu_segments(w1, b1, torch.zeros(1, 32, dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
                         torch.float64)[0]
    assert keys.dtype == torch.float64
    beside = []
    for direction in (float("inf"), -float("inf")):
        x = -b1 / w1  # (W,) the kinks
        for _ in range(2):
            x = torch.nextafter(x, torch.full_like(x, direction))
        beside.append(x)
    x = torch.cat(beside)
    x = x[x > 0]
    assert torch.equal(kink_keys(w1, b1, torch.float64) < x[:, None], changes_sign(x, w1, b1))


def changes_sign(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor) -> torch.Tensor:
    """(N, W) bool: whether unit k at x differs from its state at small x (w1 > 0: active; w1 < 0: inactive), by
    the sign of w1·x + b1 in exact arithmetic (fractions: float64's product and sum would round)."""
    exact = [[Fraction(float(xi)) * Fraction(float(w)) + Fraction(float(b)) > 0 for w, b in zip(w1, b1)] for xi in x]
    active = torch.tensor(exact, dtype=torch.bool).reshape(x.shape[0], w1.shape[0])
    return torch.where(w1 > 0, active, torch.where(w1 < 0, ~active, torch.zeros_like(active)))


@pytest.mark.parametrize("width, keys", [(1, 2), (5, 8), (7, 8), (8, 16), (32, 64), (33, 64)])
def test_fire_offset_formula_is_its_segments_padded_to_a_power_of_two(width, keys):
    assert key_count(width) == keys
    fire = posenc.build("fire", num_heads=HEADS, width=width)
    kind, params = fire.offset_formula()
    assert kind == "fire" and params.shape == (HEADS, 3 * keys + 2) and params.dtype == torch.float32
    assert torch.equal(params[:, :keys], params[:, :keys].sort().values)
    assert (params[:, width:keys] == float("inf")).all()
    torch.testing.assert_close(params[:, -2:], torch.tensor([[0.1, 512.0]]).expand(HEADS, 2))
    x = torch.rand(200).double()
    bias = piecewise_mlp(x, params[0, :keys], params[:, keys:2 * keys].double(), params[:, 2 * keys:3 * keys].double())
    layers = [w.detach().double() for w in (fire.mlp[0].weight[:, 0], fire.mlp[0].bias, fire.mlp[2].weight,
                                            fire.mlp[2].bias)]
    torch.testing.assert_close(bias, mlp(x, *layers), rtol=1e-5, atol=1e-5)  # float32 slopes and intercepts
