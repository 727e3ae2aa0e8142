"""Transformer-XL's kernel (``kernels.offset_lookup``) equals attention with the looked-up terms added.

The reference is autograd through ``softmax(scale·(c·kᵀ + l·table[h, i − j]))·v`` in float64 and, through
``attention()``, the eager backend: output and the gradients of q, k, v, u, v (the biases) and W_R.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.kernels import dispatch, offset_lookup
from tests.helpers import kernel_calls, make_encoding, saved_step_bytes
from tests.kernels.test_channels import CASES, assert_all_close, at_dtype, outputs_and_grads, tensors

pytestmark = pytest.mark.skipif(offset_lookup.extension() is None, reason="no C++ toolchain to build the kernel")


def reference(q, k, v, table, *, values=None, value_floor=None, content_shift=None, lookup_shift=None, scale):
    """float64 causal attention with the term l_i·table[h, i − j] (and Σ_j p_ij values[h, i − j] + value_floor in
    the output), queries at the last Tq key positions, offsets past the table adding nothing."""
    content = q if content_shift is None else q + content_shift[:, None, :]
    lookup = q if lookup_shift is None else q + lookup_shift[:, None, :]
    q_len, k_len, rows = q.shape[2], k.shape[2], table.shape[1]
    offset = torch.arange(q_len)[:, None] + (k_len - q_len) - torch.arange(k_len)[None, :]  # (Tq, Tk)
    allowed = offset >= 0
    in_table = (allowed & (offset < rows)).double()
    per_offset = lookup @ table.transpose(-1, -2)  # (B, H, Tq, N)
    looked_up = per_offset.gather(-1, offset.clamp(0, rows - 1).expand(*per_offset.shape[:2], -1, -1)) * in_table
    logits = (scale * (content @ k.transpose(-1, -2) + looked_up)).masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    out = weights @ v
    if values is not None:  # each pair's row of values: (H or 1, Tq, Tk, Dv)
        out = out + torch.einsum("bhqk,hqkd->bhqd", weights, values[:, offset.clamp(0, rows - 1)] * in_table[..., None])
    return out if value_floor is None else out + value_floor


def kernel(q, k, v, table, **terms):
    return offset_lookup.offset_lookup_attention(q, k, v, table, **terms)


def output_and_grads(function, upstream, inputs: dict, **constants):
    """function(**inputs, **constants) and the gradients of every input, in ``inputs``' order."""
    leaves = {name: t.detach().requires_grad_() for name, t in inputs.items()}
    out = function(**leaves, **constants)
    return [out, *torch.autograd.grad(out, list(leaves.values()), upstream.to(out.dtype))]


@st.composite
def problems(draw):
    q_len = draw(st.integers(1, 90))
    k_len = draw(st.integers(q_len, 120)) if draw(st.booleans()) else q_len  # queries are the last Tq keys
    band = draw(st.booleans())  # Shaw's: fewer rows than keys, values, often one table for every head
    return dict(batch=draw(st.integers(1, 2)), heads=draw(st.integers(1, 3)), q_len=q_len, k_len=k_len,
                rows=draw(st.integers(1, k_len + 5) if band else st.integers(k_len, k_len + 5)),
                shared=band and draw(st.booleans()), values=band, shifts=not band or draw(st.booleans()),
                width=draw(st.sampled_from([4, 8, 16])), value_width=draw(st.sampled_from([4, 6, 16])),
                scale=draw(st.sampled_from([0.25, 1.0, 4.0])), strided=draw(st.booleans()),
                seed=draw(st.integers(0, 2**16)))


