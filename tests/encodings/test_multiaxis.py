"""M-RoPE, 2-D axial RoPE and RoPE-Mixed: equal to transformers 5.23's Qwen2-VL / Qwen3-VL rotary
embeddings on random inputs and to a float64 per-pair oracle; position-id builders equal
transformers' ``get_rope_index``.

M-RoPE and 2-D RoPE where mutation testing found no test: position shapes, dtypes, the default and zero-width
sections, Qwen3-VL's interleave at its real sections, RoPE-Mixed's initial angles, attention() with these
encodings, and every constructor bound with its parameter's name.
"""

import math

import pytest
import torch
import transformers
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl
import torch.nn.functional as F

import posenc
from posenc.kernels import rotate_pairs
from posenc.encodings.multiaxis import AxialRoPE, MRoPE


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


HEAD_DIM = 16


def one_sequence_qk(tokens=6, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 2, tokens, HEAD_DIM, generator=g).to(dtype),
            torch.randn(1, 2, tokens, HEAD_DIM, generator=g).to(dtype))


@pytest.mark.parametrize("encoding", [MRoPE(HEAD_DIM, (2, 3, 3)), AxialRoPE(HEAD_DIM)], ids=["mrope", "axial"])
def test_positions_of_shape_t_equal_shape_1_t(encoding):
    q, k = one_sequence_qk()
    positions = torch.tensor([3, 1, 4, 1, 5, 9])
    for got, want in zip(encoding.rotate(q, k, positions, positions), encoding.rotate(q, k, positions[None], positions[None])):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("encoding, name", [(MRoPE(HEAD_DIM, (2, 3, 3)), "MRoPE"), (AxialRoPE(HEAD_DIM), "AxialRoPE")])
def test_a_wrong_axis_count_names_the_class(encoding, name):
    q, k = one_sequence_qk()
    with pytest.raises(ValueError, match=rf"\({encoding.axes}, B, T\) for {name}, got \(5, 1, 6\)"):
        encoding.rotate(q, k, torch.zeros(5, 1, 6, dtype=torch.long), torch.zeros(5, 1, 6, dtype=torch.long))


def test_tables_come_in_the_dtype_asked_for():
    positions = torch.arange(6)[None]
    for encoding in (MRoPE(HEAD_DIM, (2, 3, 3)), AxialRoPE(HEAD_DIM)):
        for dtype in (torch.float32, torch.float64):
            cos, sin = encoding.tables(positions, dtype)
            assert cos.dtype == sin.dtype == dtype


@pytest.mark.parametrize("mixed", [False, True])
def test_low_precision_inputs_come_back_in_their_dtype_and_close_to_float64(mixed):
    torch.manual_seed(0)
    encoding = AxialRoPE(HEAD_DIM, mixed=mixed, num_heads=2 if mixed else None)
    q, k = one_sequence_qk(dtype=torch.bfloat16)
    grid = posenc.patch_positions(2, 3)[:, None]
    got_q, got_k = encoding.rotate(q, k, grid, grid)
    assert got_q.dtype == got_k.dtype == torch.bfloat16
    want_q, _ = encoding.double().rotate(q.double(), k.double(), grid, grid)
    torch.testing.assert_close(got_q.double(), want_q, rtol=0, atol=0.05)


def test_attention_with_a_multiaxis_encoding_rotates_q_and_k_at_their_own_positions():
    """attention() takes M-RoPE with 1-D positions (text): it must rotate q at q's positions and k at k's, as a
    KV-cache step asks (one query at 9 against keys 0..9)."""
    mrope = MRoPE(HEAD_DIM, (2, 3, 3))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, t, HEAD_DIM, generator=g, dtype=torch.float64) for t in (1, 10, 10))
    q_pos, k_pos = torch.tensor([[9]]), torch.arange(10)[None]
    got = posenc.attention(q, k, v, mrope, q_positions=q_pos, k_positions=k_pos)
    rq, rk = mrope.rotate(q, k, q_pos, k_pos)
    want = F.scaled_dot_product_attention(rq, rk, v)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("head_dim, sections", [(128, (16, 24, 24)), (64, (8, 12, 12)), (16, (2, 3, 3))])
def test_the_default_sections_keep_qwen2_vl_proportions(head_dim, sections):
    assert MRoPE(head_dim).mrope_section == sections


def test_a_zero_width_section_is_allowed_and_its_axis_turns_nothing():
    mrope = MRoPE(HEAD_DIM, (0, 4, 4))
    assert mrope.axis_of_pair().tolist() == [1] * 4 + [2] * 4
    q, k = one_sequence_qk(tokens=3)
    temporal_only = torch.stack((torch.arange(3), torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long)))
    got_q, _ = mrope.rotate(q, k, temporal_only[:, None], temporal_only[:, None])
    torch.testing.assert_close(got_q, q, rtol=0, atol=0)  # no pair follows the temporal axis


