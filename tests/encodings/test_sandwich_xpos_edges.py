"""Sandwich and xPos where mutation found their tests silent: the dtype each door returns, batch rows whose
positions lie far apart (each row's angles formed about its own last query), the names in their messages."""

import pytest
import torch

from posenc.encodings.sandwich import Sandwich
from posenc.encodings.xpos import XPos

FAR = 2**40  # float64 angles at this position carry an ulp of 2^-12: only offsets about a row's own origin stay exact


def far_apart_rows(length: int = 9) -> torch.Tensor:
    """(2, T): one row of positions from 0, one from 2^40."""
    return torch.stack((torch.arange(length), torch.arange(FAR, FAR + length)))


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


def test_xpos_rotates_in_the_inputs_dtype_and_its_tables_in_float64():
    xpos = XPos(8, scale_base=16.0)
    assert xpos.decay().dtype == torch.float64 and xpos.decay(torch.float32).dtype == torch.float32
    q = torch.randn(1, 2, 5, 8)
    turned_q, turned_k = xpos.rotate(q, q, torch.arange(5)[None], torch.arange(5)[None])
    assert turned_q.dtype == turned_k.dtype == torch.float32
    # far out the tables are formed in float64 and only then rounded: float32 keeps its own precision
    wide = xpos.rotate(q.double(), q.double(), torch.arange(FAR, FAR + 5)[None], torch.arange(FAR, FAR + 5)[None])
    narrow = xpos.rotate(q, q, torch.arange(FAR, FAR + 5)[None], torch.arange(FAR, FAR + 5)[None])
    for a, b in zip(narrow, wide):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-6)


def test_xpos_keys_are_recomputed_per_call_and_its_repr_names_its_settings():
    xpos = XPos(8, base=500.0, layout="interleaved", scale_base=16.0)
    assert xpos.length_dependent is True  # its origin moves with the queries: caches keep keys unrotated
    assert repr(xpos) == "XPos(head_dim=8, layout='interleaved', base=500.0, scale_base=16.0)"
