"""M-RoPE, 2-D axial RoPE and RoPE-Mixed: equal to transformers 5.23's Qwen2-VL / Qwen3-VL rotary
embeddings on random inputs and to a float64 per-pair oracle; position-id builders equal
transformers' ``get_rope_index``."""

import math

import pytest
import torch
import transformers
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl

import posenc

HEAD_DIM, SECTION = 16, [2, 3, 3]
TEXT = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1, intermediate_size=64,
            vocab_size=100)


def qk(tokens=7, generator_seed=0):
    g = torch.Generator().manual_seed(generator_seed)
    return torch.randn(2, 4, tokens, HEAD_DIM, generator=g), torch.randn(2, 2, tokens, HEAD_DIM, generator=g)


def assert_rotations_equal(ours, q, k, cos, sin, apply=qwen2_vl.apply_rotary_pos_emb):
    want_q, want_k = apply(q, k, cos, sin)
    torch.testing.assert_close(ours[0], want_q, rtol=0, atol=2e-5)  # transformers forms angles in float32
    torch.testing.assert_close(ours[1], want_k, rtol=0, atol=2e-5)


@pytest.mark.parametrize("theta", [10000.0, 1e6])
def test_mrope_sections_equal_qwen2_vl(theta):
    config = transformers.Qwen2VLTextConfig(**TEXT, rope_parameters={"rope_type": "default", "rope_theta": theta,
                                                                    "mrope_section": SECTION})
    positions = torch.randint(0, 500, (3, 2, 7), generator=torch.Generator().manual_seed(1))
    cos, sin = qwen2_vl.Qwen2VLRotaryEmbedding(config)(torch.zeros(1), positions)
    q, k = qk()
    ours = posenc.build("mrope", head_dim=HEAD_DIM, mrope_section=SECTION, base=theta).rotate(q, k, positions, positions)
    assert_rotations_equal(ours, q, k, cos, sin)


def test_interleaved_mrope_equals_qwen3_vl():
    config = transformers.Qwen3VLTextConfig(**TEXT, head_dim=HEAD_DIM, rope_parameters={
        "rope_type": "default", "rope_theta": 5e5, "mrope_section": SECTION, "mrope_interleaved": True})
    positions = torch.randint(0, 500, (3, 2, 7), generator=torch.Generator().manual_seed(2))
    cos, sin = qwen3_vl.Qwen3VLTextRotaryEmbedding(config)(torch.zeros(1), positions)
    q, k = qk()
    mrope = posenc.build("mrope", head_dim=HEAD_DIM, mrope_section=SECTION, base=5e5, interleaved=True)
    assert_rotations_equal(mrope.rotate(q, k, positions, positions), q, k, cos, sin)
    assert mrope.axis_of_pair().tolist() == [0, 1, 2, 0, 1, 2, 0, 1]