def test_interleaved_mrope_equals_qwen3_vl_at_its_real_sections():
    """Qwen3-VL: head_dim 128, mrope_section [24, 20, 20]; height takes pairs 1, 4, …, 58 and width 2, 5, …, 59,
    so pairs 61 and 62 follow time, as the first 3·20 pairs end there."""
    text = dict(hidden_size=256, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1,
                intermediate_size=64, vocab_size=100, head_dim=128)
    config = transformers.Qwen3VLTextConfig(**text, rope_parameters={
        "rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20], "mrope_interleaved": True})
    positions = torch.randint(0, 900, (3, 1, 5), generator=torch.Generator().manual_seed(4))
    cos, sin = qwen3_vl.Qwen3VLTextRotaryEmbedding(config)(torch.zeros(1), positions)
    q, k = (torch.randn(1, 2, 5, 128, generator=torch.Generator().manual_seed(s)) for s in (5, 6))
    mrope = MRoPE(128, (24, 20, 20), base=5e6, interleaved=True)
    axis = mrope.axis_of_pair().tolist()
    assert axis[58:64] == [1, 2, 0, 0, 0, 0]
    want_q, want_k = qwen3_vl.apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = mrope.rotate(q, k, positions, positions)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=2e-4)  # angles up to ~900 rad, formed in float32 there
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=2e-4)


def test_rope_mixed_starts_at_a_uniform_angle_per_head_and_a_perpendicular_second_half():
    """RoPE-Mixed's init (Heo et al. 2024): per head an angle θ ~ U[0, 2π) drawn in float64; the first half of the
    pairs points along θ, the second along θ + π/2, each with its axial magnitude."""
    heads = 4096
    torch.manual_seed(7)
    angle = torch.rand(heads, 1, dtype=torch.float64) * 2 * math.pi
    torch.manual_seed(7)
    freqs = AxialRoPE(HEAD_DIM, mixed=True, num_heads=heads).mixed_frequencies.detach().double()  # (2, H, Dh/2)
    quarter = HEAD_DIM // 4
    first = torch.atan2(freqs[1, :, 0], freqs[0, :, 0]) % (2 * math.pi)
    second = torch.atan2(freqs[1, :, quarter], freqs[0, :, quarter]) % (2 * math.pi)
    torch.testing.assert_close(first, angle[:, 0].float().double(), rtol=0, atol=1e-6)
    torch.testing.assert_close((second - first) % (2 * math.pi), torch.full((heads,), math.pi / 2, dtype=torch.float64),
                               rtol=0, atol=1e-5)
    quadrants = torch.bincount((first // (math.pi / 2)).long(), minlength=4) / heads
    assert quadrants.sub(0.25).abs().max() < 0.03


def test_repr_names_every_setting():
    assert repr(MRoPE(HEAD_DIM, (2, 3, 3), base=500.0, interleaved=True)) == (
        "MRoPE(head_dim=16, mrope_section=[2, 3, 3], base=500.0, interleaved=True)")
    assert repr(AxialRoPE(HEAD_DIM, base=100.0)) == "AxialRoPE(head_dim=16, base=100.0, mixed=False)"


@pytest.mark.parametrize("build, message", [
    (lambda: MRoPE(15), "head_dim must be an even integer >= 2, got 15"),
    (lambda: MRoPE(HEAD_DIM, (-1, 5, 4)), "mrope_section must be an integer >= 0, got -1"),
    (lambda: MRoPE(HEAD_DIM, (2, 2, 2)), r"summing to head_dim/2 = 8, got \[2, 2, 2\]"),
    (lambda: MRoPE(HEAD_DIM, (2, 3, 3), base=1.0), r"base must be a finite number > 1.0, got 1.0"),
    (lambda: MRoPE(HEAD_DIM, (2, 3, 3), base=0.5), r"base must be a finite number > 1.0, got 0.5"),
    (lambda: AxialRoPE(0), "head_dim must be an integer >= 1, got 0"),
    (lambda: AxialRoPE(HEAD_DIM, base=1.0), r"base must be a finite number > 1.0, got 1.0"),
    (lambda: AxialRoPE(HEAD_DIM, base=0.5), r"base must be a finite number > 1.0, got 0.5"),
])
def test_constructor_bounds_name_the_parameter(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_bases_just_above_one_are_accepted():
    assert MRoPE(HEAD_DIM, (2, 3, 3), base=1.5).base == 1.5 and AxialRoPE(HEAD_DIM, base=1.5).base == 1.5


def test_an_unknown_pair_layout_is_refused_by_name():
    x = torch.randn(1, 1, 2, 4)
    cos, sin = torch.ones(1, 1, 2, 2), torch.zeros(1, 1, 2, 2)
    for layout in ("HALF", "XXhalfXX", None):
        with pytest.raises(ValueError, match="layout must be one of half, interleaved"):
            rotate_pairs(x, cos, sin, layout)
