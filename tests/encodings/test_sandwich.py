"""Sandwich against a float64 loop written from the paper's bias (tests/oracles.py); the dtype each door
returns, batch rows whose positions lie far apart (each row's angles formed about its own last query), the names in
its messages."""

import math

import pytest
import torch

import posenc
from posenc.encodings.sandwich import Sandwich
from tests.encodings.oracle_attention import HEADS, LENGTH, assert_attention_equals_oracle, qkv
from tests.oracles import sandwich_bias_loop

FAR = 2**40  # float64 angles at this position carry an ulp of 2^-12: only offsets about a row's own origin stay exact


def far_apart_rows(length: int = 9) -> torch.Tensor:
    """(2, T): one row of positions from 0, one from 2^40."""
    return torch.stack((torch.arange(length), torch.arange(FAR, FAR + length)))


def test_sandwich_equals_the_papers_bias_at_any_offset():
    enc = posenc.build("sandwich", num_heads=HEADS, sinusoid_dim=16)
    q, k, v = qkv()
    bias = sandwich_bias_loop(list(range(LENGTH)), HEADS, 16)
    for causal in (True, False):
        assert_attention_equals_oracle(enc, bias, q, k, v, causal=causal)
        far = torch.arange(2**20, 2**20 + LENGTH)  # angle addition about the last query: exact far out
        assert_attention_equals_oracle(enc, bias, q, k, v, causal=causal, q_positions=far, k_positions=far)
    positions = torch.arange(LENGTH)[None]
    assert enc.score_bias(positions, positions, torch.float64)[0, :, 4, 4].abs().max() < 1e-12  # 0 at distance 0


def test_sandwich_returns_the_dtype_asked_for_from_every_door():
    sandwich = Sandwich(2, sinusoid_dim=8)
    positions = torch.arange(5)[None]
    assert sandwich.bias_at(torch.arange(5), torch.zeros(5, dtype=torch.long)).dtype == torch.float32
    assert sandwich.score_bias(positions, positions).dtype == torch.float32
    for dtype in (torch.float32, torch.float64):  # the channels follow q: float32 rides float32 SDPA
        q = torch.zeros(1, 2, 5, 4, dtype=dtype)
        _, query_side, key_side = sandwich.score_channel_parts(q, q, positions, positions, scale=0.5)
        assert query_side.dtype == key_side.dtype == dtype


def test_sandwich_rows_far_apart_each_keep_their_offsets_exact():
    """Each batch row forms its angles about its own last query: a row at 2^40 scores as a row at 0, in the dense
    bias and in the channels alike (an origin shared across rows, or positions added to it, loses ~1e-4 there)."""
    sandwich = Sandwich(3, sinusoid_dim=16)
    positions = far_apart_rows()
    offsets = torch.arange(9)[:, None] - torch.arange(9)[None, :]
    want = sandwich.bias_at(offsets, torch.arange(3)[:, None, None], torch.float64)  # (H, Tq, Tk)
    dense = sandwich.score_bias(positions, positions, torch.float64)  # (2, H, Tq, Tk)
    q = torch.zeros(2, 3, 9, 4, dtype=torch.float64)
    _, query_side, key_side = sandwich.score_channel_parts(q, q, positions, positions, scale=1.0)
    channels = query_side @ key_side.transpose(-1, -2) - sandwich.dim / 2 / sandwich.temperatures()[:, None, None]
    for row in range(2):
        torch.testing.assert_close(dense[row], want, rtol=0, atol=1e-9)
        torch.testing.assert_close(channels[row], want, rtol=0, atol=1e-9)


def test_sandwich_names_the_positions_it_refuses():
    sandwich = Sandwich(2)
    good, bad = torch.arange(4), torch.zeros(1, 1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^q_pos must have shape \(T,\) or \(B or 1, T\), got \(1, 1, 4\)$"):
        sandwich.score_bias(bad, good)
    with pytest.raises(ValueError, match=r"^k_pos must have shape \(T,\) or \(B or 1, T\), got \(1, 1, 4\)$"):
        sandwich.score_bias(good, bad)


def test_a_bad_constructor_argument_names_the_parameter():
    with pytest.raises(ValueError, match="sinusoid_dim must be an even integer"):
        posenc.build("sandwich", num_heads=2, sinusoid_dim=7)


def test_sandwich_never_takes_its_channel_form_on_the_cpu():
    assert math.isinf(posenc.build("sandwich", num_heads=2).cpu_channels_from_keys)
