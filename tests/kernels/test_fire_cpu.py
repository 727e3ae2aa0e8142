"""FIRE's bias per pair inside the C++ tiles (``kernels.offset_bias`` with ``segments``, ``fire_cpu.h``) equals
softmax attention with FIRE's eager bias, at any query position: below its threshold L, past it, at a query exactly
at L (where torch splits max's gradient), bidirectionally and at KV-cache steps.

The reference is autograd through ``softmax(scale·q·kᵀ + FIRE.score_bias(q_pos, k_pos))·v`` in float64: output and
the gradients of q, k, v, the MLP's weights, c and L.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.kernels import dispatch, offset_bias
from posenc.verify import tolerance
from tests.helpers import kernel_calls, make_encoding, saved_step_bytes
from tests.kernels.test_channels import (CASES, assert_all_close, at_dtype, outputs_and_grads, tensors,
                                         with_rounded_weights)

pytestmark = pytest.mark.skipif(offset_bias.extension() is None, reason="no C++ toolchain to build the kernel")


def fire(heads: int, threshold: float, seed: int, dtype=torch.float64):
    """FIRE with weights of both signs, kinks inside [0, 1] (where x lies) and one at x = 0, where every diagonal
    pair sits (torch's relu'(0) = 0: that unit is inactive there), c near 1 and L = ``threshold``."""
    torch.manual_seed(seed)
    enc = posenc.build("fire", num_heads=heads, width=12).to(dtype)
    with torch.no_grad():
        for parameter in enc.parameters():
            parameter.normal_(0, 1.0)
        enc.mlp[0].bias.copy_(-enc.mlp[0].weight[:, 0] * torch.rand(12, dtype=dtype))
        enc.mlp[0].weight[0].abs_()
        enc.mlp[0].bias[0] = 0.0
        enc.log_scale.fill_(0.8)
        enc.threshold.fill_(threshold / 512)
    return enc


def by_kernel(enc, q, k, v, *, first_position, causal, scale):
    low, high = offset_bias.offsets(q.shape[2], k.shape[2], causal)
    zeros = torch.zeros(q.shape[1], high - low + 1, dtype=q.dtype)
    return offset_bias.offset_bias_attention(q, k, v, zeros, low, scale=scale, causal=causal,
                                             segments=enc.distance_segments(q.dtype), first_position=first_position)


def by_reference(enc, q, k, v, *, first_position, causal, scale):
    k_pos = torch.arange(first_position, first_position + k.shape[2])
    q_pos = k_pos[k.shape[2] - q.shape[2]:]
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    logits = scale * q @ k.transpose(-1, -2) + enc.score_bias(q_pos, k_pos, q.dtype)
    if causal:
        logits = logits.masked_fill(q_pos[:, None] < k_pos[None, :], float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


def outputs_and_all_grads(function, enc, upstream, q, k, v, **call):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = function(enc, q, k, v, **call)
    return [out, *torch.autograd.grad(out, [q, k, v, *enc.parameters()], upstream.to(out.dtype))]


@st.composite
def problems(draw):
    kv_heads = draw(st.sampled_from([1, 2]))
    q_len = draw(st.integers(1, 150))
    k_len = draw(st.integers(q_len, 200)) if draw(st.booleans()) else q_len  # queries are the last Tq keys
    first_position = draw(st.integers(0, 60))
    last_query = first_position + k_len - 1
    # L anywhere from below the first query to past the last, often exactly on a query's position
    threshold = draw(st.integers(1, last_query + 3) | st.floats(0.5, last_query + 3.0))
    return dict(batch=draw(st.integers(1, 2)), heads=kv_heads * draw(st.sampled_from([1, 2])), kv_heads=kv_heads,
                causal=draw(st.booleans()), q_len=q_len, k_len=k_len, first_position=first_position,
                threshold=float(threshold), width=draw(st.sampled_from([4, 8])),
                scale=draw(st.sampled_from([0.25, 1.0])), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=60, deadline=None)
@given(problems())
def test_equals_attention_with_fires_bias_in_float64(p):
    """Query tiles of 64 and key tiles of 128, grouped heads, any first position and threshold: output and the
    gradients of q, k, v and every parameter."""
    generator = torch.Generator().manual_seed(p["seed"])
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    enc = fire(p["heads"], p["threshold"], p["seed"])
    q = randn(p["batch"], p["heads"], p["q_len"], p["width"])
    k, v = (randn(p["batch"], p["kv_heads"], p["k_len"], p["width"]) for _ in range(2))
    upstream = randn(p["batch"], p["heads"], p["q_len"], p["width"])
    call = dict(first_position=p["first_position"], causal=p["causal"], scale=p["scale"])
    got = outputs_and_all_grads(by_kernel, enc, upstream, q, k, v, **call)
    expected = outputs_and_all_grads(by_reference, enc, upstream, q, k, v, **call)
    names = ["out", "dq", "dk", "dv", *(name for name, _ in enc.named_parameters())]
    for name, a, b in zip(names, got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10 * max(1.0, float(b.detach().abs().max())), msg=name)


@pytest.mark.parametrize("threshold", [40.0, 150.0])
def test_the_threshold_and_the_scale_get_their_gradient(threshold):
    """L = 40: queries 0..39 divide by ψ(L), the rest by their own ψ(i), query 40 on the tie; L = 150: every
    query divides by ψ(L). Both gradients are non-zero and equal the reference's."""
    enc = fire(2, threshold, seed=1)
    generator = torch.Generator().manual_seed(0)
    q, k, v, upstream = (torch.randn(1, 2, 100, 8, generator=generator, dtype=torch.float64) for _ in range(4))
    call = dict(first_position=0, causal=True, scale=0.5)
    got = outputs_and_all_grads(by_kernel, enc, upstream, q, k, v, **call)
    expected = outputs_and_all_grads(by_reference, enc, upstream, q, k, v, **call)
    names = [name for name, _ in enc.named_parameters()]
    for name in ("log_scale", "threshold"):  # c, L
        a, b = got[4 + names.index(name)], expected[4 + names.index(name)]
        assert float(b.abs()) > 1e-6, name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=0, msg=name)


