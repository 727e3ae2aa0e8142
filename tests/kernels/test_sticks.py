"""Stick-breaking's kernel (``kernels.sticks``) equals stick-breaking on the eager backend.

The reference is autograd through ``attention(backend="eager")`` in float64 (log-sigmoids, a reverse cumulative
sum, exp): output and the gradients of q, k and v.

``kernels.sticks`` at its edges: the dtypes it computes and returns in, a head width that is not the fastest
axis in memory, which heads it refuses, and where it serves.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.attention import choose_backend
from posenc.kernels import sticks
from tests.helpers import kernel_calls, saved_step_bytes
from tests.kernels.test_channels import CASES, assert_all_close, outputs_and_grads, tensors
from tests.helpers import seeded_randn as randn


pytestmark = pytest.mark.skipif(sticks.extension() is None, reason="no C++ toolchain to build the kernel")


def output_and_grads(function, upstream, *inputs):
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = function(*inputs)
    return [out, *torch.autograd.grad(out, inputs, upstream.to(out.dtype))]


@st.composite
def problems(draw):
    q_len = draw(st.integers(1, 90))
    k_len = draw(st.integers(q_len, 120)) if draw(st.booleans()) else q_len  # queries are the last Tq keys
    return dict(batch=draw(st.integers(1, 2)), heads=draw(st.integers(1, 3)), q_len=q_len, k_len=k_len,
                width=draw(st.sampled_from([4, 8, 16])), value_width=draw(st.sampled_from([4, 6, 16])),
                sharp=draw(st.sampled_from([0.3, 1.0, 12.0])), attend_current=draw(st.booleans()),
                strided=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=50, deadline=None)
@given(problems())
def test_equals_eager_stick_breaking_in_float64(p):
    """Across query tiles (32 rows), KV-cache steps (Tq < Tk), a first query with no key to attend to (without
    ``attend_current``), token-major layouts and logits large enough to saturate the sigmoids."""
    generator = torch.Generator().manual_seed(p["seed"])

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    def laid_out(length, width):  # token-major (B, T, H, D) viewed as (B, H, T, D), as models pass
        if p["strided"]:
            return randn(p["batch"], length, p["heads"], width).transpose(1, 2)
        return randn(p["batch"], p["heads"], length, width)

    q, k = laid_out(p["q_len"], p["width"]) * p["sharp"], laid_out(p["k_len"], p["width"])
    v = laid_out(p["k_len"], p["value_width"])
    upstream = randn(p["batch"], p["heads"], p["q_len"], p["value_width"])
    enc = posenc.build("stick-breaking", attend_current=p["attend_current"])
    scale = p["width"] ** -0.5
    got = output_and_grads(lambda *t: sticks.stick_breaking_attention(
        *t, scale=scale, attend_current=p["attend_current"]), upstream, q, k, v)
    expected = output_and_grads(lambda *t: posenc.attention(*t, enc, backend="eager"), upstream, q, k, v)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * max(1.0, float(b.detach().abs().max())))


def test_float32_errs_no_more_than_eager_float32():
    """The float path's own log and exp (vectorizable polynomials) against float64, as eager's float32 errs."""
    generator = torch.Generator().manual_seed(0)
    q, k, v, upstream = (torch.randn(2, 3, 150, 16, generator=generator, dtype=torch.float64) for _ in range(4))
    q = q * 3
    run = lambda *t: sticks.stick_breaking_attention(*t, scale=0.25, attend_current=False)  # noqa: E731
    exact = [t.detach() for t in output_and_grads(run, upstream, q, k, v)]
    got = output_and_grads(run, upstream, *(t.float() for t in (q, k, v)))
    enc = posenc.build("stick-breaking")
    eager = output_and_grads(lambda *t: posenc.attention(*t, enc, backend="eager", scale=0.25), upstream,
                             *(t.float() for t in (q, k, v)))
    for ours, theirs, truth in zip(got, eager, exact, strict=True):
        error, eager_error = (float((x.detach().double() - truth).abs().max()) for x in (ours, theirs))
        assert error <= 2 * eager_error + 1e-6 * float(truth.abs().max()), (error, eager_error)


def test_bad_shapes_are_refused():
    q, k, v = tensors(q_len=5, k_len=9)
    with pytest.raises(ValueError, match=r"Tq ≤ Tk"):
        sticks.stick_breaking_attention(k, q, q, scale=1.0, attend_current=False)


@pytest.fixture
def spy(monkeypatch):
    """The calls that reach this kernel from attention()."""
    return kernel_calls(monkeypatch, sticks, "stick_breaking_attention", "mask")


@pytest.mark.parametrize("case", ["causal", "kv-cache step"])
@pytest.mark.parametrize("kv_heads", [None, 2])
@pytest.mark.parametrize("attend_current", [False, True])
def test_attention_serves_stick_breaking_exactly(case, kv_heads, attend_current, spy):
    """sdpa (this kernel; what ``auto`` picks on CPU) equals eager in float64: output, q, k and v's gradients."""
    q_len, k_len, kwargs = CASES[case]
    enc = posenc.build("stick-breaking", attend_current=attend_current)
    q, k, v = tensors(q_len=q_len, k_len=k_len, kv_heads=kv_heads)
    assert choose_backend("auto", enc, q, k, v) == "sdpa"
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    got = outputs_and_grads(enc, q, k, v, "sdpa", **kwargs)
    assert len(spy) == 1 and spy[0]["attend_current"] is attend_current, "the kernel did not serve"
    assert_all_close(got, expected, atol=1e-10)