@settings(max_examples=80, deadline=None)
@given(problems())
def test_equals_attention_with_looked_up_terms_in_float64(p):
    """Across query tiles (32 rows), KV-cache steps (Tq < Tk), tables longer and shorter than the keys, one table
    for every head, values, token-major layouts and large logits: output and the gradients of q, k, v, the
    table, the values, the floor and the shifts."""
    generator = torch.Generator().manual_seed(p["seed"])

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    def laid_out(length, width):  # token-major (B, T, H, D) viewed as (B, H, T, D), as models pass
        if p["strided"]:
            return randn(p["batch"], length, p["heads"], width).transpose(1, 2)
        return randn(p["batch"], p["heads"], length, width)

    table_heads = 1 if p["shared"] else p["heads"]
    inputs = dict(q=laid_out(p["q_len"], p["width"]), k=laid_out(p["k_len"], p["width"]),
                  v=laid_out(p["k_len"], p["value_width"]), table=randn(table_heads, p["rows"], p["width"]))
    if p["values"]:
        inputs.update(values=randn(table_heads, p["rows"], p["value_width"]), value_floor=randn(p["value_width"]))
    if p["shifts"]:
        inputs.update(content_shift=randn(p["heads"], p["width"]), lookup_shift=randn(p["heads"], p["width"]))
    upstream = randn(p["batch"], p["heads"], p["q_len"], p["value_width"])
    got = output_and_grads(kernel, upstream, inputs, scale=p["scale"])
    expected = output_and_grads(reference, upstream, inputs, scale=p["scale"])
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * max(1.0, float(b.detach().abs().max())))


@pytest.mark.parametrize("terms", ["shifts", "band"])
def test_float32_is_within_verify_tolerance_of_float64(terms):
    generator = torch.Generator().manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    inputs = dict(q=randn(2, 3, 150, 16), k=randn(2, 3, 150, 16), v=randn(2, 3, 150, 16))
    if terms == "shifts":
        inputs.update(table=randn(3, 150, 16), content_shift=randn(3, 16), lookup_shift=randn(3, 16))
    else:
        inputs.update(table=randn(1, 40, 16), values=randn(1, 40, 16), value_floor=randn(16))
    upstream = randn(2, 3, 150, 16)
    expected = output_and_grads(kernel, upstream, inputs, scale=1.0)
    got = output_and_grads(kernel, upstream, {name: t.float() for name, t in inputs.items()}, scale=1.0)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5 * max(1.0, float(b.detach().abs().max())))


def test_bad_shapes_are_refused():
    q, k, v = tensors(q_len=5, k_len=9)
    shift = torch.zeros(4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"table must be \(H or 1, N ≥ 1, Dh\) = \(4, N, 8\), got \(2, 9, 8\)"):
        kernel(q, k, v, torch.zeros(2, 9, 8, dtype=torch.float64), scale=1.0)
    with pytest.raises(ValueError, match=r"table must be .*, got \(4, 0, 8\)"):
        kernel(q, k, v, torch.zeros(4, 0, 8, dtype=torch.float64), scale=1.0)
    with pytest.raises(ValueError, match=r"Tq ≤ Tk"):
        kernel(k, q, q, torch.zeros(4, 9, 8, dtype=torch.float64), scale=1.0)
    with pytest.raises(ValueError, match=r"lookup_shift must be \(H, Dh\) = \(4, 8\), got \(8,\)"):
        kernel(q, k, v, torch.zeros(4, 9, 8, dtype=torch.float64), content_shift=shift, lookup_shift=shift[0],
               scale=1.0)
    with pytest.raises(ValueError, match=r"values must be \(like the table, N, Dv\) = \(1, 3, 8\), got \(1, 4, 8\)"):
        kernel(q, k, v, torch.zeros(1, 3, 8, dtype=torch.float64), values=torch.zeros(1, 4, 8, dtype=torch.float64),
               scale=1.0)
    with pytest.raises(ValueError, match=r"value_floor must be \(Dv,\) = \(8,\), got \(4,\)"):
        kernel(q, k, v, torch.zeros(1, 3, 8, dtype=torch.float64), value_floor=torch.zeros(4, dtype=torch.float64),
               scale=1.0)


