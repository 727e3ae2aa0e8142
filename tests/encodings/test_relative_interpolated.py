"""Shaw and T5 read at interpolated offsets (``interpolate_factor`` > 1), and xPos's scores, against float64 loops
over every (query, key) pair written from the papers' formulas: the fractional paths no other test reaches."""

import math

import pytest
import torch

from posenc.encodings.relative import Shaw, T5RelativeBias, t5_bucket
from posenc.encodings.xpos import GAMMA, XPos

T, DH, HEADS = 7, 4, 2


def read(table: torch.Tensor, offset: float, clip):
    """A table row at a fractional offset: the two neighbouring integer rows, mixed linearly."""
    lower = math.floor(offset)
    weight = offset - lower
    return table[clip(lower)] * (1 - weight) + table[clip(lower + 1)] * weight


@pytest.mark.parametrize("factor", [2.0, 2.5])
def test_shaw_logits_and_values_at_interpolated_offsets_equal_the_loop(factor):
    torch.manual_seed(0)
    shaw = Shaw(DH, HEADS, max_distance=2, interpolate_factor=factor).double()
    with torch.no_grad():
        shaw.key_table.normal_()
        shaw.value_table.normal_()
    q, k = torch.randn(1, HEADS, T, DH, dtype=torch.float64), torch.randn(1, HEADS, T, DH, dtype=torch.float64)
    probs = torch.softmax(torch.randn(1, HEADS, T, T, dtype=torch.float64), -1)
    positions = torch.arange(T)[None]

    def clip(row):
        return max(-2, min(2, row)) + 2

    logits = torch.zeros(1, HEADS, T, T, dtype=torch.float64)
    values = torch.zeros(1, HEADS, T, DH, dtype=torch.float64)
    for h in range(HEADS):
        for i in range(T):
            for j in range(T):
                logits[0, h, i, j] = q[0, h, i] @ read(shaw.key_table, (j - i) / factor, clip)
                values[0, h, i] += probs[0, h, i, j] * read(shaw.value_table, (j - i) / factor, clip)
    torch.testing.assert_close(shaw.relative_logits(q, k, positions, positions), logits)
    torch.testing.assert_close(shaw.relative_values(probs, positions, positions), values)
    assert not shaw.has_band_form


def test_t5_bias_at_interpolated_offsets_equals_the_loop():
    t5 = T5RelativeBias(HEADS, num_buckets=8, max_distance=16, interpolate_factor=3.0).double()
    with torch.no_grad():
        t5.table.normal_()
    positions = torch.arange(T)[None]
    got = t5.score_bias(positions, positions, torch.float64)
    for h in range(HEADS):
        for i in range(T):
            for j in range(T):
                scaled = (j - i) / 3.0  # k − q, read at a third of the distance
                lower = math.floor(scaled)
                weight = scaled - lower
                bucket = [int(t5_bucket(torch.tensor(r), bidirectional=False, num_buckets=8, max_distance=16))
                          for r in (lower, lower + 1)]
                want = t5.table[bucket[0], h] * (1 - weight) + t5.table[bucket[1], h] * weight
                assert got[0, h, i, j].item() == pytest.approx(want.item(), abs=1e-12)


def test_t5_buckets_by_hand_at_the_exact_edge_and_their_bounds_named():
    # causal, 8 buckets: distances 0..3 exact; 4 and beyond logarithmic up to 16, then the last bucket
    distance = torch.arange(0, 40)
    got = t5_bucket(-distance, bidirectional=False, num_buckets=8, max_distance=16)
    want = [d if d < 4 else min(7, 4 + int(math.log(d / 4) / math.log(16 / 4) * 4)) for d in range(40)]
    assert got.tolist() == want and got[3] == 3 and got[4] == 4
    assert t5_bucket(-distance[:4], bidirectional=False, num_buckets=2, max_distance=2).tolist() == [0, 1, 1, 1]
    assert t5_bucket(torch.tensor([-3, -1, 0, 1, 3]), bidirectional=True, num_buckets=4, max_distance=2).tolist() == [
        1, 1, 0, 3, 3]  # both ways, only distance 0 is exact: keys after the query take bucket 2 + 1
    for name, kwargs, minimum in (("num_buckets", dict(num_buckets=1), 2), ("max_distance", dict(max_distance=0), 1),
                                  ("max_distance", dict(max_distance=16, num_buckets=32), 17)):
        with pytest.raises(ValueError, match=f"^{name} must be an integer >= {minimum}"):
            t5_bucket(distance, bidirectional=False, **kwargs)
    with pytest.raises(ValueError, match="^num_buckets must be an integer >= 4, got 3$"):
        t5_bucket(distance, bidirectional=True, num_buckets=3)


def test_xpos_scores_are_rope_scores_times_the_decay_of_the_offset():
    torch.manual_seed(1)
    xpos = XPos(DH, base=100.0, scale_base=8.0)
    q, k = torch.randn(1, 1, T, DH, dtype=torch.float64), torch.randn(1, 1, T, DH, dtype=torch.float64)
    positions = torch.arange(3, 3 + T)[None]
    rq, rk = xpos.rotate(q, k, positions, positions)
    got = rq[0, 0] @ rk[0, 0].T
    zeta = [(2 * c / DH + GAMMA) / (1 + GAMMA) for c in range(DH // 2)]
    inv_freq = xpos.frequencies()[0].double().tolist()  # 100^(−2c/DH), rounded to float32 as transformers does
    assert inv_freq == pytest.approx([100.0 ** (-2 * c / DH) for c in range(DH // 2)], rel=1e-7)
    for i in range(T):
        for j in range(T):
            want = 0.0
            for c in range(DH // 2):  # the half layout pairs channel c with c + DH/2
                angle = (j - i) * inv_freq[c]  # a · R((j − i)θ) b
                a, b = (q[0, 0, i, c], q[0, 0, i, c + DH // 2]), (k[0, 0, j, c], k[0, 0, j, c + DH // 2])
                dot = (a[0] * b[0] + a[1] * b[1]) * math.cos(angle) - (a[0] * b[1] - a[1] * b[0]) * math.sin(angle)
                want += dot * zeta[c] ** ((i - j) / 8.0)
            assert got[i, j].item() == pytest.approx(float(want), rel=1e-9, abs=1e-12)
    assert torch.allclose(xpos.decay(), torch.tensor(zeta, dtype=torch.float64))
    assert XPos(DH).scale_base == 512.0


def test_xpos_keeps_its_layout_and_base_and_each_row_its_own_origin_far_from_zero():
    xpos = XPos(DH, layout="interleaved")
    assert xpos.layout == "interleaved" and xpos.scaling["rope_theta"] == 10000.0
    q, k = torch.randn(2, 1, T, DH, dtype=torch.float64), torch.randn(2, 1, T, DH, dtype=torch.float64)
    near, far = torch.arange(T), torch.arange(2 ** 20, 2 ** 20 + T)  # ζ^(2^20/512) underflows float64
    both = torch.stack([near, far])
    rq, rk = xpos.rotate(q, k, both, both)
    assert torch.isfinite(rq).all() and torch.isfinite(rk).all()
    for row, positions in enumerate((near, far)):
        alone_q, alone_k = xpos.rotate(q[row : row + 1], k[row : row + 1], positions[None], positions[None])
        torch.testing.assert_close(rq[row : row + 1] @ rk[row : row + 1].transpose(-1, -2),
                                   alone_q @ alone_k.transpose(-1, -2))
    half = XPos(DH).rotate(q, k, both, both)[0]
    assert (half - rq).abs().max() > 1e-3  # the layouts pair different channels
