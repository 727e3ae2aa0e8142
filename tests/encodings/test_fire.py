"""FIRE: its offset table, dtypes, defaults and messages, what the mutation run found unpinned
(docs/history/mutation.md). The table must be the dense bias read along offsets, up to the query that reaches the
threshold; a float64 module asked for float32 must compute in float32; each bad argument names itself. Its values
against the paper's formula: tests/test_oracles.py."""

import pytest
import torch

import posenc
from posenc.encodings.fire import FIRE
from tests.encodings.oracle_attention import HEADS, LENGTH, assert_attention_equals_oracle, qkv
from tests.oracles import fire_bias_loop


def fire(threshold: float = 64.0) -> FIRE:
    torch.manual_seed(0)
    encoding = FIRE(3, width=8, init_c=0.3, init_threshold=threshold).double()
    with torch.no_grad():
        for parameter in encoding.mlp.parameters():
            parameter.normal_()
    return encoding


def test_fire_offset_table_is_the_dense_bias_read_along_offsets():
    encoding = fire(64.0)
    dense = encoding.score_bias(torch.arange(64), torch.arange(64), torch.float64)[0]  # (H, 64, 64)
    table = encoding.offset_table(0, 63, 63, torch.device("cpu"), torch.float64)  # (H, 64): offsets 0..63
    assert table.shape == (3, 64) and table.dtype == torch.float64
    for i in range(64):
        for j in range(i + 1):
            torch.testing.assert_close(dense[:, i, j], table[:, i - j], rtol=0, atol=1e-12)
    window = encoding.offset_table(5, 20, 63, torch.device("cpu"), torch.float64)  # offsets 5..20, both ends
    torch.testing.assert_close(window, table[:, 5:21], rtol=0, atol=0)
    assert encoding.offset_table(0, 63, 63, torch.device("cpu")).dtype == torch.float32  # the default dtype


def test_fire_offset_table_stops_at_the_query_that_reaches_the_threshold():
    """Below L every query divides by ψ(L); a query at L or later divides by its own ψ: no table."""
    encoding = fire(64.0)
    assert encoding.offset_table(0, 10, 63, torch.device("cpu")) is not None
    assert encoding.offset_table(0, 10, 64, torch.device("cpu")) is None
    with torch.no_grad():  # training may carry the learned multiplier below zero: L is its magnitude
        encoding.threshold.neg_()
    assert encoding.offset_table(0, 10, 63, torch.device("cpu")) is not None
    assert encoding.offset_table(0, 10, 64, torch.device("cpu")) is None


def test_a_float64_module_asked_for_float32_computes_in_float32():
    encoding = fire()
    positions = torch.arange(40) * 1000  # offsets up to 39,000: float32 and float64 differ in their digits
    low = encoding.score_bias(positions, positions, torch.float32)
    high = encoding.score_bias(positions, positions, torch.float64)
    assert low.dtype == torch.float32 and high.dtype == torch.float64
    torch.testing.assert_close(low, high.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("build, message", [
    (lambda: FIRE(0), "num_heads must be an integer >= 1, got 0"),
    (lambda: FIRE(2, width=0), "width must be an integer >= 1, got 0"),
    (lambda: FIRE(2, init_threshold=1.0), "init_threshold must be a finite number > 1.0, got 1.0"),
    (lambda: posenc.build("fire", num_heads=2).score_bias(torch.zeros(1, 1, 4), torch.arange(4)),
     r"q_pos must have shape \(T,\) or \(B or 1, T\), got \(1, 1, 4\)"),
    (lambda: posenc.build("fire", num_heads=2).score_bias(torch.arange(4), torch.zeros(1, 1, 4)),
     r"k_pos must have shape \(T,\) or \(B or 1, T\), got \(1, 1, 4\)"),
])
def test_each_bad_argument_names_itself(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_fire_accepts_any_threshold_past_one_position():
    assert float(FIRE(2, init_threshold=1.5).threshold) * 512 == pytest.approx(1.5)


def test_fire_defaults_are_the_papers_and_its_repr_names_them():
    encoding = FIRE(4)
    assert encoding.mlp[0].out_features == 32 and float(encoding.log_scale) == pytest.approx(0.1)
    assert float(encoding.threshold) * 512 == pytest.approx(512.0)
    assert repr(encoding) == ("FIRE(\n  num_heads=4, width=32\n  (mlp): Sequential(\n    (0): Linear(in_features=1, "
                              "out_features=32, bias=True)\n    (1): ReLU()\n    (2): Linear(in_features=32, "
                              "out_features=4, bias=True)\n  )\n)")


def test_fire_equals_the_papers_formula_and_interpolates_into_the_unit_interval():
    torch.manual_seed(0)
    enc = posenc.build("fire", num_heads=HEADS, width=5, init_threshold=4.0).double()
    with torch.no_grad():
        for parameter in enc.mlp.parameters():
            parameter.normal_(0, 1.0)
    first, second = enc.mlp[0], enc.mlp[2]
    for start in (0, 2**20):
        positions = list(range(start, start + LENGTH))
        weights = [p.detach() for p in (first.weight, first.bias, second.weight, second.bias)]
        bias = fire_bias_loop(positions, float(enc.log_scale.detach()), 4.0, *weights)
        p = torch.tensor(positions)
        assert_attention_equals_oracle(enc, bias, *qkv(), causal=True, q_positions=p, k_positions=p)
    # every distance a query sees maps into [0, 1]; the farthest key of a late query to exactly 1
    queries = torch.arange(100, 120)[None]
    x = enc.interpolated_distance(queries, torch.arange(120)[None], torch.float64)
    seen = x[0][torch.arange(120)[None, :] <= queries[0][:, None]].detach()
    assert seen.min() == 0 and seen.max() == pytest.approx(1.0)


def test_a_bad_constructor_argument_names_the_parameter():
    with pytest.raises(ValueError, match="init_c must be"):
        posenc.build("fire", num_heads=2, init_c=0.0)
