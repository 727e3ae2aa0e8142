"""Every constructor argument of the classic encodings at its bound: the edge value accepted, one step past it
refused with a message naming the argument and its range; the documented defaults; Sandwich's bias by its formula
and a learned table's rows as they are added."""

import math

import pytest
import torch

from posenc.encodings.absolute import Learned, Sinusoidal, sinusoidal_table
from posenc.encodings.alibi import ALiBi
from posenc.encodings.relative import Shaw, T5RelativeBias, TransformerXL
from posenc.encodings.sandwich import Sandwich
from posenc.encodings.xpos import XPos

CASES = [  # (constructor, arguments at the edge, the argument moved past it, its name, the message's range)
    (T5RelativeBias, dict(num_heads=1, num_buckets=2, max_distance=2, interpolate_factor=1.0), ("num_heads", 0), ">= 1"),
    (T5RelativeBias, dict(num_heads=1, num_buckets=2, max_distance=2), ("num_buckets", 1), ">= 2"),
    (T5RelativeBias, dict(num_heads=1, num_buckets=2, max_distance=2), ("max_distance", 1),
     r">= 2 \(more than the distances num_buckets=2 holds exactly\)"),
    (T5RelativeBias, dict(num_heads=1, num_buckets=4, max_distance=2, bidirectional=True), ("num_buckets", 3), ">= 4"),
    (T5RelativeBias, dict(num_heads=1, num_buckets=8, max_distance=3, bidirectional=True), ("max_distance", 2),
     r">= 3 \(more than the distances num_buckets=8 holds exactly each way\)"),
    (T5RelativeBias, dict(num_heads=1, num_buckets=32, max_distance=17), ("max_distance", 16),
     r">= 17 \(more than the distances num_buckets=32 holds exactly\)"),
    (T5RelativeBias, dict(num_heads=1, interpolate_factor=1.0), ("interpolate_factor", 0.99), ">= 1.0"),
    (Shaw, dict(head_dim=1, num_heads=1, max_distance=1, interpolate_factor=1.0), ("head_dim", 0), ">= 1"),
    (Shaw, dict(head_dim=1, num_heads=1), ("num_heads", 0), ">= 1"),
    (Shaw, dict(head_dim=1, num_heads=1, max_distance=1), ("max_distance", 0), ">= 1"),
    (Shaw, dict(head_dim=1, num_heads=1, interpolate_factor=1.0), ("interpolate_factor", 0.99), ">= 1.0"),
    (TransformerXL, dict(head_dim=1, num_heads=1, base=1.01), ("head_dim", 0), ">= 1"),
    (TransformerXL, dict(head_dim=1, num_heads=1), ("num_heads", 0), ">= 1"),
    (TransformerXL, dict(head_dim=1, num_heads=1, base=1.01), ("base", 1.0), "> 1.0"),
    (Sandwich, dict(num_heads=1, sinusoid_dim=2, base=1.01), ("num_heads", 0), ">= 1"),
    (Sandwich, dict(num_heads=1, sinusoid_dim=2), ("sinusoid_dim", 3), "an even integer >= 2"),
    (Sandwich, dict(num_heads=1, base=1.01), ("base", 1.0), "> 1.0"),
    (ALiBi, dict(num_heads=1), ("num_heads", 0), ">= 1"),
    (XPos, dict(head_dim=2, scale_base=1e-9), ("scale_base", 0.0), "> 0.0"),
    (Sinusoidal, dict(dim=2, base=1.01, scale=1e-9), ("dim", 3), "an even integer >= 2"),
    (Sinusoidal, dict(dim=2, base=1.01), ("base", 1.0), "> 1.0"),
    (Sinusoidal, dict(dim=2, scale=1e-9), ("scale", 0.0), "> 0.0"),
    (Learned, dict(max_positions=1, dim=1), ("max_positions", 0), ">= 1"),
    (Learned, dict(max_positions=1, dim=1), ("dim", 0), ">= 1"),
    (Learned, dict(max_positions=1, dim=1, init_std=0.0), ("init_std", -0.01), ">= 0.0"),
]


