"""``kernels.sticks`` at its edges: the dtypes it computes and returns in, a head width that is not the fastest
axis in memory, which heads it refuses, and where it serves."""

import pytest
import torch

import posenc
from posenc.attention import choose_backend
from posenc.kernels import sticks
from tests.helpers import seeded_randn as randn

pytestmark = pytest.mark.skipif(sticks.extension() is None, reason="no C++ toolchain to build the kernel")


def output_and_grads(q, k, v, upstream, attend_current=False):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = sticks.stick_breaking_attention(q, k, v, scale=0.5, attend_current=attend_current)
    return [out, *torch.autograd.grad(out, (q, k, v), upstream.to(out.dtype))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_in_and_out_computed_in_float32(dtype):
    """bf16/fp16 inputs come back in their dtype, output and gradients, and equal the float32 computation
    rounded: the kernel ran in float32 (it takes no half types)."""
    half = [randn(1, 2, 9, 8, seed=s).to(dtype) for s in range(3)]
    upstream = randn(1, 2, 9, 8, seed=3).to(dtype).double()  # the same upstream gradient for both
    got = output_and_grads(*half, upstream)
    single = output_and_grads(*(t.float() for t in half), upstream)
    for ours, reference in zip(got, single, strict=True):
        assert ours.dtype == dtype
        torch.testing.assert_close(ours, reference.to(dtype), rtol=0, atol=0)


def test_mixed_input_dtypes_give_each_gradient_its_own_dtype():
    q, k, v, upstream = (randn(1, 2, 6, 4, seed=s) for s in range(4))
    out, grad_q, grad_k, grad_v = output_and_grads(q.float(), k.to(torch.bfloat16), v.float(), upstream)
    assert (out.dtype, grad_q.dtype, grad_k.dtype, grad_v.dtype) == (torch.float32, torch.float32, torch.bfloat16,
                                                                     torch.float32)


def test_a_head_width_that_is_not_contiguous_is_read_right():
    """q, k, v and the upstream gradient as (B, H, Dh, T) transposed, so that the head width strides by T."""
    q, k, v, upstream = (randn(1, 2, 8, 11, seed=s).transpose(-1, -2) for s in range(4))
    assert q.stride(-1) != 1
    got = output_and_grads(q, k, v, upstream, attend_current=True)
    expected = output_and_grads(*(t.contiguous() for t in (q, k, v)), upstream.contiguous(), attend_current=True)
    for ours, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-14)


@pytest.mark.parametrize("wrong", ["k", "v"])
def test_k_or_v_with_other_heads_is_refused(wrong):
    q = randn(1, 4, 5, 8, seed=0)
    k = randn(1, 2 if wrong == "k" else 4, 5, 8, seed=1)
    v = randn(1, 2 if wrong == "v" else 4, 5, 8, seed=2)
    with pytest.raises(ValueError, match="q, k and v need equal heads"):
        sticks.stick_breaking_attention(q, k, v, scale=1.0, attend_current=False)


def test_serves_on_cpu_only_eager_and_built(monkeypatch):
    q = torch.zeros(1, 1, 2, 4)
    assert sticks.serves(q)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not sticks.serves(q)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    monkeypatch.setattr(sticks, "extension", lambda: None)
    assert not sticks.serves(q)
    assert not sticks.serves(torch.zeros(1, 1, 2, 4, device="meta"))


def test_without_the_kernel_auto_runs_eager_and_sdpa_is_refused(monkeypatch):
    monkeypatch.setattr(sticks, "extension", lambda: None)
    encoding = posenc.build("stick-breaking")
    q, k, v = (randn(1, 2, 6, 4, seed=s) for s in range(3))
    assert choose_backend("auto", encoding, q, k, v) == "eager"
    with pytest.raises(ValueError, match="backend='sdpa' cannot serve StickBreaking: .* use backend='eager'"):
        posenc.attention(q, k, v, encoding, backend="sdpa")