def test_mrope_on_text_is_plain_rope_and_rotates_each_pair_by_its_axis():
    q, k = qk(tokens=5)
    text = torch.arange(40, 45)[None]
    mrope = posenc.build("mrope", head_dim=HEAD_DIM, mrope_section=SECTION)
    plain = posenc.build("rope", head_dim=HEAD_DIM)
    for got, want in zip(mrope.rotate(q, k, text, text), plain.rotate(q, k, text, text), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # float64 oracle: pair c turns by p_axis(c) · base^(−2c/Dh)
    positions = torch.tensor([[3, 9, 27], [1, 2, 4], [5, 0, 7]])[:, None, :]  # (3, 1, T)
    x = torch.randn(1, 1, 3, HEAD_DIM, dtype=torch.float64)
    turned, _ = mrope.rotate(x, x, positions, positions)
    half = HEAD_DIM // 2
    for t in range(3):
        for c in range(half):
            axis = 0 if c < 2 else 1 if c < 5 else 2
            angle = int(positions[axis, 0, t]) * float(mrope.axis_frequencies()[0, 0, c] + mrope.axis_frequencies()[1, 0, c]
                                                      + mrope.axis_frequencies()[2, 0, c])
            a, b = float(x[0, 0, t, c]), float(x[0, 0, t, c + half])
            assert float(turned[0, 0, t, c]) == pytest.approx(a * math.cos(angle) - b * math.sin(angle), abs=1e-12)
            assert float(turned[0, 0, t, c + half]) == pytest.approx(b * math.cos(angle) + a * math.sin(angle), abs=1e-12)


def test_axial_rope_equals_qwen2_vl_vision_tower():
    config = transformers.Qwen2VLVisionConfig(embed_dim=64, num_heads=4, depth=1, hidden_size=64)
    rows_columns = posenc.patch_positions(3, 5)  # (2, 15)
    cos, sin = qwen2_vl.Qwen2VLVisionRotaryEmbedding(config)(torch.zeros(1), rows_columns.T)  # it takes (N, 2)
    q, k = (torch.randn(15, 4, HEAD_DIM) for _ in range(2))  # (N, heads, Dh), the tower's layout
    want_q, want_k = qwen2_vl.apply_rotary_pos_emb_vision(q, k, cos, sin)
    axial = posenc.build("axial_rope", head_dim=HEAD_DIM)
    got_q, got_k = axial.rotate(q.transpose(0, 1)[None], k.transpose(0, 1)[None], rows_columns[:, None], rows_columns[:, None])
    torch.testing.assert_close(got_q[0].transpose(0, 1), want_q, rtol=0, atol=2e-5)
    torch.testing.assert_close(got_k[0].transpose(0, 1), want_k, rtol=0, atol=2e-5)


def test_axial_scores_depend_on_the_2d_offset_only():
    """Shifting every patch by the same (row, column) leaves q·k unchanged, for axial and mixed."""
    q, k = (torch.randn(1, 2, 12, HEAD_DIM, dtype=torch.float64) for _ in range(2))
    grid = posenc.patch_positions(3, 4)[:, None]  # (2, 1, 12)
    shifted = grid + torch.tensor([7, 11])[:, None, None]
    for enc in (posenc.build("axial_rope", head_dim=HEAD_DIM),
                posenc.build("axial_rope", head_dim=HEAD_DIM, mixed=True, num_heads=2).double()):
        a = enc.rotate(q, k, grid, grid)
        b = enc.rotate(q, k, shifted, shifted)
        torch.testing.assert_close(a[0] @ a[1].transpose(-1, -2), b[0] @ b[1].transpose(-1, -2), rtol=1e-10, atol=1e-10)


def test_rope_mixed_learns_its_frequencies_and_starts_at_rotated_axial_ones():
    torch.manual_seed(0)
    mixed = posenc.build("axial_rope", head_dim=HEAD_DIM, mixed=True, num_heads=3)
    freqs = mixed.mixed_frequencies.detach().double()  # (2, H, Dh/2)
    magnitude = posenc.build("axial_rope", head_dim=HEAD_DIM).axial_inv_freq().double()
    norms = freqs.pow(2).sum(0).sqrt()  # each pair's frequency vector keeps the axial magnitude
    torch.testing.assert_close(norms, torch.cat((magnitude, magnitude)).expand(3, -1), rtol=1e-6, atol=0)
    first, second = freqs[:, :, 0], freqs[:, :, HEAD_DIM // 4]  # the two halves are perpendicular
    assert (first * second).sum(0).abs().max() < 1e-6
    q, k = (torch.randn(1, 3, 6, HEAD_DIM) for _ in range(2))
    grid = posenc.patch_positions(2, 3)[:, None]
    turned_q, turned_k = mixed.rotate(q, k, grid, grid)
    (turned_q @ turned_k.transpose(-1, -2)).sum().backward()
    assert mixed.mixed_frequencies.grad is not None and mixed.mixed_frequencies.grad.abs().sum() > 0


def test_multimodal_positions_equal_transformers_get_rope_index():
    text = transformers.Qwen2VLTextConfig(**TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                  "mrope_section": SECTION})
    config = transformers.Qwen2VLConfig(text_config=text.to_dict(), image_token_id=99, video_token_id=98,
                                        vision_start_token_id=97, vision_config=dict(
                                            embed_dim=32, num_heads=2, depth=1, hidden_size=64, spatial_merge_size=2))
    model = transformers.Qwen2VLModel(config)
    segments = [3, (1, 4, 6), 2, (2, 2, 4), 4]
    tokens = [3, 6, 2, 4, 4]  # an image's tokens: frames · (height/2) · (width/2)
    types = torch.cat([torch.full((n,), 0 if isinstance(s, int) else 1) for s, n in zip(segments, tokens)])[None]
    ids = torch.where(types == 1, 99, 5)
    grids = torch.tensor([s for s in segments if not isinstance(s, int)])
    want, _ = model.get_rope_index(ids, types, image_grid_thw=grids)
    got = posenc.multimodal_positions(segments, spatial_merge_size=2)
    torch.testing.assert_close(got, want[:, 0])
    assert posenc.grid_positions(2, 2, 3, start=10).tolist() == [
        [10] * 6 + [11] * 6, [10, 10, 10, 11, 11, 11] * 2, [10, 11, 12] * 4]


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match=r"mrope_section must be 3 counts summing to head_dim/2 = 8"):
        posenc.build("mrope", head_dim=HEAD_DIM, mrope_section=[2, 2, 2])
    with pytest.raises(ValueError, match=r"positions must be \(T,\), \(B, T\) or \(3, B, T\)"):
        q, k = qk()
        posenc.build("mrope", head_dim=HEAD_DIM).rotate(q, k, torch.zeros(2, 1, 7, dtype=torch.long), torch.arange(7)[None])
    with pytest.raises(ValueError, match="head_dim must be a multiple of 4"):
        posenc.build("axial_rope", head_dim=6)
    with pytest.raises(ValueError, match="num_heads must be an integer"):
        posenc.build("axial_rope", head_dim=8, mixed=True)
    with pytest.raises(ValueError, match="must be multiples of spatial_merge_size=2"):
        posenc.multimodal_positions([2, (1, 3, 4)], spatial_merge_size=2)
    with pytest.raises(ValueError, match="segments holds ints"):
        posenc.multimodal_positions(["hello"])
