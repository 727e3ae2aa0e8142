"""CoPE against a float64 loop written from the paper's counting (tests/oracles.py): causal and bidirectional,
what each query may see, its dtype under autocast, its messages."""

import pytest
import torch

import posenc
from tests.encodings.oracle_attention import HEAD_DIM, HEADS, assert_attention_equals_oracle, qkv
from tests.oracles import cope_logits_loop


@pytest.mark.parametrize("causal", [True, False])
def test_cope_equals_the_papers_counting(causal):
    torch.manual_seed(0)
    enc = posenc.build("cope", head_dim=HEAD_DIM, max_positions=5).double()
    with torch.no_grad():
        enc.embeddings.normal_(0, 1.0)
    q, k, v = qkv()
    q = q * 2  # gates far from 1/2, so counts spread over the table and reach its clamp
    bias = torch.stack([cope_logits_loop(q[0, h], k[0, h], enc.embeddings.detach(), causal) for h in range(HEADS)])
    if causal:
        bias = bias.nan_to_num(neginf=0.0)  # masked pairs: the oracle's allowed mask removes them
    assert_attention_equals_oracle(enc, bias, q, k, v, causal=causal)


def test_cope_counts_only_what_each_query_may_see():
    """Counting stops at document edges and padding, so packed rows equal separate ones (the
    attention tests check that for every encoding); and counts never exceed the keys seen."""
    enc = posenc.build("cope", head_dim=HEAD_DIM)
    q, k, _ = qkv(length=12)
    positions = torch.arange(12)[None]
    counts = enc.contextual_positions(q, k, positions, positions, torch.ones(12, 12).tril().bool())
    seen = torch.arange(12)[:, None] - torch.arange(12)[None, :] + 1  # keys from j to i
    for head in counts[0]:
        assert (head <= seen.clamp(min=0)).all() and (head[seen <= 0] == 0).all() and (head[seen > 0] > 0).all()


def test_cope_counts_in_its_inputs_dtype_under_autocast():
    """Under bf16 autocast the counts (and the logits) are the float32 ones: bf16 holds no integer past 256, and
    CUDA's autocast summed in float32 beside bf16 products (lerp refused the mix)."""
    torch.manual_seed(0)
    enc = posenc.build("cope", head_dim=HEAD_DIM, max_positions=400)
    q, k = (torch.randn(1, 2, 300, HEAD_DIM).abs() for _ in range(2))  # gates near 1: counts near 300
    positions = torch.arange(300)[None]
    plain = enc.relative_logits(q, k, positions, positions)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        counts = enc.contextual_positions(q, k, positions, positions)
        autocast = enc.relative_logits(q, k, positions, positions)
    assert counts.dtype == autocast.dtype == torch.float32 and counts.max() > 256
    assert torch.equal(autocast, plain)


def test_a_bad_constructor_argument_names_the_parameter():
    with pytest.raises(ValueError, match="max_positions must be an integer >= 2"):
        posenc.build("cope", head_dim=8, max_positions=1)
