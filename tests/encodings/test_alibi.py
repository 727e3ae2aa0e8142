import math

import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

import posenc
from tests.oracles import paper_alibi_slopes


def test_eight_heads_are_powers_of_one_half():
    torch.testing.assert_close(posenc.alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)], dtype=torch.float64))


@pytest.mark.parametrize("heads", [1, 2, 3, 5, 6, 8, 12, 16, 20, 24, 32, 40, 64, 96])
def test_slopes_match_paper_bloom_and_mpt(heads):
    ours = posenc.alibi_slopes(heads)
    torch.testing.assert_close(ours, torch.tensor(paper_alibi_slopes(heads), dtype=torch.float64))
    # BLOOM: alibi[h, 0, t] = slope_h · t for an all-ones padding mask.
    bloom = build_alibi_tensor(torch.ones(1, 3, dtype=torch.long), heads, torch.float32)  # (H, 1, 3)
    torch.testing.assert_close(bloom[:, 0, 1], ours.float())
    # MPT: alibi[h, 0, -2] = -slope_h.
    mpt = build_mpt_alibi_tensor(heads, 2)  # (H, 1, 2)
    torch.testing.assert_close(-mpt[:, 0, 0], ours.float())


def test_causal_and_symmetric_bias():
    q_pos = torch.arange(4).unsqueeze(0)
    causal = posenc.build("alibi", num_heads=2).score_bias(q_pos, q_pos, torch.float64)[0]
    symmetric = posenc.build("alibi", num_heads=2, symmetric=True).score_bias(q_pos, q_pos, torch.float64)[0]
    slope = 2.0**-4
    assert causal[0, 3, 1] == -slope * 2
    assert symmetric[0, 1, 3] == -slope * 2
    assert causal[1, 2, 2] == 0


def test_slopes_survive_bfloat16_cast():
    enc = posenc.build("alibi", num_heads=12).to(torch.bfloat16)
    bias = enc.bias_at(torch.tensor(1), torch.arange(12))
    torch.testing.assert_close(bias.double(), -posenc.alibi_slopes(12), rtol=1e-7, atol=0)


def test_bad_head_count():
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1"):
        posenc.alibi_slopes(0)
    assert math.isclose(float(posenc.alibi_slopes(1)[0]), 2**-8)
