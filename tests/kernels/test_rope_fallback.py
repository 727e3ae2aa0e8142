"""The PyTorch forms of the RoPE rotation, where the C++ kernel does not serve (a GPU, a layout it refuses) and
inside ``torch.compile``: out of place, in place, and their gradients, against the textbook formula in float64.
On CPU the C++ kernel otherwise serves every test, so these forms would go unchecked here."""

import pytest
import torch

from posenc.kernels import rope_cpu, rotate_pairs, rotate_pairs_
from tests.kernels.test_rope_kernel import CASES, reference, tables


@pytest.fixture
def no_kernel(monkeypatch):
    monkeypatch.setattr(rope_cpu, "serves", lambda *args: False)


@pytest.fixture
def compiling(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)


def inputs(head_dim, pairs, seed=0):
    positions = torch.tensor([[2, 5, 9, 1 << 20], [0, 1, 40, 7]])  # per-batch positions, one far away
    cos, sin, _ = tables(positions, pairs, factor=1.3)  # attention factor: cos/sin not unit
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 4, head_dim, dtype=torch.float64, generator=generator)
    upstream = torch.randn(2, 3, 4, head_dim, dtype=torch.float64, generator=generator)
    return x, cos, sin, upstream


def rotated_and_grad(rotate, x, cos, sin, layout, upstream):
    leaf = x.clone().requires_grad_()
    source = leaf * 1.0  # in-place rotation needs a tensor it may overwrite, not a leaf
    out = rotate(source, cos, sin, layout)
    (grad,) = torch.autograd.grad(out, leaf, upstream)
    return out, source, grad


@pytest.mark.parametrize("layout, head_dim, pairs", CASES)
@pytest.mark.parametrize("path", ["no_kernel", "compiling"])
@pytest.mark.parametrize("rotate", [rotate_pairs, rotate_pairs_], ids=["out of place", "in place"])
def test_the_pytorch_forms_equal_the_formula(request, path, rotate, layout, head_dim, pairs):
    request.getfixturevalue(path)
    x, cos, sin, upstream = inputs(head_dim, pairs)
    out, source, grad = rotated_and_grad(rotate, x, cos, sin, layout, upstream)
    _, _, formula_grad = rotated_and_grad(reference, x, cos, sin, layout, upstream)
    torch.testing.assert_close(out, reference(x, cos, sin, layout), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, formula_grad, rtol=1e-12, atol=1e-12)
    in_place = rotate is rotate_pairs_ and path == "no_kernel"  # under compile the in-place call returns a new tensor
    assert (out is source) == in_place
    if not in_place:
        torch.testing.assert_close(source, x, rtol=0, atol=0)  # the input is left as it was


@pytest.mark.parametrize("rotate", [rotate_pairs, rotate_pairs_], ids=["out of place", "in place"])
def test_bf16_activations_rotate_in_float32_without_the_kernel(no_kernel, rotate):
    """bf16 x, float32 tables: the products in float32, rounded once into bf16."""
    x, cos, sin, _ = inputs(8, 4)
    cos, sin = cos.float(), sin.float()
    x = x.to(torch.bfloat16)
    out = rotate(x.clone(), cos, sin, "half")
    assert out.dtype == torch.bfloat16
    exact = reference(x.float(), cos, sin, "half").to(torch.bfloat16)
    torch.testing.assert_close(out, exact, rtol=0, atol=0)
