"""RoPE's C++ CPU kernel equals the PyTorch form it replaces, and the PyTorch form serves without it."""

from pathlib import Path

import pytest
import torch

from posenc.kernels import rope_cos_sin, rope_cpu, rotate_pairs, rotate_pairs_
from posenc.kernels.rope import rope_angles

pytestmark = pytest.mark.skipif(rope_cpu.extension() is None, reason="no C++ toolchain to build the kernel")


@pytest.fixture
def pytorch_form(monkeypatch):
    """Run ``fn`` with the kernel switched off: the PyTorch form, the reference."""
    def run(fn, *args, **kwargs):
        with monkeypatch.context() as patch:
            patch.setattr(rope_cpu, "serves", lambda *a: False)
            return fn(*args, **kwargs)
    return run


def tables(batch, length, pairs, start=0, dtype=torch.float32):
    positions = torch.arange(start, start + length).expand(batch, -1) + torch.arange(batch)[:, None] * 7
    inv_freq = 10000.0 ** -(torch.arange(pairs, dtype=torch.float64) / pairs)
    return rope_cos_sin(positions, inv_freq, dtype=dtype)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype, math", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                         (torch.bfloat16, torch.float32), (torch.float16, torch.float32)])
@pytest.mark.parametrize("pairs, table_batch", [(8, 1), (5, 3)])  # full rotary; partial, one table per row
def test_kernel_equals_the_pytorch_form(layout, dtype, math, pairs, table_batch, pytorch_form):
    torch.manual_seed(0)
    x = torch.randn(3, 2, 11, 16, dtype=torch.float64).to(dtype)
    cos, sin = tables(table_batch, 11, pairs, start=2**20, dtype=math)
    assert rope_cpu.serves(x, cos, sin)
    expected = pytorch_form(rotate_pairs, x, cos, sin, layout)
    # One rounding to the activation dtype in both; float32 math may contract to FMA in either.
    tolerance = {torch.float64: 1e-15, torch.float32: 1e-6}[math]
    torch.testing.assert_close(rotate_pairs(x, cos, sin, layout).double(), expected.double(), rtol=0,
                               atol=tolerance if dtype in (torch.float64, torch.float32) else 1e-2)
    in_place = x.clone()
    assert rotate_pairs_(in_place, cos, sin, layout).data_ptr() == in_place.data_ptr()
    torch.testing.assert_close(in_place.double(), expected.double(), rtol=0,
                               atol=tolerance if dtype in (torch.float64, torch.float32) else 1e-2)


def test_kernel_reads_strided_views_and_leaves_the_rest_of_the_storage_alone():
    """The model rotates the q and k slices of its qkv projection: (B, T, 3, H, Dh) permuted."""
    torch.manual_seed(1)
    qkv = torch.randn(2, 9, 3, 4, 8, dtype=torch.float64)
    before = qkv.clone()
    q = qkv[:, :, 0].transpose(1, 2)  # (B, H, T, Dh), not contiguous
    cos, sin = tables(1, 9, 4, dtype=torch.float64)
    expected = rotate_pairs(q.contiguous(), cos, sin)
    rotate_pairs_(q, cos, sin)
    torch.testing.assert_close(q, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(qkv[:, :, 1:], before[:, :, 1:], rtol=0, atol=0)


def test_kernel_against_angles_by_hand():
    """Independent of rope.py: rotate pair (c, c + F) of a one-hot row by position × inv_freq."""
    x = torch.zeros(1, 1, 1, 4, dtype=torch.float64)
    x[..., 0] = 1.0  # the first member of pair 0
    inv_freq = torch.tensor([0.5, 0.25], dtype=torch.float64)
    positions = torch.tensor([[3]])
    cos, sin = rope_cos_sin(positions, inv_freq, dtype=torch.float64)
    angle = float(rope_angles(positions, inv_freq)[0, 0, 0])
    out = rotate_pairs(x, cos, sin)
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([torch.cos(torch.tensor(angle)), 0.0,
                                                           torch.sin(torch.tensor(angle)), 0.0], dtype=torch.float64))


