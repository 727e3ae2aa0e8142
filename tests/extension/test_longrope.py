import pytest
import torch

import posenc
from posenc.extension.longrope import (CandidateRoPE, default_max_factor, lm_objective, longrope_parameters,
                                         method_factors, seed_candidates)
from posenc.extension.search import Candidate
from posenc.lm.model import LanguageModel, ModelConfig
from tests.encodings.test_scaling import HEAD_DIM, transformers_frequencies

FACTORS = tuple(1.0 + 3.0 * (i / (HEAD_DIM // 2 - 1)) ** 2 for i in range(HEAD_DIM // 2))


@pytest.mark.parametrize("seq_len", [1000, 2048, 3000, 8192])
def test_export_equals_transformers_longrope_bit_for_bit(seq_len):
    params = longrope_parameters(FACTORS, factor=4.0, original=2048)
    theirs, their_factor = transformers_frequencies(params, seq_len)
    ours, our_factor = posenc.rope_frequencies(HEAD_DIM, params, seq_len=seq_len)
    assert torch.equal(ours, theirs)
    assert our_factor == pytest.approx(their_factor, rel=1e-12)
    expected = FACTORS if seq_len > 2048 else (1.0,) * len(FACTORS)  # short factors: plain RoPE inside the context
    torch.testing.assert_close(ours, posenc.rope_frequencies(HEAD_DIM)[0] / torch.tensor(expected), rtol=1e-6, atol=0)


def test_method_factors_are_each_methods_frequencies():
    plain = posenc.rope_frequencies(HEAD_DIM)[0].double()
    pi, ntk, yarn = (torch.tensor(method_factors(m, HEAD_DIM, 8.0, 64), dtype=torch.float64)
                     for m in ("pi", "ntk", "yarn"))
    assert torch.allclose(pi, torch.full_like(pi, 8.0), atol=1e-6)
    assert ntk[0] == 1.0 and torch.all(ntk[1:] >= ntk[:-1]) and ntk[-1] == pytest.approx(8.0, rel=1e-5)
    yarn_freq, _ = posenc.rope_frequencies(HEAD_DIM, {"rope_type": "yarn", "factor": 8.0,
                                                      "original_max_position_embeddings": 64})
    torch.testing.assert_close(plain / yarn, yarn_freq.double(), rtol=1e-6, atol=0)
    assert [c.factors for c in seed_candidates(HEAD_DIM, 8.0, 64)] == [tuple(pi.tolist()), tuple(ntk.tolist()),
                                                                        tuple(yarn.tolist())]


def _rotated(encoding, positions, q, k):
    at = encoding.at(positions, positions, seq_len=positions.shape[-1])
    return at.rotate(q.clone(), k.clone())


def test_candidate_rows_rotate_as_the_exported_config_and_n_hat_keeps_early_positions():
    dim, original, length = 16, 32, 96
    factors = (1.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.0, 3.5)
    q, k = torch.randn(3, 2, length, dim), torch.randn(3, 2, length, dim)
    positions = torch.arange(length)[None]
    candidates = [Candidate(factors, 0), Candidate(factors, 8), Candidate((3.0,) * 8, 0)]
    encoding = CandidateRoPE(dim, factor=3.0, original=original)
    encoding.use(candidates)
    q_rot, k_rot = _rotated(encoding, positions, q, k)
    for row, candidate in enumerate(candidates):
        exported = posenc.build("rope", head_dim=dim, scaling=longrope_parameters(candidate.factors, factor=3.0,
                                                                                 original=original))
        want_q, want_k = _rotated(exported, positions, q[row : row + 1], k[row : row + 1])
        n_hat = candidate.n_hat
        torch.testing.assert_close(q_rot[row, :, n_hat:], want_q[0, :, n_hat:], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(k_rot[row, :, n_hat:], want_k[0, :, n_hat:], rtol=1e-6, atol=1e-6)
        if n_hat:  # before n̂: the original frequencies, with the same attention factor
            plain = posenc.build("rope", head_dim=dim)
            plain_q, _ = _rotated(plain, positions, q[row : row + 1], k[row : row + 1])
            torch.testing.assert_close(q_rot[row, :, :n_hat], plain_q[0, :, :n_hat] * encoding.attention_factor,
                                       rtol=1e-6, atol=1e-6)
            assert not torch.allclose(q_rot[row, :, :n_hat], want_q[0, :, :n_hat])


def test_the_objective_scores_candidates_in_batches_as_it_would_one_by_one():
    """Each candidate's batched score is its own: within 1e-7 of it scored alone, and 10 times nearer it than any
    other candidate's. An untrained model's loss barely depends on the rotations (its candidates' scores differed by
    2e-7 of 5.56 at some seeds), so this one's tokens, attention and output are scaled up until they do."""
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(encoding="rope", dim=32, num_layers=1, num_heads=2, max_positions=16))
    with torch.no_grad():
        for weight, gain in ((model.embed.weight, 5.0), (model.blocks[0].qkv.weight, 3.0),
                             (model.blocks[0].attn_out.weight, 4.0)):
            weight.mul_(gain)
    windows = torch.randint(0, 256, (3, 65))
    candidates = [Candidate((8.0,) * 8), Candidate((1.0, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0), 4), Candidate((1.0,) * 8)]
    batched = lm_objective(model, windows, factor=4.0, original=16, batch_rows=4)(candidates)
    single = [lm_objective(model, windows, factor=4.0, original=16, batch_rows=1)([c])[0] for c in candidates]
    assert batched == pytest.approx(single, rel=1e-7)
    for i, score in enumerate(batched):
        nearest_other = min(abs(score - other) for j, other in enumerate(single) if j != i)
        assert abs(score - single[i]) * 10 < nearest_other, (i, batched, single)


def test_the_objective_needs_a_rope_model():
    model = LanguageModel(ModelConfig(encoding="alibi", dim=32, num_layers=1, num_heads=2))
    with pytest.raises(ValueError, match="needs a RoPE model, got ALiBi"):
        lm_objective(model, torch.zeros(1, 9, dtype=torch.long), factor=2.0, original=4)


def test_method_factors_follow_the_models_base_and_are_rounded_to_six_decimals():
    """YaRN's ramp reads each wavelength against the context, so its factors move with the base; every factor is
    rounded to 6 decimals (float32's own noise), then made non-decreasing."""
    for base in (10000.0, 500000.0):
        factors = method_factors("yarn", HEAD_DIM, 4.0, 256, base=base)
        plain = posenc.rope_frequencies(HEAD_DIM, {"rope_theta": base})[0].double()
        scaled = posenc.rope_frequencies(HEAD_DIM, {"rope_type": "yarn", "rope_theta": base, "factor": 4.0,
                                                    "original_max_position_embeddings": 256})[0].double()
        assert list(factors) == [round(r, 6) for r in (plain / scaled).tolist()], base
    assert method_factors("yarn", HEAD_DIM, 4.0, 256) != method_factors("yarn", HEAD_DIM, 4.0, 256, base=500000.0)


@pytest.mark.parametrize("factor, bound", [(2.0, 2.5), (1.5, 1.87), (1.3, 1.62), (4.0, 5.0)])
def test_the_default_bound_on_a_factor_is_the_papers_one_and_a_quarter_rounded_down(factor, bound):
    assert default_max_factor(factor) == bound