@pytest.mark.parametrize("build, edge, past, bound", CASES, ids=lambda c: c if isinstance(c, str) else None)
def test_each_argument_is_accepted_at_its_edge_and_refused_past_it_by_name(build, edge, past, bound):
    build(**edge)
    name, value = past
    with pytest.raises(ValueError, match=rf"^{name} must be (a finite number |an integer )?{bound}, got {value!r}$"):
        build(**{**edge, name: value})


@pytest.mark.parametrize("build, edge, past, bound", [case for case in CASES if "." in case[3]],
                         ids=lambda c: c if isinstance(c, str) else None)
def test_each_number_argument_refuses_infinity_by_name(build, edge, past, bound):
    name = past[0]
    with pytest.raises(ValueError, match=rf"^{name} must be a finite number {bound}, got inf$"):
        build(**{**edge, name: float("inf")})


def test_the_documented_defaults():
    t5 = T5RelativeBias(2)
    assert (t5.num_buckets, t5.max_distance, t5.bidirectional, t5.interpolate_factor) == (32, 128, False, 1.0)
    shaw = Shaw(4, 2)
    assert (shaw.max_distance, shaw.interpolate_factor, tuple(shaw.key_table.shape)) == (16, 1.0, (33, 4))
    assert TransformerXL(4, 2).base == 10000.0
    sandwich = Sandwich(2)
    assert (sandwich.dim, sandwich.base) == (128, 10000.0)
    assert ALiBi(2).symmetric is False
    sinusoidal = Sinusoidal(4)
    assert (sinusoidal.base, sinusoidal.scale) == (10000.0, 1.0)
    learned = Learned(8, 4)
    assert learned.beyond == "error" and 0.01 < learned.table.detach().std().item() < 0.04  # init_std 0.02
    with pytest.raises(ValueError, match=r"^beyond must be one of \['error', 'extend', 'interpolate'\], got 'wrap'$"):
        Learned(8, 4, beyond="wrap")
    with pytest.raises(ValueError, match=r"^dim must be an even integer >= 2, got 3$"):
        sinusoidal_table(4, 3)


def test_sandwich_bias_is_zero_at_offset_zero_and_its_formula_elsewhere():
    sandwich = Sandwich(4, sinusoid_dim=6, base=100.0)
    offsets, heads = torch.arange(0, 9)[None, :], torch.arange(4)[:, None]
    got = sandwich.bias_at(offsets, heads, torch.float64)
    for h in range(4):
        for d in range(9):
            total = sum(math.cos(d * 100.0 ** (-2 * k / 6)) for k in range(1, 4)) - 3  # Σ_k cos(d ω_k) − d/2
            assert got[h, d].item() == pytest.approx(total / (8 * (h + 1) / 4), abs=1e-12)
    assert got[:, 0].abs().max() == 0  # the bias of a token on itself
    dense = sandwich.score_bias(torch.arange(9), torch.arange(9), torch.float64)[0]
    torch.testing.assert_close(dense[:, 8, :].flip(-1), got)  # query 8 reads keys 8..0 at offsets 0..8


def test_learned_embed_adds_the_row_of_each_position_and_grows_past_its_table_only_when_asked():
    learned = Learned(4, 3, beyond="extend")
    x = torch.randn(2, 3, 3)
    positions = torch.tensor([[0, 2, 3]])
    torch.testing.assert_close(learned.embed(x, positions), x + learned.table.detach()[positions])
    assert learned.embed(x, positions, seq_len=4).shape == (2, 3, 3) and learned.table.shape[0] == 4
    learned.embed(x, torch.tensor([[0, 1, 4]]))  # position 4 needs a fifth row
    assert learned.table.shape[0] == 5
    with pytest.raises(ValueError, match=r"^position 4 is beyond the learned table: positions must be < "
                                         r"max_positions=4"):
        Learned(4, 3).embed(x, torch.tensor([[0, 1, 4]]))
    assert Learned(4, 3).rows(torch.tensor([], dtype=torch.long)).shape == (0, 3)
