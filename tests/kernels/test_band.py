"""Attention plus a band of learned near offsets (``kernels.band``) equals its formula, and Shaw through it
equals Shaw's eager reference: outputs and the gradients of q, k, v and both tables, in float64."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.kernels import band, offset_lookup
from posenc.verify import tolerance
from tests.helpers import saved_step_bytes
from tests.kernels.test_channels import assert_all_close, outputs_and_grads


def reference(q, k, v, key_band, value_band, value_floor, scale):
    """float64, from the definition: logit_ij = scale·(q_i·k_j + [0 <= i−j < K] q_i·key_band[i−j]), causal;
    out_i = Σ_j p_ij v_j + Σ_{d<K} p_{i,i−d} value_band[d] + value_floor."""
    q, k, v, key_band, value_band, value_floor = (t.double() for t in (q, k, v, key_band, value_band, value_floor))
    length, width = q.shape[2], key_band.shape[0]
    distance = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # (T, T): i − j
    near = (distance >= 0) & (distance < width)
    rows = distance.clamp(0, width - 1)
    band_logits = torch.einsum("bhid,ijd->bhij", q, key_band[rows] * near[..., None])
    logits = (scale * (q @ k.transpose(-1, -2) + band_logits)).masked_fill(distance < 0, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return probs @ v + torch.einsum("bhij,ijd->bhid", probs, value_band[rows] * near[..., None]) + value_floor


def grads_of(function, upstream, *tensors):
    inputs = [t.detach().requires_grad_() for t in tensors]
    out = function(*inputs)
    return [out, *torch.autograd.grad(out, inputs, upstream.to(out.dtype))]


@settings(max_examples=50, deadline=None)
@given(batch=st.integers(1, 2), heads=st.integers(1, 3), length=st.integers(1, 45), width=st.integers(1, 20),
       head_dim=st.sampled_from([4, 8]), value_dim=st.sampled_from([4, 6]), block=st.integers(1, 40),
       seed=st.integers(0, 2**16))
def test_equals_its_formula_in_float64(batch, heads, length, width, head_dim, value_dim, block, seed):
    """Any band width (wider than the sequence too), block size and value width."""
    generator = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    tensors = (randn(batch, heads, length, head_dim), randn(batch, heads, length, head_dim),
               randn(batch, heads, length, value_dim), randn(width, head_dim), randn(width, value_dim),
               randn(value_dim))
    upstream = randn(batch, heads, length, value_dim)
    got = grads_of(lambda *t: band.band_attention(*t, scale=0.3, block=block), upstream, *tensors)
    expected = grads_of(lambda *t: reference(*t, 0.3), upstream, *tensors)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("call, message", [
    (lambda q, t: band.band_attention(q, q, q, t, t, scale=1.0, block=0), r"block must be an integer >= 1, got 0"),
    (lambda q, t: band.band_attention(q, q, q, t, t, scale=1.0, block=2.5), r"block must be an integer >= 1, got 2.5"),
    (lambda q, t: band.band_attention(q, q[:, :, :3], q[:, :, :3], t, t, scale=1.0), r"needs Tq = Tk"),
    (lambda q, t: band.band_attention(q, q, q, t[:, :3], t, scale=1.0), r"key_band \(K, Dh\)"),
    (lambda q, t: band.band_attention(q, q, q, t, t[:2], scale=1.0), r"value_band \(K, Dv\)"),
    (lambda q, t: band.band_attention(q, q, q, t, t, t[0, :3], scale=1.0), r"value_floor \(Dv,\): .*\(3,\)"),
])
def test_bad_input_is_a_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(1, 2, 5, 4), torch.randn(3, 4))


BUILT = offset_lookup.extension() is not None


@pytest.fixture(params=["lookups", "band"])
def spy(request, monkeypatch):
    """The kernel each Shaw call from attention() reaches, by name: the C++ lookup tiles where they are built
    (``lookups``), the band of diagonals where they are not (``band``, what each parameter forces)."""
    if request.param == "lookups" and not BUILT:
        pytest.skip("no C++ toolchain to build the lookup kernel")
    if request.param == "band":
        monkeypatch.setattr(offset_lookup, "serves", lambda q: False)
    calls = []
    for module, function in ((band, "band_attention"), (offset_lookup, "offset_lookup_attention")):
        original = getattr(module, function)
        monkeypatch.setattr(module, function, lambda *args, _run=original, _name=module.__name__, **kwargs: (
            calls.append(_name.rsplit(".", 1)[-1]), _run(*args, **kwargs))[1])
    return calls


def shaw(max_distance, dtype=torch.float64, heads=4):
    torch.manual_seed(1)
    enc = posenc.build("shaw", head_dim=8, num_heads=heads, max_distance=max_distance).double()
    with torch.no_grad():
        for parameter in enc.parameters():
            parameter.normal_(0, 0.5)
    return enc.to(dtype)


def tensors(q_len=12, k_len=12, dtype=torch.float64):
    torch.manual_seed(0)
    return [torch.randn(2, 4, t, 8, dtype=dtype, requires_grad=True) for t in (q_len, k_len, k_len)]


@pytest.mark.parametrize("max_distance", [1, 3, 11, 40])
def test_shaw_through_the_band_equals_eager(max_distance, spy):
    """Causal, at the model's own positions: q, k, v and both tables' gradients, bands narrower and wider
    than the sequence."""
    enc = shaw(max_distance)
    q, k, v = tensors()
    expected = outputs_and_grads(enc, q, k, v, "eager")
    got = outputs_and_grads(enc, q, k, v, "sdpa")
    assert spy == ["offset_lookup" if offset_lookup.serves(q) else "band"]
    assert_all_close(got, expected, atol=1e-10)


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_a_kv_cache_step_takes_the_lookup_tiles(kv_heads, spy):
    """3 queries after 9 cached keys, grouped heads too: the lookup tiles serve it exactly; the band of diagonals
    (queries at the keys' positions only) leaves it to eager."""
    enc = shaw(3)
    q, k, v = tensors(q_len=3)
    if kv_heads:
        k, v = (t.detach()[:, :kv_heads].requires_grad_() for t in (k, v))
    expected = outputs_and_grads(enc, q, k, v, "eager")
    got = outputs_and_grads(enc, q, k, v, "sdpa")
    assert spy == (["offset_lookup"] if offset_lookup.serves(q) else [])
    assert_all_close(got, expected, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shaw_band_within_verify_tolerance(dtype, spy):
    enc, q, k, v = shaw(3), *tensors()
    expected = outputs_and_grads(enc, q, k, v, "eager")
    low = shaw(3, dtype)
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    got = outputs_and_grads(low, q, k, v, "sdpa")
    assert len(spy) == 1 and got[0].dtype == dtype
    assert_all_close(got, expected, atol=tolerance(dtype, 12))


@pytest.mark.parametrize("kwargs, q_len", [
    ({"causal": False}, 12),
    ({"mask": torch.ones(1, 1, 12, 12, dtype=torch.bool).tril()}, 12),
    ({"q_positions": torch.arange(12) + 5, "k_positions": torch.arange(12) + 5}, 12),
], ids=["bidirectional", "mask", "explicit positions"])
def test_shaw_elsewhere_computes_as_eager(kwargs, q_len, spy):
    enc = shaw(3)
    q, k, v = tensors(q_len=q_len)
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    got = outputs_and_grads(enc, q, k, v, "sdpa", **kwargs)
    assert not spy
    assert_all_close(got, expected, atol=1e-10)


def test_interpolated_shaw_has_no_band_form():
    enc = posenc.build("shaw", head_dim=8, num_heads=4, interpolate_factor=2.0)
    q, k, v = (t.detach() for t in tensors())
    assert posenc.attention(q, k, v, enc).shape == (2, 4, 12, 8)  # auto: eager
    with pytest.raises(ValueError, match="cannot serve Shaw"):
        posenc.attention(q, k, v, enc, backend="sdpa")


def test_no_batch_sized_score_tensor_is_kept_for_the_backward():
    batch, heads, length = 4, 4, 64
    enc = posenc.build("shaw", head_dim=8, num_heads=heads)
    q, k, v = (torch.randn(batch, heads, length, 8, requires_grad=True) for _ in range(3))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        posenc.attention(q, k, v, enc).sum().backward()
    assert max(saved) < batch * heads * length * length
    assert enc.key_table.grad.abs().sum() > 0 and enc.value_table.grad.abs().sum() > 0


def test_a_training_step_keeps_what_nope_keeps(spy):
    """Bytes autograd keeps for the backward, 2 sequences of 512 tokens: within 1% of NoPE's, whichever kernel
    serves (the output the kernel keeps is the one it returns, the value floor added in place)."""
    sizes = saved_step_bytes(("none", "shaw"))
    assert spy and sizes["shaw"] <= 1.01 * sizes["none"], sizes
