"""

RoPE's documented math dtype, its memo per dtype, every head rotating, and its repr: what the rotary tests left
unpinned. A float32 input rotates in float32 (the speed the kernels are built for), a float64 input in float64 (the
oracle's precision at position 2^20), and one positioned object serves both without handing one the other's
tables.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_rotate
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rotate

import posenc
from posenc.encodings import apply_rope
from posenc.encodings.rotary import RoPE
from posenc.kernels import rope_cos_sin, rotate_pairs as kernel_rotate_pairs
from tests.oracles import naive_attention, rotate_pairs


def rope(head_dim=8, **kwargs):
    return posenc.build("rope", head_dim=head_dim, **kwargs)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_rotation_matches_explicit_2x2_matrices(layout, partial):
    head_dim = 8
    inv_freq, _ = posenc.rope_frequencies(head_dim, {"partial_rotary_factor": partial})
    x = torch.randn(1, 1, 6, head_dim, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 5, 77, 1000, 2**20 - 1]])
    got = apply_rope(x, positions, inv_freq, layout=layout)[0, 0]
    expected = rotate_pairs(x[0, 0], positions[0].tolist(), inv_freq.double().tolist(), layout)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_half_layout_matches_transformers_apply_rotary_pos_emb():
    head_dim = 16
    enc = rope(head_dim)
    q, k = torch.randn(2, 3, 10, head_dim), torch.randn(2, 3, 10, head_dim)
    positions = torch.arange(5, 15).expand(2, -1)
    inv_freq, _ = posenc.rope_frequencies(head_dim)
    freqs = positions[..., None].float() * inv_freq  # (B, T, F), as LlamaRotaryEmbedding does
    emb = torch.cat((freqs, freqs), dim=-1)
    q_ref, k_ref = llama_rotate(q, k, emb.cos(), emb.sin())
    q_ours, k_ours = enc.rotate(q, k, positions, positions)
    torch.testing.assert_close(q_ours, q_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_ours, k_ref, rtol=1e-5, atol=1e-5)


def test_interleaved_layout_matches_gptj():
    head_dim = 16
    enc = rope(head_dim, layout="interleaved")
    x = torch.randn(2, 10, 3, head_dim)  # GPT-J's (B, T, H, Dh)
    positions = torch.arange(10).expand(2, -1)
    table = create_sinusoidal_positions(32, head_dim)[positions]  # (B, T, Dh): [sin | cos]
    sin, cos = torch.split(table, head_dim // 2, dim=-1)
    expected = gptj_rotate(x, sin, cos).transpose(1, 2)
    ours, _ = enc.rotate(x.transpose(1, 2), x.transpose(1, 2), positions, positions)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    shift=st.integers(0, 2**20),
    layout=st.sampled_from(["half", "interleaved"]),
    rope_type=st.sampled_from(["default", "linear", "ntk", "yarn", "llama3"]),
)
def test_scores_depend_only_on_offsets(shift, layout, rope_type):
    scaling = {"rope_type": rope_type}
    if rope_type != "default":
        scaling.update(factor=4.0, original_max_position_embeddings=64)
    if rope_type == "llama3":
        scaling.update(low_freq_factor=1.0, high_freq_factor=4.0)
    enc = rope(8, layout=layout, scaling=scaling)
    q, k = torch.randn(1, 2, 5, 8, dtype=torch.float64), torch.randn(1, 2, 5, 8, dtype=torch.float64)
    pos = torch.tensor([[0, 3, 4, 9, 20]])
    q0, k0 = enc.rotate(q, k, pos, pos)
    q1, k1 = enc.rotate(q, k, pos + shift, pos + shift)
    torch.testing.assert_close(q1 @ k1.transpose(-1, -2), q0 @ k0.transpose(-1, -2), rtol=0, atol=1e-9)


def test_norms_preserved_and_position_zero_is_identity():
    x = torch.randn(2, 2, 7, 8, dtype=torch.float64)
    enc = rope(8)
    rotated, _ = enc.rotate(x, x, torch.arange(100, 107).unsqueeze(0), torch.arange(7).unsqueeze(0))
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)
    same, _ = enc.rotate(x, x, torch.zeros(1, 7, dtype=torch.long), torch.zeros(1, 7, dtype=torch.long))
    assert torch.equal(same, x)


def test_interleaved_is_a_fixed_permutation_of_half():
    head_dim = 8
    pairs = head_dim // 2
    # channel 2i (interleaved) <-> channel i (half); 2i+1 <-> i + F
    perm = torch.tensor([c for i in range(pairs) for c in (i, i + pairs)])
    x = torch.randn(1, 1, 9, head_dim, dtype=torch.float64)
    pos = torch.arange(3, 12).unsqueeze(0)
    half, _ = rope(head_dim).rotate(x, x, pos, pos)
    inter, _ = rope(head_dim, layout="interleaved").rotate(x[..., perm], x, pos, pos)
    torch.testing.assert_close(inter, half[..., perm], rtol=0, atol=1e-12)


def test_attention_factor_scales_cos_and_sin():
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    enc = rope(8, scaling=scaling)
    _, factor = enc.frequencies()
    x = torch.randn(1, 1, 3, 8, dtype=torch.float64)
    rotated, _ = enc.rotate(x, x, torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    torch.testing.assert_close(rotated, x * factor)


def test_inv_freq_is_never_cast_by_module_to_bfloat16():
    enc = rope(64).to(torch.bfloat16)
    inv_freq, _ = enc.frequencies()
    assert inv_freq.dtype == torch.float32
    torch.testing.assert_close(inv_freq, posenc.rope_frequencies(64)[0], rtol=0, atol=0)


def test_bfloat16_attention_at_position_2_pow_20_matches_float64_oracle():
    head_dim, t = 32, 8
    enc = rope(head_dim).to(torch.bfloat16)
    q, k, v = (torch.randn(1, 1, t, head_dim, dtype=torch.float64) for _ in range(3))
    positions = torch.arange(2**20 - t, 2**20).unsqueeze(0)
    out = posenc.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), enc, q_positions=positions, k_positions=positions)
    inv_freq = posenc.rope_frequencies(head_dim)[0].double().tolist()
    qr = rotate_pairs(q[0, 0], positions[0].tolist(), inv_freq, "half")
    kr = rotate_pairs(k[0, 0], positions[0].tolist(), inv_freq, "half")
    allowed = [[j <= i for j in range(t)] for i in range(t)]
    expected = naive_attention(qr, kr, v[0, 0], allowed=allowed)
    assert (out[0, 0].double() - expected).abs().max() < 5e-2


def test_dynamic_rope_uses_one_length_for_queries_and_keys():
    scaling = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 16}
    enc = rope(8, scaling=scaling)
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 40, 8, dtype=torch.float64)
    q_rot, k_rot = enc.rotate(q, k, torch.tensor([[39]]), torch.arange(40).unsqueeze(0))
    inv_freq, _ = posenc.rope_frequencies(8, scaling, seq_len=40)
    torch.testing.assert_close(q_rot, apply_rope(q, torch.tensor([[39]]), inv_freq))
    torch.testing.assert_close(k_rot, apply_rope(k, torch.arange(40).unsqueeze(0), inv_freq))


@pytest.mark.parametrize("scaling", [
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 16},
    {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 32,
     "short_factor": [1.0] * 8, "long_factor": [1.0 + i / 2 for i in range(8)]},
    {"rope_type": "dynamic", "factor": 2.0},
], ids=lambda s: s["rope_type"])
def test_rotation_equals_transformers_llama_rotary_embedding_module(scaling):
    """The whole HF path (LlamaRotaryEmbedding incl. attention scaling and dynamic/longrope
    updates from position_ids) against posenc's RoPE built from the same dict."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    head_dim, seq = 16, 100
    max_positions = 64 if scaling["rope_type"] in ("llama3", "longrope") else 32
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=head_dim, max_position_embeddings=max_positions,
                         rope_parameters={"rope_theta": 10000.0, **scaling})
    hf_rope = LlamaRotaryEmbedding(config)
    positions = torch.arange(seq).unsqueeze(0)
    q = torch.randn(1, 4, seq, head_dim)
    cos, sin = hf_rope(q, positions)
    expected, _ = llama_rotate(q, q, cos, sin)
    ours_scaling = dict(scaling)
    if scaling["rope_type"] == "dynamic":
        ours_scaling["original_max_position_embeddings"] = max_positions
    got, _ = rope(head_dim, scaling=ours_scaling).rotate(q, q, positions, positions)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_base_beside_a_different_rope_theta_is_refused_and_an_equal_one_is_not():
    with pytest.raises(ValueError, match=r"base=1000000.0 and scaling\['rope_theta'\]=10000.0 disagree"):
        posenc.build("rope", head_dim=8, base=1e6, scaling={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                                          "original_max_position_embeddings": 16})
    same = posenc.build("rope", head_dim=8, base=1e6, scaling={"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0})
    assert posenc.build("rope", head_dim=8, base=1e6).scaling["rope_theta"] == same.scaling["rope_theta"] == 1e6
    assert posenc.build("rope", head_dim=8).scaling["rope_theta"] == 10000.0


FAR = 2**20


def _inputs(dtype, heads=2, kv_heads=2):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, 12, 16, generator=generator, dtype=torch.float64).to(dtype)
    k = torch.randn(1, kv_heads, 12, 16, generator=generator, dtype=torch.float64).to(dtype)
    positions = torch.arange(FAR, FAR + 12)[None]
    return q, k, positions


def _by_math(x, positions, inv_freq, math):
    return kernel_rotate_pairs(x, *rope_cos_sin(positions, inv_freq, 1.0, math))


def test_a_float32_input_rotates_in_float32_math_and_a_float64_one_in_float64():
    rope = RoPE(16)
    inv_freq, _ = rope.frequencies()
    q32, k32, positions = _inputs(torch.float32)
    in_float32 = _by_math(q32, positions, inv_freq, torch.float32)
    assert not torch.equal(_by_math(q32, positions, inv_freq, torch.float64), in_float32)  # the math shows
    assert torch.equal(apply_rope(q32, positions, inv_freq), in_float32)
    assert torch.equal(rope.rotate(q32, k32, positions, positions)[0], in_float32)
    keys_elsewhere = rope.rotate(q32, k32, positions, positions + 5)[1]  # keys' own tables, also float32 math
    assert torch.equal(keys_elsewhere, _by_math(k32, positions + 5, inv_freq, torch.float32))
    q64, _, _ = _inputs(torch.float64)
    assert torch.equal(apply_rope(q64, positions, inv_freq), _by_math(q64, positions, inv_freq, torch.float64))


def test_one_positioned_object_keeps_separate_tables_per_math_dtype():
    """A float32 pass first, then a float64 pass on the same positions: the second must not reuse the first's
    float32 tables (at 2^20 their rounding, ~1e-7, is far above float64's)."""
    rope = RoPE(16)
    inv_freq, _ = rope.frequencies()
    q32, k32, positions = _inputs(torch.float32)
    q64, k64, _ = _inputs(torch.float64)
    at = rope.at(positions, positions + 3)
    rope.rotate_positioned(at, q32, k32)
    q_rotated, k_rotated = rope.rotate_positioned(at, q64, k64)
    torch.testing.assert_close(q_rotated, _by_math(q64, positions, inv_freq, torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(k_rotated, _by_math(k64, positions + 3, inv_freq, torch.float64), rtol=0, atol=1e-12)
    assert rope.rotate_positioned(at, q32, k32)[0].dtype == torch.float32


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_rotary_heads_equal_to_every_head_is_plain_rope(kv_heads):
    q, k, positions = _inputs(torch.float64, heads=4, kv_heads=kv_heads)
    every = RoPE(16, rotary_heads=4).rotate(q, k, positions, positions)
    plain = RoPE(16).rotate(q, k, positions, positions)
    for got, want in zip(every, plain):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_repr_names_rotary_heads_only_when_some_heads_are_nope():
    scaling = "{'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 1.0}"
    assert repr(RoPE(8)) == f"RoPE(head_dim=8, layout='half', scaling={scaling})"
    assert repr(RoPE(8, rotary_heads=2)) == f"RoPE(head_dim=8, layout='half', scaling={scaling}, rotary_heads=2)"
