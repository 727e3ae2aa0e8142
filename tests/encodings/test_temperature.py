"""Attention temperature: Llama 4's query scaling equals transformers' (its formula bit for bit in float32, and a
NoPE layer of a tiny random Llama 4 end to end), scalable softmax equals the paper's s·log n, any encoding takes
it, KV-cache decoding keeps it, and bad specs fail in one line."""

import math

import pytest
import torch

import posenc
from posenc.encodings.temperature import QueryTemperature
from posenc.lm.model import KVCache, LanguageModel, ModelConfig


def test_llama4_scale_is_transformers_formula_bit_for_bit():
    positions = torch.arange(0, 70_000, 7)
    ours = QueryTemperature("llama4", beta=0.1, floor=8192).scale(positions[None])[0]
    theirs = torch.log1p(torch.floor((positions.float() + 1.0) / 8192)) * 0.1 + 1.0  # modeling_llama4's expression
    assert torch.equal(ours, theirs)
    assert ours[positions < 8191].eq(1).all() and ours[-1] == pytest.approx(1 + 0.1 * math.log(1 + 69_994 // 8192))


def test_a_nope_layer_of_a_tiny_llama4_equals_attention_with_its_temperature():
    llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig

    torch.manual_seed(0)
    config = Llama4TextConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0], attn_temperature_tuning=True,
                              floor_scale=4, attn_scale=0.5, intermediate_size=64, intermediate_size_mlp=64,
                              vocab_size=100)
    config._attn_implementation = "eager"
    layer = llama4.Llama4TextAttention(config, 3).double()  # layer 3 has no RoPE: its queries are tempered
    assert not layer.use_rope
    length = 20
    x = torch.randn(2, length, 32, dtype=torch.float64)
    causal = torch.full((length, length), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        expected, _ = layer(x, position_embeddings=None, attention_mask=causal)
        q = layer.q_proj(x).view(2, length, 4, 8).transpose(1, 2)
        k, v = (p(x).view(2, length, 2, 8).transpose(1, 2) for p in (layer.k_proj, layer.v_proj))
        tempered = posenc.build("none", temperature={"kind": "llama4", "beta": 0.5, "floor": 4})
        got = layer.o_proj(posenc.attention(q, k, v, tempered).transpose(1, 2).reshape(2, length, 32))
        plain = layer.o_proj(posenc.attention(q, k, v).transpose(1, 2).reshape(2, length, 32))
    # transformers computes the factor in float32: agreement to its rounding, far closer than without it
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-7)
    assert (plain - expected).abs().max() > 1e-2


def test_log_n_is_the_papers_s_log_n_on_every_logit():
    q, k, v = (torch.randn(1, 2, 9, 4, dtype=torch.float64) for _ in range(3))
    got = posenc.attention(q, k, v, posenc.build("none", temperature={"kind": "log_n", "s": 0.7}))
    n = torch.arange(1, 10, dtype=torch.float64)[:, None]  # keys a causal query sees
    logits = 0.7 * torch.log(n) * (q @ k.transpose(-1, -2)) / 2
    expected = torch.softmax(logits.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf")), -1) @ v
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_any_encoding_takes_it_after_its_rotation():
    q, k, v = (torch.randn(1, 2, 12, 8, dtype=torch.float64) for _ in range(3))
    spec = {"kind": "llama4", "beta": 0.3, "floor": 3}
    rope, tempered = posenc.build("rope", head_dim=8), posenc.build("rope", head_dim=8, temperature=spec)
    positions = torch.arange(12)
    scale = QueryTemperature.from_dict(spec).scale(positions[None], torch.float64)[0]
    q_rot, k_rot = rope.at(positions, positions).rotate(q, k)
    expected = posenc.attention(q_rot * scale[:, None], k_rot, v)  # rotated, then scaled, then plain attention
    torch.testing.assert_close(posenc.attention(q, k, v, tempered), expected, rtol=1e-12, atol=1e-12)
    assert posenc.build("alibi", num_heads=2, temperature=spec).temperature == QueryTemperature("llama4", 0.3, 3)


def test_kv_cache_decoding_keeps_the_temperature_of_each_position():
    torch.manual_seed(0)
    config = ModelConfig(encoding="rope", encoding_kwargs={"temperature": {"kind": "llama4", "beta": 0.5, "floor": 3}},
                         dim=16, num_layers=2, num_heads=2)
    model = LanguageModel(config).double()
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        cache = KVCache(2)
        steps = torch.cat([model(tokens[:, t : t + 1], cache=cache) for t in range(12)], dim=1)
        torch.testing.assert_close(steps, model(tokens), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("spec, message", [
    ("llama4", "temperature must be a dict with a 'kind'"),
    ({"kind": "cubic"}, "temperature kind must be one of"),
    ({"kind": "log_n", "beta": 0.1}, r"temperature 'log_n' takes \['s'\], got unknown \['beta'\]"),
    ({"kind": "llama4", "floor": 0}, "temperature floor must be an integer >= 1, got 0"),
    ({"kind": "llama4", "beta": -0.1}, "temperature beta must be"),
    ({"kind": "log_n", "s": 0}, "temperature s must be"),
])
def test_bad_specs_are_one_line_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        posenc.build("none", temperature=spec)


def test_a_zero_beta_is_no_temperature_and_the_factor_keeps_q_in_its_dtype():
    positions = torch.arange(40)[None]
    flat = QueryTemperature.from_dict({"kind": "llama4", "beta": 0.0, "floor": 4})
    assert torch.equal(flat.scale(positions), torch.ones(1, 40))
    q = torch.randn(1, 2, 40, 8, dtype=torch.bfloat16)
    tempered = QueryTemperature("llama4", beta=0.5, floor=4).apply(q, positions)
    assert tempered.dtype == torch.bfloat16
    expected = q.float() * QueryTemperature("llama4", beta=0.5, floor=4).scale(positions)[:, None, :, None]
    torch.testing.assert_close(tempered.float(), expected, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match=r"a 'kind' \(llama4, log_n\), got \{'beta': 0.1\}"):
        posenc.build("none", temperature={"beta": 0.1})