@pytest.mark.parametrize("case", ["per-row positions", "packed documents"])
def test_other_calls_compute_as_eager_does(case, spy):
    q_len, k_len, kwargs = CASES[case]
    enc = posenc.build("stick-breaking")
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    assert_all_close(outputs_and_grads(enc, q, k, v, "sdpa", **kwargs),
                     outputs_and_grads(enc, q, k, v, "eager", **kwargs), atol=1e-12)
    assert not spy


def test_a_training_step_keeps_what_nope_keeps():
    """Bytes autograd keeps for the backward, 2 sequences of 512 tokens: within 5% of NoPE's (eager kept several
    (B, H, T, T) tensors: 6.6× NoPE's)."""
    sizes = saved_step_bytes(("none", "stick-breaking"))
    assert sizes["stick-breaking"] <= 1.05 * sizes["none"], sizes


def kernel_output_and_grads(q, k, v, upstream, attend_current=False):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = sticks.stick_breaking_attention(q, k, v, scale=0.5, attend_current=attend_current)
    return [out, *torch.autograd.grad(out, (q, k, v), upstream.to(out.dtype))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_in_and_out_computed_in_float32(dtype):
    """bf16/fp16 inputs come back in their dtype, output and gradients, and equal the float32 computation
    rounded: the kernel ran in float32 (it takes no half types)."""
    half = [randn(1, 2, 9, 8, seed=s).to(dtype) for s in range(3)]
    upstream = randn(1, 2, 9, 8, seed=3).to(dtype).double()  # the same upstream gradient for both
    got = kernel_output_and_grads(*half, upstream)
    single = kernel_output_and_grads(*(t.float() for t in half), upstream)
    for ours, reference in zip(got, single, strict=True):
        assert ours.dtype == dtype
        torch.testing.assert_close(ours, reference.to(dtype), rtol=0, atol=0)


def test_mixed_input_dtypes_give_each_gradient_its_own_dtype():
    q, k, v, upstream = (randn(1, 2, 6, 4, seed=s) for s in range(4))
    out, grad_q, grad_k, grad_v = kernel_output_and_grads(q.float(), k.to(torch.bfloat16), v.float(), upstream)
    assert (out.dtype, grad_q.dtype, grad_k.dtype, grad_v.dtype) == (torch.float32, torch.float32, torch.bfloat16,
                                                                     torch.float32)


def test_a_head_width_that_is_not_contiguous_is_read_right():
    """q, k, v and the upstream gradient as (B, H, Dh, T) transposed, so that the head width strides by T."""
    q, k, v, upstream = (randn(1, 2, 8, 11, seed=s).transpose(-1, -2) for s in range(4))
    assert q.stride(-1) != 1
    got = kernel_output_and_grads(q, k, v, upstream, attend_current=True)
    expected = kernel_output_and_grads(*(t.contiguous() for t in (q, k, v)), upstream.contiguous(), attend_current=True)
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
