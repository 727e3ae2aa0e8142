"""CoPE's kernel (``kernels.gated_counts``) equals CoPE on the eager backend.

The reference is autograd through ``attention(backend="eager")`` in float64 (gates, reverse cumsum, clamp,
floor/ceil lookups, lerp, softmax): output and the gradients of q, k, v and the table.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.kernels import gated_counts
from posenc.verify import tolerance
from tests.helpers import kernel_calls, make_encoding, saved_step_bytes
from tests.kernels.test_channels import CASES, assert_all_close, outputs_and_grads, tensors

pytestmark = pytest.mark.skipif(gated_counts.extension() is None, reason="no C++ toolchain to build the kernel")


def eager(q, k, v, table, scale):
    """CoPE through the eager backend, with ``table`` as its embeddings (gates at 1/√Dh)."""
    enc = posenc.build("cope", head_dim=q.shape[-1], max_positions=table.shape[0]).to(table.dtype)
    del enc.embeddings  # the table itself, so that its gradient is the one asked for
    enc.embeddings = table
    return posenc.attention(q, k, v, enc, backend="eager", scale=scale)


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
                positions=draw(st.sampled_from([2, 5, 17, 200])), sharp=draw(st.sampled_from([0.3, 1.0, 12.0])),
                scale=draw(st.sampled_from([0.25, 1.0])), strided=draw(st.booleans()),
                zeroed=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=50, deadline=None)
@given(problems())
def test_equals_eager_cope_in_float64(p):
    """Across query tiles (32 rows), KV-cache steps (Tq < Tk), tables shorter than the counts (clamped: P = 2, 5)
    and longer, token-major layouts, gates saturated to exactly 1 (``sharp``: counts land on integers, where
    the lookup's gradient is one-sided), and keys of zeros from halfway (``zeroed``: gates of exactly ½ there,
    whose gradient is not 0, so every other count is an integer, where the lookup passes the gates nothing)."""
    generator = torch.Generator().manual_seed(p["seed"])

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    def laid_out(length, width):  # token-major (B, T, H, D) viewed as (B, H, T, D), as models pass
        if p["strided"]:
            return randn(p["batch"], length, p["heads"], width).transpose(1, 2)
        return randn(p["batch"], p["heads"], length, width)

    q, k = laid_out(p["q_len"], p["width"]) * p["sharp"], laid_out(p["k_len"], p["width"]) * p["sharp"]
    if p["zeroed"]:
        k[:, :, p["k_len"] // 2:] = 0.0
    v = laid_out(p["k_len"], p["value_width"])
    table = randn(p["positions"], p["width"])
    upstream = randn(p["batch"], p["heads"], p["q_len"], p["value_width"])
    gate_scale = p["width"] ** -0.5
    got = output_and_grads(lambda *t: gated_counts.gated_counts_attention(
        *t, scale=p["scale"], gate_scale=gate_scale), upstream, q, k, v, table)
    expected = output_and_grads(lambda *t: eager(*t, p["scale"]), upstream, q, k, v, table)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11 * max(1.0, float(b.detach().abs().max())))
    assert got[0].dtype == torch.float64 and got[0].shape == expected[0].shape


def test_float32_errs_no_more_than_eager_float32():
    """Against float64, the float path (its own exp, counts accumulated in double as torch's cumsum does) errs as
    eager's float32 does: a count off by float rounding moves its lookup by (e[⌈p⌉] − e[⌊p⌋])·δ, so large tables
    amplify it alike in both."""
    generator = torch.Generator().manual_seed(0)
    q, k, v, upstream = (torch.randn(2, 3, 150, 16, generator=generator, dtype=torch.float64) for _ in range(4))
    q = q * 4
    table = torch.randn(40, 16, generator=generator, dtype=torch.float64) * 3
    run = lambda *t: gated_counts.gated_counts_attention(*t, scale=0.25, gate_scale=0.25)  # noqa: E731
    exact = output_and_grads(run, upstream, q, k, v, table)
    got = output_and_grads(run, upstream, *(t.float() for t in (q, k, v, table)))
    eager_float32 = output_and_grads(lambda *t: eager(*t, 0.25), upstream, *(t.float() for t in (q, k, v, table)))
    for ours, theirs, truth in zip(got, eager_float32, (t.detach() for t in exact), strict=True):
        error, eager_error = (float((x.double() - truth).abs().max()) for x in (ours.detach(), theirs.detach()))
        assert error <= 1.5 * eager_error + 1e-6 * float(truth.detach().abs().max()), (error, eager_error)


def test_bad_shapes_are_refused():
    q, k, v = tensors(q_len=5, k_len=9)
    with pytest.raises(ValueError, match=r"table must be \(P ≥ 2, Dh = 8\), got \(1, 8\)"):
        gated_counts.gated_counts_attention(q, k, v, torch.zeros(1, 8, dtype=torch.float64), scale=1.0,
                                            gate_scale=1.0)
    with pytest.raises(ValueError, match=r"Tq ≤ Tk"):
        gated_counts.gated_counts_attention(k, q, q, torch.zeros(4, 8, dtype=torch.float64), scale=1.0,
                                            gate_scale=1.0)


@pytest.fixture
def spy(monkeypatch):
    """The calls that reach this kernel from attention()."""
    return kernel_calls(monkeypatch, gated_counts, "gated_counts_attention", "counts")


@pytest.mark.parametrize("case", ["causal", "kv-cache step"])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_attention_serves_cope_exactly(case, kv_heads, spy):
    """sdpa (this kernel) equals eager in float64: output, q, k, v and the table's gradient, with grouped heads."""
    q_len, k_len, kwargs = CASES[case]
    enc = make_encoding("cope")
    q, k, v = tensors(q_len=q_len, k_len=k_len, kv_heads=kv_heads)
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    got = outputs_and_grads(enc, q, k, v, "sdpa", **kwargs)
    assert len(spy) == 1 and spy[0]["gate_scale"] == enc.head_dim**-0.5, "the kernel did not serve"
    assert_all_close(got, expected, atol=1e-10)
    assert got[4].abs().sum() > 0, "the table receives a gradient"


@pytest.mark.parametrize("case", ["bidirectional", "per-row positions", "packed documents"])
def test_other_calls_take_the_mask_form(case, spy):
    q_len, k_len, kwargs = CASES[case]
    enc = make_encoding("cope")
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    assert_all_close(outputs_and_grads(enc, q, k, v, "sdpa", **kwargs),
                     outputs_and_grads(enc, q, k, v, "eager", **kwargs), atol=1e-10)
    assert not spy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_equals_eager_at_that_precision(dtype, spy):
    """From the same rounded inputs both compute in float32; against float64 a bf16 rounding of q or k can move a
    count across an integer, where the lookup's gradient jumps, so the reference is eager at the same dtype."""
    enc = make_encoding("cope").to(dtype)
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in tensors(q_len=70, k_len=70))
    expected = outputs_and_grads(enc, q, k, v, "eager")
    got = outputs_and_grads(enc, q, k, v, "sdpa")
    assert spy and got[0].dtype == dtype
    assert_all_close(got, expected, atol=tolerance(dtype, 4))


def test_a_training_step_keeps_what_nope_keeps():
    """Bytes autograd keeps for the backward, 2 sequences of 512 tokens: within 5% of NoPE's (the eager form kept
    about a dozen (B, H, T, T) tensors: 11.5× NoPE's)."""
    sizes = saved_step_bytes(("none", "cope"))
    assert sizes["cope"] <= 1.05 * sizes["none"], sizes


def test_the_tiny_lm_decodes_with_its_cache_as_in_one_pass():
    """A KV-cache step reaches the kernel with Tq < Tk: a CoPE model's cached logits equal its full forward's."""
    from posenc.lm.model import KVCache, LanguageModel, ModelConfig

    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(encoding="cope", max_positions=64)).double().eval()
    with torch.no_grad():
        model.encoding.embeddings.normal_()
        tokens = torch.randint(0, 256, (2, 40))
        full = model(tokens)
        cache = KVCache(len(model.blocks))
        steps = [model(tokens[:, :30], cache=cache)] + [model(tokens[:, t:t + 1], cache=cache) for t in range(30, 40)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)
