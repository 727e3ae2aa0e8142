"""The fused RoPE rotation equals the plain formula, forward and backward, and saves only cos/sin."""

import pytest
import torch

from posenc.kernels import rope_cos_sin, rotate_pairs
from tests import oracles


def reference(x, cos, sin, layout):
    """The textbook formula with autograd through every op (what the fused op replaces)."""
    pairs = cos.shape[-1]
    if layout == "half":
        x1, x2 = x[..., :pairs], x[..., pairs : 2 * pairs]
    else:
        x1, x2 = x[..., 0 : 2 * pairs : 2], x[..., 1 : 2 * pairs : 2]
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.cat((y1, y2), -1) if layout == "half" else torch.stack((y1, y2), -1).flatten(-2)
    return torch.cat((rotated, x[..., 2 * pairs :]), -1)


def tables(positions, pairs, dtype=torch.float64, factor=1.0):
    inv_freq = 10000.0 ** (-torch.arange(pairs, dtype=torch.float64) / pairs)
    return (*rope_cos_sin(positions, inv_freq, factor, dtype), inv_freq)


CASES = [("half", 8, 4), ("interleaved", 8, 4), ("half", 10, 3), ("interleaved", 10, 3)]  # layout, Dh, F


@pytest.mark.parametrize("layout, head_dim, pairs", CASES)
def test_matches_the_per_pair_oracle(layout, head_dim, pairs):
    positions = torch.tensor([[0, 3, 7, 1 << 20]])
    cos, sin, inv_freq = tables(positions, pairs)
    x = torch.randn(1, 2, 4, head_dim, dtype=torch.float64)
    got = rotate_pairs(x, cos, sin, layout)
    for h in range(2):
        partial = oracles.rotate_pairs(x[0, h, :, : 2 * pairs], positions[0].tolist(), inv_freq.tolist(), layout)
        torch.testing.assert_close(got[0, h, :, : 2 * pairs], partial, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[..., 2 * pairs :], x[..., 2 * pairs :], rtol=0, atol=0)


@pytest.mark.parametrize("layout, head_dim, pairs", CASES)
def test_gradient_is_the_formula_gradient(layout, head_dim, pairs):
    positions = torch.tensor([[2, 5, 9], [0, 1, 40]])  # per-batch positions
    cos, sin, _ = tables(positions, pairs, factor=1.3)  # attention factor: cos/sin not unit
    x = torch.randn(2, 3, 3, head_dim, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rotate_pairs(t, cos, sin, layout), (x,))
    upstream = torch.randn(2, 3, 3, head_dim, dtype=torch.float64)
    (fused,) = torch.autograd.grad(rotate_pairs(x, cos, sin, layout), x, upstream)
    (formula,) = torch.autograd.grad(reference(x, cos, sin, layout), x, upstream)
    torch.testing.assert_close(fused, formula, rtol=1e-12, atol=1e-12)


def test_float32_matches_current_formula_on_strided_input():
    """Queries are strided views of a fused qkv projection; float32, 1e-5."""
    qkv = torch.randn(2, 16, 3, 4, 8)  # (B, T, 3, H, Dh)
    q = qkv.permute(2, 0, 3, 1, 4)[0].requires_grad_()  # (B, H, T, Dh), not contiguous
    cos, sin, _ = tables(torch.arange(16)[None], 4, torch.float32)
    upstream = torch.randn(2, 4, 16, 8)
    fused = rotate_pairs(q, cos, sin)
    formula = reference(q, cos, sin, "half")
    torch.testing.assert_close(fused, formula, rtol=1e-5, atol=1e-5)
    (g1,) = torch.autograd.grad(fused, q, upstream)
    (g2,) = torch.autograd.grad(formula, q, upstream)
    torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-5)


def test_bfloat16_activations_rotate_in_float32():
    positions = torch.tensor([[(1 << 20) - 1]])
    cos, sin, _ = tables(positions, 4, torch.float32)
    x = torch.randn(1, 1, 1, 8).to(torch.bfloat16)
    got = rotate_pairs(x, cos, sin)
    assert got.dtype == torch.bfloat16
    exact = reference(x.double(), cos.double(), sin.double(), "half")
    assert (got.double() - exact).abs().max() < 2e-2


def test_backward_saves_only_cos_and_sin():
    """Nothing of the size of the activations is kept for the backward pass."""
    saved = []

    def pack(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    x = torch.randn(2, 4, 32, 16, requires_grad=True)
    cos, sin, _ = tables(torch.arange(32)[None], 8, torch.float32)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        rotate_pairs(x, cos, sin).sum()
    assert saved == [(1, 1, 32, 8), (1, 1, 32, 8)]


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_in_place_rotation_of_a_projection_slice_has_the_same_gradients(layout):
    """A model rotates the q/k slices of its own qkv projection in place; gradients reach the
    projection's weight exactly as through the out-of-place rotation."""
    from posenc.kernels import rotate_pairs_

    weight = torch.randn(16, 3 * 8, dtype=torch.float64, requires_grad=True)
    hidden = torch.randn(2, 5, 16, dtype=torch.float64)
    cos, sin, _ = tables(torch.arange(5)[None], 3)

    def loss(rotate):
        qkv = (hidden @ weight).view(2, 5, 3, 1, 8).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q, k = rotate(q, cos, sin, layout), rotate(k, cos, sin, layout)
        return (q * k * v).sum() + (q**2).sum()

    (in_place,) = torch.autograd.grad(loss(rotate_pairs_), weight)
    (fresh,) = torch.autograd.grad(loss(rotate_pairs), weight)
    torch.testing.assert_close(in_place, fresh, rtol=1e-12, atol=1e-12)