def test_backward_is_the_inverse_rotation_and_passes_gradcheck():
    torch.manual_seed(2)
    cos, sin = tables(2, 6, 3, dtype=torch.float64)
    x = torch.randn(2, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rotate_pairs(t, cos, sin, "interleaved"), (x,))
    y = x.detach().clone().requires_grad_()
    rotate_pairs_(y * 1.0, cos, sin).sum().backward()  # in place on a non-leaf
    (grad,) = torch.autograd.grad(rotate_pairs(x, cos, sin).sum(), x)
    torch.testing.assert_close(y.grad, grad, rtol=0, atol=1e-15)


def test_not_served_where_it_cannot_read_the_tensors():
    cos, sin = tables(1, 5, 4)
    x = torch.randn(2, 2, 5, 8)
    assert rope_cpu.serves(x, cos, sin)
    assert not rope_cpu.serves(x.transpose(-1, -2).contiguous().transpose(-1, -2), cos, sin)  # Dh not unit stride
    assert not rope_cpu.serves(x, cos[..., :3], sin[..., :3].double())  # mixed table dtypes
    assert not rope_cpu.serves(x.int(), cos, sin)
    assert not rope_cpu.serves(x[:, :, :4], cos, sin)  # table for another length


@pytest.mark.parametrize(("case", "arguments"), [
    ("x of 3 dimensions", lambda x, cos, sin: (x[0], cos, sin)),
    ("tables for 3 rows of a batch of 2", lambda x, cos, sin: (x, cos.expand(3, -1, -1, -1), sin.expand(3, -1, -1, -1))),
    ("cos of 3 dimensions", lambda x, cos, sin: (x, cos[0], sin)),
    ("cos for another length, sin right", lambda x, cos, sin: (x, cos[:, :, :4], sin)),
    ("sin for another length, cos right", lambda x, cos, sin: (x, cos, sin[:, :, :4])),
    ("more pairs than half the head width", lambda x, cos, sin: (x[..., :6], cos, sin)),
])
def test_each_shape_it_cannot_read_is_refused_alone(case, arguments):
    """Every other argument right, so that each refusal is its own condition."""
    cos, sin = tables(1, 5, 4)
    x = torch.randn(2, 2, 5, 8)
    assert not rope_cpu.serves(*arguments(x, cos, sin)), case


def test_not_served_inside_a_compiled_graph(monkeypatch):
    cos, sin = tables(1, 5, 4)
    x = torch.randn(2, 2, 5, 8)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not rope_cpu.serves(x, cos, sin)


def test_switched_off_or_unbuildable_means_the_pytorch_form(monkeypatch):
    cos, sin = tables(1, 5, 4)
    x = torch.randn(2, 2, 5, 8)
    expected = rotate_pairs(x, cos, sin)
    try:
        monkeypatch.setenv("POSENC_CPU_KERNELS", "0")
        rope_cpu.extension.cache_clear()
        assert not rope_cpu.serves(x, cos, sin)
        torch.testing.assert_close(rotate_pairs(x, cos, sin), expected, rtol=0, atol=1e-6)
        monkeypatch.setenv("POSENC_CPU_KERNELS", "1")
        monkeypatch.setattr(rope_cpu, "SOURCE", rope_cpu.SOURCE.with_name("missing.cpp"))
        monkeypatch.setattr("torch.utils.cpp_extension.load", lambda **kwargs: (_ for _ in ()).throw(OSError("no g++")))
        rope_cpu.extension.cache_clear()
        with pytest.warns(UserWarning, match="could not be built, using the PyTorch form"):
            assert not rope_cpu.serves(x, cos, sin)
    finally:
        monkeypatch.undo()
        rope_cpu.extension.cache_clear()
    assert rope_cpu.serves(x, cos, sin)


def test_the_build_is_cached_under_a_name_that_carries_what_was_built():
    """Two checkouts or versions of posenc (another source, another torch) never share a build."""
    source = rope_cpu.SOURCE.read_bytes()
    other_source = source.replace(b"PYBIND11_MODULE", b"// another version\nPYBIND11_MODULE")
    names = {rope_cpu.build_name(source), rope_cpu.build_name(other_source),
             rope_cpu.build_name(source, torch_version="2.12.0")}
    assert len(names) == 3 and rope_cpu.build_name(source) == rope_cpu.build_name(bytes(source))
    assert all(name.startswith("posenc_rope_cpu_") and name.isidentifier() for name in names)
    built = Path(rope_cpu.extension().__file__)
    assert built.parent.name == rope_cpu.build_name(source) and built.stem.startswith(rope_cpu.build_name(source))
