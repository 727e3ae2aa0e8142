"""ALiBi's channel form part by part: the extra q/k channels reproduce −m·(i − j) exactly (not only up to the
per-query constant softmax forgets), in float32 or float64, about each batch row's own last query, with bfloat16's key
offset split into two exact integer channels."""

import torch

from posenc.encodings.alibi import ALiBi

HEADS = 3


def extra_scores(alibi: ALiBi, q_pos: torch.Tensor, k_pos: torch.Tensor, dtype=torch.float64, scale=0.3):
    """s · (q' · k') over the extra channels only, in float64: (B, H, Tq, Tk). The slopes of up to 8 heads are
    powers of two, so a scale that is not makes float32 round m/s and m·(i − c)/s."""
    q = torch.zeros(q_pos.shape[0], HEADS, q_pos.shape[1], 4, dtype=dtype)
    k = torch.zeros(k_pos.shape[0], HEADS, k_pos.shape[1], 4, dtype=dtype)
    _, query_side, key_side = alibi.score_channel_parts(q, k, q_pos, k_pos, scale)
    return scale * (query_side.double() @ key_side.double().transpose(-1, -2))


def bias(alibi: ALiBi, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """−m_h · (i − j), float64: (B, H, Tq, Tk)."""
    offsets = q_pos[:, None, :, None] - k_pos[:, None, None, :]
    return alibi.bias_at(offsets, torch.arange(HEADS)[None, :, None, None], torch.float64)


def test_the_channels_are_the_bias_itself_for_rows_far_apart():
    """Rows at 0 and at 2^20, each about its own last query: exact in float64, float32's rounding in float32 (an
    origin shared by the batch leaves ~1e-2 there; the sign of the per-query constant flipped leaves 2·m·(i − c))."""
    alibi = ALiBi(HEADS)
    q_pos = torch.stack((torch.arange(8, 12), torch.arange(2**20 + 8, 2**20 + 12)))
    k_pos = torch.stack((torch.arange(12), torch.arange(2**20, 2**20 + 12)))
    torch.testing.assert_close(extra_scores(alibi, q_pos, k_pos), bias(alibi, q_pos, k_pos), rtol=0, atol=1e-12)
    torch.testing.assert_close(extra_scores(alibi, q_pos, k_pos, torch.float32), bias(alibi, q_pos, k_pos),
                               rtol=0, atol=1e-5)


def test_the_parts_come_in_float32_or_float64_as_q_asks():
    """float64 for float64 q, else float32 (the channel kernel rounds bfloat16's exact integers once, at the end)."""
    alibi = ALiBi(HEADS)
    positions = torch.arange(6)[None]
    for dtype, width in ((torch.float64, 2), (torch.float32, 2), (torch.bfloat16, 3)):
        q = torch.zeros(1, HEADS, 6, 4, dtype=dtype)
        _, query_side, key_side = alibi.score_channel_parts(q, q, positions, positions, 1.0)
        expected = torch.float64 if dtype == torch.float64 else torch.float32
        assert query_side.dtype == key_side.dtype == expected, dtype
        assert query_side.shape == (1, HEADS, 6, width) and key_side.shape == (1, 1, 6, width)


def test_bfloat16_splits_each_key_offset_into_two_exact_integers():
    """j − c = 256·a + b with a and b integers bfloat16 holds exactly, keys on both sides of the last query."""
    alibi = ALiBi(HEADS)
    q_pos, k_pos = torch.tensor([[600]]), torch.arange(0, 1201)[None]
    q = torch.zeros(1, HEADS, 1, 4, dtype=torch.bfloat16)
    _, _, key_side = alibi.score_channel_parts(q, q, q_pos, k_pos, 1.0)
    high, low, one = key_side[0, 0].double().unbind(-1)
    torch.testing.assert_close(256 * high + low, (k_pos[0] - 600).double(), rtol=0, atol=0)
    assert (low.abs() <= 256).all() and (one == 1).all() and (high == high.round()).all()


def test_the_channels_are_exact_for_rows_far_apart_when_each_row_is_near_its_own_queries():
    alibi = ALiBi(HEADS)
    rows = torch.stack((torch.arange(16), torch.arange(2**20, 2**20 + 16)))
    assert alibi.channels_exact(rows, rows, torch.float32, contiguous=False)
    assert not alibi.channels_exact(rows[:, :1].flip(0), rows, torch.float32, contiguous=False)  # rows swapped
