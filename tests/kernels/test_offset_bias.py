"""The kernel with the bias inside (``kernels.offset_bias``) equals softmax attention with the bias added.

The reference is autograd through ``softmax(scale·q·kᵀ + table[h, offset])·v`` in float64, and, through
``attention()``, the eager backend for every encoding whose bias is a function of (head, offset): output and
the gradients of q, k, v and every parameter of the encoding.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import storage
from posenc.kernels import dispatch, offset_bias
from posenc.verify import tolerance
from tests.helpers import kernel_calls, make_encoding, saved_step_bytes
from tests.kernels.test_channels import CASES, assert_all_close, at_dtype, outputs_and_grads, tensors

pytestmark = pytest.mark.skipif(offset_bias.extension() is None, reason="no C++ toolchain to build the kernel")

BIAS_ENCODINGS = ["alibi", "alibi_symmetric", "sandwich", "kerple_log", "kerple_power", "t5", "t5_interpolated", "fire"]
MODEL_BIAS_ENCODINGS = ["alibi", "sandwich", "kerple", "t5", "fire", "fox"]
CONTIGUOUS_CASES = ["causal", "bidirectional", "kv-cache step"]


def reference(q, k, v, table, lowest, scale, causal):
    """float64 attention with bias[h, i, j] = table[h, (Tk − Tq + i − j) − lowest]; k, v may have fewer heads."""
    q, k, v, table = (t.double() for t in (q, k, v, table))
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    q_len, k_len = q.shape[2], k.shape[2]
    offset = torch.arange(q_len)[:, None] + (k_len - q_len) - torch.arange(k_len)[None, :]  # (Tq, Tk)
    allowed = offset >= 0 if causal else torch.ones_like(offset, dtype=torch.bool)
    bias = table[:, (offset - lowest).clamp(0, table.shape[1] - 1)]  # (H, Tq, Tk)
    logits = (scale * q @ k.transpose(-1, -2) + bias).masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


def output_and_grads(function, upstream, *inputs):
    inputs = [t.detach().requires_grad_() for t in inputs]
    out = function(*inputs)
    return [out, *torch.autograd.grad(out, inputs, upstream.to(out.dtype))]


@st.composite
def problems(draw):
    causal = draw(st.booleans())
    kv_heads = draw(st.sampled_from([1, 2]))
    q_len = draw(st.integers(1, 200))
    k_len = draw(st.integers(q_len, 260)) if draw(st.booleans()) else q_len  # queries are the last Tq keys
    return dict(batch=draw(st.integers(1, 2)), heads=kv_heads * draw(st.sampled_from([1, 2])), kv_heads=kv_heads,
                causal=causal, q_len=q_len, k_len=k_len, width=draw(st.sampled_from([4, 8, 16])),
                value_width=draw(st.sampled_from([4, 6, 16])), spare=draw(st.integers(0, 5)),
                scale=draw(st.sampled_from([0.25, 1.0, 4.0])), strided=draw(st.booleans()),
                seed=draw(st.integers(0, 2**16)))


@settings(max_examples=60, deadline=None)
@given(problems())
def test_equals_softmax_attention_in_float64(p):
    """Output and the gradients of q, k, v and the table, across query and key tiles (64 and 128), with queries
    the last Tq keys (a KV-cache step), grouped-query heads, a table wider than the offsets reached, token-major
    layouts and large logits."""
    generator = torch.Generator().manual_seed(p["seed"])

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    def laid_out(batch, heads, length, width):  # token-major (B, T, H, D) viewed as (B, H, T, D), as models pass
        return randn(batch, length, heads, width).transpose(1, 2) if p["strided"] else randn(batch, heads, length, width)

    q = laid_out(p["batch"], p["heads"], p["q_len"], p["width"])
    k = laid_out(p["batch"], p["kv_heads"], p["k_len"], p["width"])
    v = laid_out(p["batch"], p["kv_heads"], p["k_len"], p["value_width"])
    low, high = offset_bias.offsets(p["q_len"], p["k_len"], p["causal"])
    table = randn(p["heads"], high - low + 1 + 2 * p["spare"]) * 3
    lowest = low - p["spare"]
    upstream = randn(p["batch"], p["heads"], p["q_len"], p["value_width"])
    got = output_and_grads(lambda *t: offset_bias.offset_bias_attention(
        *t, lowest, scale=p["scale"], causal=p["causal"]), upstream, q, k, v, table)
    expected = output_and_grads(lambda *t: reference(*t, lowest, p["scale"], p["causal"]), upstream, q, k, v, table)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * max(1.0, float(b.detach().abs().max())))
    assert got[0].dtype == torch.float64 and got[0].shape == expected[0].shape


def test_float32_is_within_verify_tolerance_of_float64():
    """The float path's own exp (a vectorizable polynomial) against float64, with logits up to ±200 (clamped
    below −87 to a zero weight, never a NaN)."""
    q, k, v = (torch.randn(2, 4, 300, 32, dtype=torch.float64) for _ in range(3))
    low, high = offset_bias.offsets(300, 300, True)
    table = torch.randn(4, high - low + 1, dtype=torch.float64) * 60
    upstream = torch.randn(2, 4, 300, 32, dtype=torch.float64)
    run = lambda *t: offset_bias.offset_bias_attention(*t, low, scale=32**-0.5, causal=True)  # noqa: E731
    expected = output_and_grads(run, upstream, q, k, v, table)
    got = output_and_grads(run, upstream, *(t.float() for t in (q, k, v, table)))
    assert all(torch.isfinite(g).all() for g in got)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5 * max(1.0, float(b.detach().abs().max())))


def test_float32_leaves_no_subnormal_number():
    """ALiBi's far keys (bias −offset, down to −300) under the small gradients of training: a weight that
    underflows is exactly 0, never one near exp(−87) whose products with values and gradients are subnormal
    (each a microcode assist on an Intel Xeon: ALiBi's step ran at 1.5× NoPE's there)."""
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=generator) for _ in range(3))
    low, high = offset_bias.offsets(300, 300, True)
    table = -torch.arange(low, high + 1, dtype=torch.float32).expand(2, -1).contiguous()
    upstream = torch.randn(1, 2, 300, 16, generator=generator) * 1e-4
    got = output_and_grads(lambda *t: offset_bias.offset_bias_attention(*t, low, scale=0.25, causal=True), upstream,
                           q, k, v, table)
    tiny = torch.finfo(torch.float32).tiny
    for name, tensor in zip(("out", "dq", "dk", "dv", "dtable"), got, strict=True):
        subnormal = (tensor != 0) & (tensor.abs() < tiny)
        assert not subnormal.any(), f"{name}: {int(subnormal.sum())} subnormal values"
    assert (got[4][:, -1] == 0).all() and (got[4][:, 0] != 0).all()  # the farthest offset's weight is exactly 0


def test_a_table_that_misses_an_offset_is_refused():
    q, k, v = tensors(q_len=5, k_len=9)
    with pytest.raises(ValueError, match=r"table must be \(H, N\) = \(4, N\) covering offsets 0\.\.8"):
        offset_bias.offset_bias_attention(q, k, v, torch.zeros(4, 8, dtype=torch.float64), 0, scale=1.0, causal=True)
    with pytest.raises(ValueError, match=r"covering offsets -4\.\.8 from lowest=-3"):
        offset_bias.offset_bias_attention(q, k, v, torch.zeros(4, 20, dtype=torch.float64), -3, scale=1.0,
                                          causal=False)


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls that reach this kernel from attention(), with the table form forced."""
    return kernel_calls(monkeypatch, offset_bias, "offset_bias_attention", "table")


