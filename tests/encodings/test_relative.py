import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers.models.t5.modeling_t5 import T5Attention

import posenc
from tests.oracles import naive_attention, sinusoid_loop

# Worked by hand from T5's formula (num_buckets=32, max_distance=128), key − query.
BIDIRECTIONAL = {0: 0, -1: 1, -7: 7, -8: 8, -16: 10, -32: 12, -64: 14, -128: 15, -10**6: 15,
                 1: 17, 7: 23, 8: 24, 16: 26, 128: 31}
CAUSAL = {0: 0, 5: 0, -1: 1, -15: 15, -16: 16, -32: 21, -64: 26, -127: 31, -128: 31, -10**6: 31}


@pytest.mark.parametrize("bidirectional, table", [(True, BIDIRECTIONAL), (False, CAUSAL)])
def test_bucket_table_worked_by_hand(bidirectional, table):
    rel = torch.tensor(list(table))
    assert posenc.t5_bucket(rel, bidirectional=bidirectional).tolist() == list(table.values())


@settings(max_examples=60, deadline=None)
@given(
    rel=st.lists(st.integers(-5000, 5000), min_size=1, max_size=50),
    bidirectional=st.booleans(),
    num_buckets=st.sampled_from([8, 16, 32, 64]),
    max_distance=st.sampled_from([20, 128, 1000]),
)
def test_bucket_equals_t5_reference(rel, bidirectional, num_buckets, max_distance):
    # max_distance at or below the exact distances: transformers' formula gives negative buckets; refused here
    assume(max_distance > (num_buckets // 2 if bidirectional else num_buckets) // 2)
    rel = torch.tensor(rel)
    ours = posenc.t5_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    theirs = T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, theirs)


def test_t5_bias_reads_the_table_by_bucket():
    enc = posenc.build("t5", num_heads=3, bidirectional=True)
    pos = torch.arange(40).unsqueeze(0)
    bias = enc.score_bias(pos, pos)[0]  # (H, T, T)
    rel = pos[0][None, :] - pos[0][:, None]  # key − query, (Tq, Tk)
    expected = enc.table[posenc.t5_bucket(rel, bidirectional=True)].permute(2, 0, 1)
    torch.testing.assert_close(bias, expected)


def test_t5_interpolation_reads_fractional_offsets():
    enc = posenc.build("t5", num_heads=2, interpolate_factor=2.0)
    plain = posenc.build("t5", num_heads=2)
    plain.load_state_dict(enc.state_dict())
    heads = torch.arange(2)
    # Offset 6 at factor 2 reads offset 3 exactly; offset 7 reads halfway between 3 and 4.
    torch.testing.assert_close(enc.bias_at(torch.tensor(6), heads), plain.bias_at(torch.tensor(3), heads))
    halfway = (plain.bias_at(torch.tensor(3), heads) + plain.bias_at(torch.tensor(4), heads)) / 2
    torch.testing.assert_close(enc.bias_at(torch.tensor(7), heads), halfway)


def _shaw_oracle(enc, q, k, v, q_pos, k_pos, causal):
    """Shaw eq. (2)-(3) with a loop over pairs, float64."""
    K = enc.max_distance
    out = torch.zeros(q.shape[0], v.shape[1], dtype=torch.float64)
    for i in range(q.shape[0]):
        logits, rows = [], []
        for j in range(k.shape[0]):
            rel = max(-K, min(K, int(k_pos[j]) - int(q_pos[i])))
            rows.append(rel + K)
            ok = not causal or k_pos[j] <= q_pos[i]
            value = float(q[i] @ (k[j] + enc.key_table[rel + K].detach().double())) / math.sqrt(q.shape[1])
            logits.append(value if ok else -math.inf)
        probs = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
        for j in range(k.shape[0]):
            out[i] += probs[j] * (v[j] + enc.value_table[rows[j]].detach().double())
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_shaw_matches_pairwise_oracle(causal):
    enc = posenc.build("shaw", head_dim=4, num_heads=1, max_distance=3).double()
    with torch.no_grad():
        enc.key_table.normal_()
        enc.value_table.normal_()
    q, k, v = (torch.randn(1, 1, 9, 4, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(9)
    with torch.no_grad():
        got = posenc.attention(q, k, v, enc, causal=causal, backend="eager")[0, 0]
    torch.testing.assert_close(got, _shaw_oracle(enc, q[0, 0], k[0, 0], v[0, 0], pos, pos, causal))


def test_transformer_xl_matches_pairwise_oracle():
    heads, dh = 2, 4
    enc = posenc.build("transformer_xl", head_dim=dh, num_heads=heads).double()
    q, k, v = (torch.randn(1, heads, 7, dh, dtype=torch.float64) for _ in range(3))
    q_pos, k_pos = torch.arange(3, 10), torch.arange(7)  # queries ahead of keys: offsets 3..9 and negatives
    with torch.no_grad():
        got = posenc.attention(q, k, v, enc, q_positions=q_pos, k_positions=k_pos, causal=False, backend="eager")
        w_r = enc.position_proj.weight  # (H·Dh, width)
        for h in range(heads):
            bias = torch.zeros(7, 7, dtype=torch.float64)
            for i in range(7):
                for j in range(7):
                    r = torch.tensor(sinusoid_loop(int(q_pos[i] - k_pos[j]), enc.r_width), dtype=torch.float64)
                    rel = (w_r @ r).view(heads, dh)[h]
                    u, vb = enc.content_bias[h], enc.position_bias[h]
                    bias[i, j] = (q[0, h, i] @ rel + u @ k[0, h, j] + vb @ rel) / math.sqrt(dh)
            expected = naive_attention(q[0, h], k[0, h], v[0, h], bias=bias)
            torch.testing.assert_close(got[0, h], expected)


def test_shaw_interpolation_between_neighbouring_rows():
    enc = posenc.build("shaw", head_dim=2, num_heads=1, max_distance=4, interpolate_factor=2.0).double()
    q, k = torch.ones(1, 1, 1, 2, dtype=torch.float64), torch.ones(1, 1, 2, 2, dtype=torch.float64)
    q_pos, k_pos = torch.tensor([[5]]), torch.tensor([[0, 2]])  # key − query = -5 → -2.5, -3 → -1.5
    with torch.no_grad():
        logits = enc.relative_logits(q, k, q_pos, k_pos)[0, 0, 0]
    rows = enc.key_table.double().sum(-1)  # q = ones, so q·a = row sums
    K = 4
    torch.testing.assert_close(logits[0], (rows[-3 + K] + rows[-2 + K]) / 2)
    torch.testing.assert_close(logits[1], (rows[-2 + K] + rows[-1 + K]) / 2)
