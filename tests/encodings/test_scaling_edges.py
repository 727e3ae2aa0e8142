"""RoPE's scalings, RoPE itself and the LongRoPE candidates at their edges: YaRN's ramp clamped at both ends and
of zero width (against transformers), the attention factors at factor 1, each validation at its bound with the
parameter it names, in-place rotation, partial heads in the interleaved layout, and a candidate RoPE used before
its rows are set."""

import math

import pytest
import torch

from posenc.encodings.rotary import RoPE, apply_rope
from posenc.encodings.scaling import layer_scalings, normalize_scaling, rope_frequencies, rotary_dim, yarn_ramp_bounds
from posenc.extension.longrope import CandidateRoPE, longrope_parameters, plain_frequencies
from tests.encodings.test_scaling import HEAD_DIM, transformers_frequencies


@pytest.mark.parametrize("original, beta_fast, beta_slow, truncate", [(10 ** 9, 32, 1, True), (8, 32, 1, True),
                                                                     (4096, 2, 2, False)])
def test_yarn_equals_transformers_where_its_ramp_is_clamped_or_has_no_width(original, beta_fast, beta_slow, truncate):
    params = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": original,
              "beta_fast": beta_fast, "beta_slow": beta_slow, "truncate": truncate}
    low, high = yarn_ramp_bounds(params, HEAD_DIM)
    assert (high == HEAD_DIM - 1) if original == 10 ** 9 else (low == 0) if original == 8 else (low == high)
    ours, factor = rope_frequencies(HEAD_DIM, params)
    theirs, their_factor = transformers_frequencies(params, None)
    assert torch.equal(ours, theirs.float()) and factor == pytest.approx(their_factor)


def test_attention_factors_of_ntk_longrope_at_factor_one_and_rotary_defaults():
    ntk = {"rope_type": "ntk", "factor": 2.0}
    assert rope_frequencies(16, ntk)[1] == 1.0
    at_one = longrope_parameters([1.0] * 8, factor=1.0, original=512)
    assert rope_frequencies(16, at_one)[1] == 1.0
    assert rope_frequencies(16, longrope_parameters([1.0] * 8, factor=4.0, original=512))[1] == pytest.approx(
        math.sqrt(1 + math.log(4) / math.log(512)))
    assert rotary_dim(64) == 64 and rotary_dim(64, 0.5) == 32 and rotary_dim(64, 0.5, "proportional") == 64
    assert torch.equal(plain_frequencies(16, 500.0), 1.0 / 500.0 ** (torch.arange(0, 16, 2).float() / 16))


def test_layer_scalings_fill_in_the_base_they_are_given():
    got = layer_scalings({"full_attention": {"rope_type": "default"}, "sliding_attention": None}, base=500.0)
    assert list(got) == ["full_attention"] and got["full_attention"]["rope_theta"] == 500.0
    assert layer_scalings({"rope_type": "default"}, base=700.0)["all"]["rope_theta"] == 700.0
    assert layer_scalings({"full_attention": {"rope_type": "default"}})["full_attention"]["rope_theta"] == 10000.0


@pytest.mark.parametrize("scaling, message", [
    ({"full_attention": {"rope_type": "default"}}, r"holds one scaling per layer type \(full_attention\); a RoPE takes "
                                                   r"one of them, e\.g\. scaling=rope_parameters\['full_attention'\] "
                                                   r"\(posenc\.layer_scalings splits them\)"),
    ({"rope_theta": 0.5}, r"^rope_theta must be a number > 1\.0, got 0\.5$"),
    ({"partial_rotary_factor": 0}, r"^partial_rotary_factor must be in \(0, 1\], got 0$"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0},
     r"^original_max_position_embeddings must be an integer >= 1, got 0$"),
    ({"rope_type": "longrope", "original_max_position_embeddings": 64, "short_factor": [1.0], "long_factor": [1.0]},
     r"^rope_type='longrope' needs 'factor' or 'max_position_embeddings' in the scaling dict$"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0,
      "original_max_position_embeddings": 64}, r"^llama3 scaling needs high_freq_factor > low_freq_factor$"),
])
def test_each_refusal_names_what_is_wrong(scaling, message):
    with pytest.raises(ValueError, match=message):
        normalize_scaling(scaling)


def test_the_edges_that_are_accepted_and_the_sizes_that_are_not():
    assert normalize_scaling({"rope_theta": 1.5})["rope_theta"] == 1.5
    assert rope_frequencies(2)[0].shape == (1,)  # the smallest rotary dim
    assert rope_frequencies(4, {"rope_type": "ntk", "factor": 2.0})[0].shape == (2,)
    with pytest.raises(ValueError, match=r"^rope_type='dynamic' needs a rotary dim > 2 \(its exponent is d/\(d-2\)\), "
                                         r"got 2$"):
        rope_frequencies(2, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8})
    with pytest.raises(ValueError, match="^head_dim must be an integer >= 1, got 0$"):
        rope_frequencies(0)
    with pytest.raises(ValueError, match="^seq_len must be an integer >= 1, got 0$"):
        rope_frequencies(8, seq_len=0)
    longrope = longrope_parameters([1.0] * 4, factor=2.0, original=8)
    with pytest.raises(ValueError, match="^long_factor must have dim/2 = 8 entries, got 4$"):
        rope_frequencies(16, longrope, seq_len=9)
    with pytest.raises(ValueError, match="^short_factor must have dim/2 = 8 entries, got 4$"):
        rope_frequencies(16, longrope, seq_len=8)