@pytest.mark.parametrize("case", CONTIGUOUS_CASES)
@pytest.mark.parametrize("key", BIAS_ENCODINGS)
def test_attention_serves_every_offset_bias_exactly(key, case, spy):
    """sdpa (this kernel) equals eager in float64: output, q, k, v and every parameter's gradient (T5's
    buckets, Kerple's kernel, FIRE's MLP, threshold and scale through the table)."""
    q_len, k_len, kwargs = CASES[case]
    enc = make_encoding(key, heads=4)
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    got = outputs_and_grads(enc, q, k, v, "sdpa", **kwargs)
    assert len(spy) == 1 and spy[0]["causal"] == (case != "bidirectional"), "the kernel did not serve"
    assert_all_close(got, expected, atol=1e-10)
    assert all(g.abs().sum() > 0 for g in got[4:]), "every parameter receives a gradient"


@pytest.mark.parametrize("case", ["per-row positions", "packed documents"])
def test_explicit_positions_and_masks_take_another_form(case, spy):
    q_len, k_len, kwargs = CASES[case]
    enc = make_encoding("t5", heads=4)
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    assert_all_close(outputs_and_grads(enc, q, k, v, "sdpa", **kwargs),
                     outputs_and_grads(enc, q, k, v, "eager", **kwargs), atol=1e-10)
    assert not spy


def test_fire_from_its_threshold_on_reads_its_segments_instead_of_a_table(spy):
    """Past L every query has its own normaliser ψ(i), so the bias is no table of offsets there: the kernel reads
    FIRE's segments per pair (tests/kernels/test_fire_cpu.py)."""
    enc = make_encoding("fire", heads=4)
    with torch.no_grad():
        enc.threshold.fill_(8 / 512)  # L = 8 < the last query's position, 11
    q, k, v = tensors()
    assert_all_close(outputs_and_grads(enc, q, k, v, "sdpa"), outputs_and_grads(enc, q, k, v, "eager"), atol=1e-10)
    assert len(spy) == 1 and spy[0]["segments"] is not None
    with torch.no_grad():
        enc.threshold.fill_(12 / 512)
    outputs_and_grads(enc, q, k, v, "sdpa")
    assert len(spy) == 2 and spy[1].get("segments") is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_within_verify_tolerance(dtype, spy):
    enc = make_encoding("kerple_log", heads=4)
    q, k, v = tensors(q_len=70, k_len=70)
    expected = outputs_and_grads(enc, q, k, v, "eager")
    got = outputs_and_grads(*at_dtype(enc, q, k, v, dtype), "sdpa")
    assert spy and got[0].dtype == dtype
    assert_all_close(got, expected, atol=tolerance(dtype, 4))


