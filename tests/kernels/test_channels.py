"""Score terms as extra q/k channels (causal ALiBi, Transformer-XL) equal their reference doors.

The reference is the eager backend in float64 (the bias, or the content-position logits,
materialized); ``channels`` forces the channel form at every length, as it serves on CUDA.
"""

import copy

import pytest
import torch

import posenc
from posenc.encodings.alibi import ALiBi
from posenc.encodings.positioned import channels_from_keys
from posenc.encodings.relative import TransformerXL
from posenc.encodings.sandwich import Sandwich
from posenc.kernels import blockwise, dispatch
from posenc.kernels import channels as channels_module
from posenc.verify import tolerance
from tests.oracles import naive_attention

HEADS, HEAD_DIM = 4, 8
ENCODINGS = {
    "alibi": lambda heads: posenc.build("alibi", num_heads=heads),
    "transformer_xl": lambda heads: posenc.build("transformer_xl", num_heads=heads, head_dim=HEAD_DIM),
    "sandwich": lambda heads: posenc.build("sandwich", num_heads=heads, sinusoid_dim=16),
}


@pytest.fixture
def channels(monkeypatch):
    """The channel form at every key count (on CPU it serves only past a measured length)."""
    monkeypatch.setattr(ALiBi, "cpu_channels_from_keys", 0)
    monkeypatch.setattr(TransformerXL, "cpu_channels_from_keys", 0)
    monkeypatch.setattr(Sandwich, "cpu_channels_from_keys", 0)


@pytest.fixture
def spy(monkeypatch):
    """Records the keyword arguments of every channel-form call: SDPA on widened q, k and padded v, or (more
    channels than v is wide, on CPU) the blockwise kernel with the channels apart. The channel form is forced
    where it serves (it would be timed against the others)."""
    monkeypatch.setenv(dispatch.FORCE_VARIABLE, "channels")
    calls = []

    def recorder(original, with_channels_only):
        def recording(*args, **kwargs):
            if not with_channels_only or kwargs.get("q_channels") is not None:
                calls.append(kwargs)
            return original(*args, **kwargs)
        return recording

    monkeypatch.setattr(channels_module, "sdpa_with_channels", recorder(channels_module.sdpa_with_channels, False))
    monkeypatch.setattr(blockwise, "blockwise_attention", recorder(blockwise.blockwise_attention, True))
    return calls


def encoding(name, heads=HEADS, dtype=torch.float64):
    torch.manual_seed(1)
    enc = ENCODINGS[name](heads).double()
    with torch.no_grad():
        for parameter in enc.parameters():
            parameter.normal_(0, 0.5)  # big enough that the position terms move outputs visibly
    return enc.to(dtype)


def tensors(batch=2, q_len=12, k_len=12, heads=HEADS, kv_heads=None, dtype=torch.float64):
    torch.manual_seed(0)
    shape = lambda h, t: (batch, h, t, HEAD_DIM)  # noqa: E731
    q = torch.randn(*shape(heads, q_len), dtype=dtype, requires_grad=True)
    k, v = (torch.randn(*shape(kv_heads or heads, k_len), dtype=dtype, requires_grad=True) for _ in range(2))
    return q, k, v


def outputs_and_grads(enc, q, k, v, backend, **kwargs):
    """Output and the gradients of q, k, v and every parameter of the encoding, for a fixed upstream gradient."""
    out = posenc.attention(q, k, v, enc, backend=backend, **kwargs)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(out.dtype)
    inputs = [q, k, v, *enc.parameters()]
    return [out, *torch.autograd.grad(out, inputs, upstream)]


def at_dtype(enc, q, k, v, dtype):
    """A copy of the encoding and fresh leaf copies of q, k, v, all rounded to ``dtype``: the same call at a lower
    precision, for a verify-tolerance comparison with the float64 one."""
    return (copy.deepcopy(enc).to(dtype), *(t.detach().to(dtype).requires_grad_() for t in (q, k, v)))


def with_rounded_weights(enc, dtype):
    """A float64 copy of the encoding whose parameters were first rounded to ``dtype``: the reference for FIRE at a
    lower precision. Rounding its first layer moves each ReLU's kink −b/w by up to |kink|·2⁻⁸ in bf16, past pairs
    whose x lies that close, and the gradient of b1 and W1 jumps by their share there, whatever the kernel does."""
    return copy.deepcopy(enc).to(dtype).double()


def assert_all_close(got, expected, atol):
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=0, atol=atol * max(1.0, float(b.detach().abs().max())))


CASES = {
    # name: (q_len, k_len, attention() keyword arguments)
    "causal": (12, 12, {}),
    "bidirectional": (12, 12, {"causal": False}),
    "kv-cache step": (3, 12, {}),
    "per-row positions": (6, 6, {"q_positions": torch.tensor([[0, 1, 2, 3, 4, 5], [9, 10, 11, 30, 31, 32]]),
                                  "k_positions": torch.tensor([[0, 1, 2, 3, 4, 5], [9, 10, 11, 30, 31, 32]])}),
    "packed documents": (8, 8, {"q_positions": torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]]).expand(2, -1),
                                "k_positions": torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]]).expand(2, -1),
                                "mask": posenc.document_mask(torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]]))}),
    "offset 2^14": (12, 12, {"q_positions": torch.arange(2**14, 2**14 + 12),
                             "k_positions": torch.arange(2**14, 2**14 + 12)}),
    "offset 2^20": (12, 12, {"q_positions": torch.arange(2**20, 2**20 + 12),
                             "k_positions": torch.arange(2**20, 2**20 + 12)}),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ENCODINGS)
