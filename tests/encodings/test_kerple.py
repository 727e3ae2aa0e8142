"""Kerple: a float64 module asked for float32 computes in float32, and a bad head count names itself (what
the mutation run found unpinned, docs/history/mutation.md). Its values against the paper's formula:
tests/test_oracles.py."""

import pytest
import torch

import posenc
from posenc.encodings.kerple import Kerple
from tests.encodings.oracle_attention import HEADS, LENGTH, assert_attention_equals_oracle, qkv
from tests.oracles import kerple_bias_loop


@pytest.mark.parametrize("variant", ["log", "power"])
def test_a_float64_module_asked_for_float32_computes_in_float32(variant):
    encoding = Kerple(3, variant).double()
    positions = torch.arange(40) * 1000  # offsets up to 39,000: float32 and float64 differ in their digits
    low = encoding.score_bias(positions, positions, torch.float32)
    high = encoding.score_bias(positions, positions, torch.float64)
    assert low.dtype == torch.float32 and high.dtype == torch.float64
    torch.testing.assert_close(low, high.float(), rtol=1e-5, atol=1e-5)


def test_a_bad_head_count_names_itself():
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1, got 0"):
        Kerple(0)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_equals_the_papers_kernels(variant):
    enc = posenc.build("kerple", num_heads=HEADS, variant=variant).double()
    with torch.no_grad():
        enc.scale.copy_(torch.tensor([0.5, 1.5, -1.0], dtype=torch.float64))  # the last clamps to 0.01
        enc.shape.copy_(torch.tensor([0.3, 1.0, 3.0], dtype=torch.float64))  # power: 3 clamps to 2
    r1, r2 = [0.5, 1.5, 0.01], [0.3, 1.0, 3.0 if variant == "log" else 2.0]
    bias = kerple_bias_loop(LENGTH, r1, r2, variant)
    for causal in (True, False):
        assert_attention_equals_oracle(enc, bias, *qkv(), causal=causal)


def test_kerple_power_with_unit_exponent_is_alibi():
    alibi = posenc.build("alibi", num_heads=4)
    kerple = posenc.build("kerple", num_heads=4, variant="power").double()
    with torch.no_grad():
        kerple.scale.copy_(torch.tensor(alibi.slope_values, dtype=torch.float64))
        kerple.shape.fill_(1.0)
    positions = torch.arange(20)[None]
    kept = slice(0, 3)  # the fourth slope, 2^-8, is below Kerple's clamp at 0.01
    torch.testing.assert_close(kerple.score_bias(positions, positions, torch.float64)[:, kept],
                               alibi.score_bias(positions, positions, torch.float64).abs().neg()[:, kept])


def test_a_bad_constructor_argument_names_the_parameter():
    with pytest.raises(ValueError, match="variant must be one of"):
        posenc.build("kerple", num_heads=2, variant="cubic")