@pytest.mark.parametrize("first_position", [5, 2**20])
def test_float32_is_within_verify_tolerance_of_float64(first_position):
    """Against float64 from the same (float32) weights, keys 5.. or 2^20.. (L = 30: every query past it)."""
    low = fire(3, 30.0, seed=2, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    q, k, v, upstream = (torch.randn(2, 3, 300, 16, generator=generator, dtype=torch.float64) for _ in range(4))
    call = dict(first_position=first_position, causal=True, scale=0.25)
    expected = outputs_and_all_grads(by_reference, with_rounded_weights(low, torch.float32), upstream, q, k, v, **call)
    got = outputs_and_all_grads(by_kernel, low, upstream, q.float(), k.float(), v.float(), **call)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=0, atol=5e-5 * max(1.0, float(b.detach().abs().max())))


def test_bad_segments_and_positions_are_refused():
    q = torch.randn(1, 2, 5, 4)
    zeros = torch.zeros(2, 5)
    for shape, message in [((2, 7), r"got \(2, 7\)"), ((3, 14), r"\(2, 3P \+ 2\).*got \(3, 14\)"),
                           ((2, 20), r"a power of two >= 2, got \(2, 20\)"), ((2, 5), r"got \(2, 5\)")]:
        with pytest.raises(ValueError, match=message):
            offset_bias.offset_bias_attention(q, q, q, zeros, 0, scale=1.0, causal=True,
                                              segments=torch.zeros(shape))
    with pytest.raises(ValueError, match=r"first_position must be an integer, got 2.5"):
        offset_bias.offset_bias_attention(q, q, q, zeros, 0, scale=1.0, causal=True, segments=torch.zeros(2, 14),
                                          first_position=2.5)


@pytest.fixture
def spy(monkeypatch):
    """The calls that reach the kernel from attention(), with the segments form forced (it would be timed against
    the table form below the threshold)."""
    return kernel_calls(monkeypatch, offset_bias, "offset_bias_attention", "segments")


@pytest.mark.parametrize("case", ["causal", "bidirectional", "kv-cache step"])
def test_attention_serves_fire_past_its_threshold_exactly(case, spy):
    """L = 10 below the last query's position, 11: sdpa (the segments inside this kernel) equals eager in float64,
    output, q, k, v and every parameter's gradient."""
    q_len, k_len, kwargs = CASES[case]
    enc = make_encoding("fire", heads=4)
    with torch.no_grad():
        enc.threshold.fill_(10 / 512)
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    got = outputs_and_grads(enc, q, k, v, "sdpa", **kwargs)
    assert len(spy) == 1 and spy[0]["segments"] is not None, "the kernel did not serve"
    assert_all_close(got, expected, atol=1e-10)
    assert all(g.abs().sum() > 0 for g in got[4:]), "every parameter receives a gradient"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_within_verify_tolerance(dtype, spy):
    enc = make_encoding("fire", heads=4)
    with torch.no_grad():
        enc.threshold.fill_(20 / 512)
    q, k, v = tensors(q_len=70, k_len=70)
    expected = outputs_and_grads(with_rounded_weights(enc, dtype), q, k, v, "eager")
    got = outputs_and_grads(*at_dtype(enc, q, k, v, dtype), "sdpa")
    assert spy and got[0].dtype == dtype
    assert_all_close(got, expected, atol=tolerance(dtype, 4))


def test_a_training_step_past_the_threshold_keeps_what_nope_keeps(monkeypatch):
    """2 sequences of 600 tokens, past FIRE's initial L = 512: bytes autograd keeps within 2% of NoPE's, where a
    mask would keep a (B, H, T, T) bias."""
    monkeypatch.setenv(dispatch.FORCE_VARIABLE, "segments")
    sizes = saved_step_bytes(("none", "fire"), length=600)
    assert sizes["fire"] <= 1.02 * sizes["none"], sizes