def test_channel_form_equals_reference_in_float64(name, case, channels, spy):
    q_len, k_len, kwargs = CASES[case]
    enc = encoding(name)
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    got = outputs_and_grads(enc, q, k, v, "sdpa", **kwargs)
    assert spy, "the channel form did not serve"
    assert_all_close(got, expected, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["causal", "kv-cache step", "packed documents", "offset 2^20"])
@pytest.mark.parametrize("name", ENCODINGS)
def test_channel_form_within_verify_tolerance(name, case, dtype, channels, spy):
    """Against the float64 reference, by ``posenc verify``'s rule, forward and every gradient."""
    q_len, k_len, kwargs = CASES[case]
    enc = encoding(name)
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    low = encoding(name, dtype=dtype)
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    got = outputs_and_grads(low, q, k, v, "sdpa", **kwargs)
    # Sandwich's d unit-size products would round in bf16: it keeps the bias form there
    assert bool(spy) == (name != "sandwich" or dtype != torch.bfloat16), "the channel form served where it should not"
    largest = int(kwargs.get("q_positions", torch.tensor(k_len)).max())
    assert_all_close(got, expected, atol=tolerance(dtype, largest))


@pytest.mark.parametrize("heads", [3, 4, 12])
def test_alibi_channels_against_the_papers_bias_one_query_at_a_time(heads, channels):
    """The loop oracle adds −m_h·(i − j) to each scaled logit; slopes of a non-power-of-two count too."""
    enc = encoding("alibi", heads=heads)
    q, k, v = (t.detach() for t in tensors(batch=1, q_len=9, k_len=9, heads=heads))
    got = posenc.attention(q, k, v, enc, backend="sdpa")
    slopes = posenc.alibi_slopes(heads)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    for h in range(heads):
        expected = naive_attention(q[0, h], k[0, h], v[0, h], bias=-slopes[h] * (i - j), allowed=j <= i)
        torch.testing.assert_close(got[0, h], expected, rtol=0, atol=1e-12)


def test_alibi_channels_serve_grouped_query_attention(channels, spy):
    enc = encoding("alibi", heads=4)
    q, k, v = tensors(heads=4, kv_heads=2)
    expected = outputs_and_grads(enc, q, k, v, "eager")
    got = outputs_and_grads(enc, q, k, v, "sdpa")
    assert spy
    assert_all_close(got, expected, atol=1e-10)


def test_plain_causal_takes_the_fused_causal_path_and_decoding_a_mask(channels, spy):
    enc = encoding("alibi")
    q, k, v = (t.detach() for t in tensors())
    posenc.attention(q, k, v, enc, backend="sdpa")
    posenc.attention(q[:, :, -2:], k, v, enc, backend="sdpa")
    assert spy[0]["is_causal"] and spy[0]["attn_mask"] is None
    assert spy[1]["attn_mask"].shape[-2:] == (2, 12)


def test_channels_serve_only_where_exact_and_faster():
    alibi, symmetric = posenc.build("alibi", num_heads=4), posenc.build("alibi", num_heads=4, symmetric=True)
    txl = posenc.build("transformer_xl", num_heads=4, head_dim=8)

    def serve(enc, length, dtype=torch.float32, start=0, contiguous=True):
        positions = torch.arange(start, start + length)[None]
        return enc.at(positions, positions, contiguous=contiguous).channels_serve(dtype)

    # On CPU past the measured length only; never for the symmetric form or float16.
    assert not serve(alibi, 1023) and serve(alibi, 1024)
    assert not serve(symmetric, 1024) and not serve(alibi, 1024, torch.float16)
    assert not serve(txl, 255) and serve(txl, 256)
    # Sandwich's 128 channels never measured faster on CPU; on CUDA every form with channels serves.
    sandwich = posenc.build("sandwich", num_heads=4)
    assert not serve(sandwich, 2**14)
    assert channels_from_keys(sandwich, torch.device("cuda")) == 0 and channels_from_keys(alibi, torch.device("cuda")) == 0
    # float32: the largest slope (1/4 for 4 heads) times the span at most 2^9, so 2049 keys but not 2050;
    # the bound depends on distances, not on how far from 0 they are.
    assert serve(alibi, 2049) and not serve(alibi, 2050)
    assert serve(alibi, 2049, start=2**20, contiguous=False) and not serve(alibi, 2050, start=2**20, contiguous=False)
    # bfloat16 splits key offsets into two exact channels: up to 2^16 − 1 apart; float64 beyond.
    assert serve(alibi, 2**16, torch.bfloat16) and not serve(alibi, 2**16 + 1, torch.bfloat16)
    assert serve(alibi, 2**16 + 1, torch.float64)


def test_float32_past_the_bound_falls_back_to_the_bias(channels, spy):
    enc = posenc.build("alibi", num_heads=4)
    q, k, v = (t.detach().float() for t in tensors(batch=1, q_len=2, k_len=2))
    for positions, served in (([0, 2049], False), ([1, 2049], True)):  # 1/4 × 2049 > 2^9 >= 1/4 × 2048
        spy.clear()
        posenc.attention(q, k, v, enc, backend="sdpa", q_positions=torch.tensor(positions),
                         k_positions=torch.tensor(positions))
        assert bool(spy) == served


@pytest.mark.parametrize("name", ["alibi", "transformer_xl"])
def test_models_output_is_unchanged_by_the_channel_form(name, monkeypatch):
    from posenc.lm.model import LanguageModel, ModelConfig

    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(encoding=name, dim=32, num_heads=4, num_layers=2, max_positions=64))
    tokens = torch.randint(0, 256, (2, 40))
    reference = model(tokens)
    monkeypatch.setattr(type(model.encoding), "cpu_channels_from_keys", 0)
    torch.testing.assert_close(model(tokens), reference, rtol=0, atol=1e-4)