def fox_inputs(q_len, k_len, kv_heads=None):
    q, k, v = tensors(q_len=q_len, k_len=k_len, kv_heads=kv_heads)
    generator = torch.Generator().manual_seed(3)
    log_forget = torch.nn.functional.logsigmoid(torch.randn(2, 4, k_len, generator=generator, dtype=torch.float64))
    return q, k, v, log_forget.requires_grad_()


@pytest.mark.parametrize("case", ["causal", "kv-cache step"])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_attention_serves_fox_with_its_gates_inside(case, kv_heads, monkeypatch):
    """FoX's c_i − c_j is formed per tile from c = cumsum log f (float64): sdpa equals eager in float64, output,
    q, k, v and the log gates' gradients."""
    calls = kernel_calls(monkeypatch, offset_bias, "offset_bias_attention", "gates")
    q_len, k_len, _ = CASES[case]
    enc = posenc.build("fox", dim=8, num_heads=4).double()
    q, k, v, log_forget = fox_inputs(q_len, k_len, kv_heads)
    upstream = torch.randn(2, 4, q_len, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    results = {}
    for backend in ("eager", "sdpa"):
        at = enc.at(torch.arange(k_len - q_len, k_len), torch.arange(k_len), contiguous=True).with_gates(log_forget)
        out = posenc.attention(q, k, v, at, backend=backend)
        results[backend] = [out, *torch.autograd.grad(out, [q, k, v, log_forget], upstream)]
    assert len(calls) == 1 and calls[0]["token_values"] is not None, "the kernel did not serve"
    assert_all_close(results["sdpa"], results["eager"], atol=1e-10)
    assert results["sdpa"][4].abs().sum() > 0


def test_token_values_keep_their_digits_far_from_zero_in_float32():
    """c reaches −30,000 (gates of e^−3 over 10,000 tokens): formed in double, c_i − c_j is exact to float32."""
    q, k, v = (torch.randn(1, 2, 200, 16, dtype=torch.float64) for _ in range(3))
    c = (torch.full((1, 2, 200), -3.0, dtype=torch.float64).cumsum(-1) - 29_400).requires_grad_()
    low, high = offset_bias.offsets(200, 200, True)
    table = torch.zeros(2, high - low + 1, dtype=torch.float64)
    upstream = torch.randn(1, 2, 200, 16, dtype=torch.float64)
    run = lambda q, k, v, c: offset_bias.offset_bias_attention(  # noqa: E731
        q, k, v, table.to(q.dtype), low, scale=0.25, causal=True, token_values=c)
    expected = output_and_grads(run, upstream, q, k, v, c)
    got = output_and_grads(run, upstream, q.float(), k.float(), v.float(), c)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-5 * max(1.0, float(b.detach().abs().max())))
    with pytest.raises(ValueError, match=r"token_values must be \(B or 1, H, Tk\) = \(1, 2, 200\), got \(1, 2, 199\)"):
        run(q, k, v, c[..., 1:])


@pytest.mark.parametrize("name", MODEL_BIAS_ENCODINGS)
def test_a_training_step_keeps_what_nope_keeps(name, monkeypatch):
    """Bytes autograd keeps for the backward, 2 sequences of 512 tokens: the bias is a table of offsets, so within
    5% of NoPE's (only the (H, N) table and one log-sum-exp per row beside q, k, v and the output)."""
    monkeypatch.setenv(dispatch.FORCE_VARIABLE, "table")
    sizes = saved_step_bytes(("none", name))
    assert sizes[name] <= 1.05 * sizes["none"], sizes


def test_no_gradient_is_left_by_the_timing_of_forms(tmp_path, monkeypatch):
    """The first call of a shape times its forms on stand-in tensors: the encoding's parameters and the caller's
    tensors get only the real call's gradient."""
    monkeypatch.setenv(dispatch.CACHE_VARIABLE, str(tmp_path / "forms.json"))
    monkeypatch.setattr(dispatch, "_chosen", {})
    enc = posenc.build("t5", num_heads=4)
    q, k, v = (torch.randn(2, 4, 40, 8, requires_grad=True) for _ in range(3))
    posenc.attention(q, k, v, enc, backend="sdpa").sum().backward()
    first = [t.grad.clone() for t in (q, k, v, enc.table)]
    for t in (q, k, v, enc.table):
        t.grad = None
    posenc.attention(q, k, v, enc, backend="sdpa").sum().backward()
    for a, t in zip(first, (q, k, v, enc.table)):
        torch.testing.assert_close(a, t.grad)
    (key, form), = dispatch.chosen().items()
    assert key.startswith("T5RelativeBias float32 causal train B·H=8") and form in ("table", "mask")
    assert set(storage.read_json(tmp_path / "forms.json")[key]["ms"]) == {"table", "mask"}