@pytest.fixture
def spy(monkeypatch):
    """The calls that reach this kernel from attention(), with the lookup form forced (it would be timed against
    the channel form)."""
    return kernel_calls(monkeypatch, offset_lookup, "offset_lookup_attention", "lookups")


@pytest.mark.parametrize("case", ["causal", "kv-cache step"])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_attention_serves_transformer_xl_exactly(case, kv_heads, spy):
    """sdpa (this kernel) equals eager in float64: output, q, k, v and the gradients of u, v and W_R."""
    q_len, k_len, kwargs = CASES[case]
    enc = make_encoding("transformer_xl", heads=4)
    q, k, v = tensors(q_len=q_len, k_len=k_len, kv_heads=kv_heads)
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    got = outputs_and_grads(enc, q, k, v, "sdpa", **kwargs)
    assert len(spy) == 1, "the kernel did not serve"
    assert_all_close(got, expected, atol=1e-10)
    assert all(g.abs().sum() > 0 for g in got[4:]), "every parameter receives a gradient"


@pytest.mark.parametrize("case", ["bidirectional", "per-row positions", "packed documents"])
def test_other_calls_take_another_form(case, spy):
    q_len, k_len, kwargs = CASES[case]
    enc = make_encoding("transformer_xl", heads=4)
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    assert_all_close(outputs_and_grads(enc, q, k, v, "sdpa", **kwargs),
                     outputs_and_grads(enc, q, k, v, "eager", **kwargs), atol=1e-10)
    assert not spy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_errs_no_more_than_eager(dtype, spy):
    """Against float64, from the same rounded inputs and parameters: the table is built in float32 from float64
    angles even for bf16 activations, so the kernel errs no more than eager at that dtype."""
    enc = make_encoding("transformer_xl", heads=4)
    q, k, v = tensors(q_len=70, k_len=70)
    exact = [t.detach() for t in outputs_and_grads(enc, q, k, v, "eager")]
    low, q, k, v = at_dtype(enc, q, k, v, dtype)
    got = outputs_and_grads(low, q, k, v, "sdpa")
    eager = outputs_and_grads(low, q, k, v, "eager")
    assert spy and got[0].dtype == dtype
    for ours, theirs, truth in zip(got, eager, exact, strict=True):
        error, eager_error = (float((x.detach().double() - truth).abs().max()) for x in (ours, theirs))
        assert error <= 1.5 * eager_error + 1e-5 * float(truth.abs().max()), (error, eager_error)


def test_a_training_step_keeps_what_nope_keeps(monkeypatch):
    """Bytes autograd keeps for the backward, 2 sequences of 512 tokens: within 5% of NoPE's (the lookup queries
    and one (H, T, Dh) table beside q, k, v and the output)."""
    monkeypatch.setenv(dispatch.FORCE_VARIABLE, "lookups")
    sizes = saved_step_bytes(("none", "transformer_xl"))
    assert sizes["transformer_xl"] <= 1.05 * sizes["none"], sizes


def test_the_lookup_and_channel_forms_are_timed_against_each_other(tmp_path, monkeypatch):
    import posenc

    monkeypatch.setenv(dispatch.CACHE_VARIABLE, str(tmp_path / "forms.json"))
    monkeypatch.setattr(dispatch, "_chosen", {})
    timed = []
    monkeypatch.setattr(dispatch, "time_forms", lambda contenders: timed.append(sorted(contenders)) or
                        {name: float(i) for i, name in enumerate(sorted(contenders))})
    enc = posenc.build("transformer_xl", num_heads=4, head_dim=8)
    q, k, v = (torch.randn(2, 4, 40, 8, requires_grad=True) for _ in range(3))
    posenc.attention(q, k, v, enc, backend="sdpa").sum().backward()
    assert timed == [["channels", "lookups"]] and list(dispatch.chosen().values()) == ["channels"]