def test_rope_refuses_a_bad_layout_or_base_by_name_and_takes_a_base_between_one_and_two():
    with pytest.raises(ValueError, match=r"^layout must be one of \['half', 'interleaved'\], got 'pairs'$"):
        RoPE(8, layout="pairs")
    with pytest.raises(ValueError, match=r"^base must be a number > 1\.0, got 0\.5$"):
        RoPE(8, base=0.5)
    assert RoPE(8, base=1.5).scaling["rope_theta"] == 1.5


def test_apply_rope_defaults_to_the_half_layout_and_rotation_in_place_writes_the_inputs():
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    positions, inv_freq = torch.arange(5)[None], rope_frequencies(8)[0]
    assert torch.equal(apply_rope(x, positions, inv_freq), apply_rope(x, positions, inv_freq, layout="half"))
    assert not torch.equal(apply_rope(x, positions, inv_freq), apply_rope(x, positions, inv_freq, layout="interleaved"))
    rope = RoPE(8)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    want_q, want_k = rope.rotate(q, k, positions, positions)
    at = rope.at(positions, positions)
    q_in, k_in = q.clone(), k.clone()
    got_q, got_k = rope.rotate_positioned(at, q_in, k_in, in_place=True)
    torch.testing.assert_close(q_in, want_q)  # the inputs themselves hold the rotation
    torch.testing.assert_close(k_in, want_k)
    assert got_q.data_ptr() == q_in.data_ptr()


def test_rotary_heads_rotate_in_the_interleaved_layout_and_bound_the_heads():
    q, k = torch.randn(1, 4, 6, 8, dtype=torch.float64), torch.randn(1, 2, 6, 8, dtype=torch.float64)
    positions = torch.arange(6)[None]
    some = RoPE(8, layout="interleaved", rotary_heads=2)
    full = RoPE(8, layout="interleaved")
    got_q, got_k = some.rotate(q, k, positions, positions)
    want_q, want_k = full.rotate(q, k, positions, positions)
    torch.testing.assert_close(got_q[:, :2], want_q[:, :2])
    torch.testing.assert_close(got_q[:, 2:], q[:, 2:])  # the NoPE heads
    torch.testing.assert_close(got_k[:, :1], want_k[:, :1])
    with pytest.raises(ValueError, match=r"multiple of the query heads per key head \(2\) under GQA"):
        RoPE(8, rotary_heads=3).rotate(q, k, positions, positions)


def test_a_candidate_rope_must_be_given_its_rows_and_uses_the_longrope_factor_past_the_context():
    from posenc.extension.search import Candidate

    rope = CandidateRoPE(8, factor=4.0, original=64)
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
    assert rope.row_factors is None and rope.row_n_hat is None
    q = torch.randn(1, 1, 5, 8)
    positions = torch.arange(5)[None]
    with pytest.raises(ValueError, match=r"^CandidateRoPE\.use\(candidates\) must be called before a forward pass$"):
        rope.rotate(q, q, positions, positions)
    rope.use([Candidate((1.0, 2.0, 3.0, 4.0), 0)])
    assert rope.row_factors.dtype == torch.float32 and rope.row_n_hat.dtype == torch.int64
    with pytest.raises(ValueError, match=r"^CandidateRoPE scores whole windows: queries and keys must share "
                                         r"positions$"):
        rope.rotate(q, q, positions, positions.clone())


def test_the_candidates_and_their_rope_follow_the_models_base():
    from posenc.extension.longrope import method_factors, seed_candidates

    seeds = seed_candidates(16, 4.0, 64, base=100.0)
    assert [c.factors for c in seeds] == [method_factors(m, 16, 4.0, 64, 100.0) for m in ("pi", "ntk", "yarn")]
    assert seeds[2].factors != method_factors("yarn", 16, 4.0, 64)  # YaRN's ramp moves with the base
    rope = CandidateRoPE(16, factor=4.0, original=64, base=100.0)
    assert rope.scaling["rope_theta"] == 100.0
    rope.use([seeds[2]])
    q = torch.randn(1, 1, 80, 16, dtype=torch.float64)
    positions = torch.arange(80)[None]
    exported = RoPE(16, scaling=longrope_parameters(seeds[2].factors, factor=4.0, original=64, base=100.0))
    torch.testing.assert_close(rope.rotate(q, q, positions, positions)[0],
                               exported.rotate(q, q, positions, positions)[0])  # past 64: the long factors
