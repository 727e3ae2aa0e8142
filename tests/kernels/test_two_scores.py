"""Self-Extend's two-score kernel at its edges: which path serves which positions, masks of every shape, rows
with nothing to read, long query runs, and half-precision inputs. The general path (forced by an all-True mask)
is the reference for the fused one; both meet the papers' loop in tests/extension/test_self_extend.py."""

import pytest
import torch

from posenc.kernels.two_scores import two_score_attention

T, DH = 23, 8


def tensors(length=T, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, q_far = (torch.randn(1, 4, length, DH, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    k, k_far, v = (torch.randn(1, 2, length, DH, generator=g, dtype=torch.float64).to(dtype) for _ in range(3))
    return q, k, q_far, k_far, v


def general(q, k, q_far, k_far, v, q_pos, k_pos, window, **kw):
    everything = torch.ones(1, 1, q.shape[2], k.shape[2], dtype=torch.bool)
    return two_score_attention(q, k, q_far, k_far, v, q_pos, k_pos, window, scale=0.3, mask=everything, **kw)


def by_hand(q, k, q_far, k_far, v, q_pos, k_pos, window, allowed):
    """One softmax per (row, head) over the merged logits, float64, with loops over nothing but the batch."""
    repeats = q.shape[1] // k.shape[1]
    k, k_far, v = (t.repeat_interleave(repeats, dim=1) for t in (k, k_far, v))
    distance = (q_pos[:, :, None] - k_pos[:, None, :]).unsqueeze(1)
    logits = torch.where(distance < window, q @ k.transpose(-1, -2), q_far @ k_far.transpose(-1, -2)) * 0.3
    allowed = allowed & (distance >= 0)
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return weights @ v


@pytest.mark.parametrize("block", [3, 5])
def test_the_general_path_covers_every_query_when_queries_outnumber_the_head_width(block):
    q, k, q_far, k_far, v = tensors()
    positions = torch.arange(T)[None]
    everything = torch.ones(1, 1, T, T, dtype=torch.bool)
    got = general(q, k, q_far, k_far, v, positions, positions, 6, block=block)
    torch.testing.assert_close(got, by_hand(q, k, q_far, k_far, v, positions, positions, 6, everything))
    fused = two_score_attention(q, k, q_far, k_far, v, positions, positions, 6, scale=0.3, block=block)
    torch.testing.assert_close(fused, got)


@pytest.mark.parametrize("shape", ["keys", "full", "two queries"])
def test_masks_of_every_shape_are_applied_per_block(shape):
    q, k, q_far, k_far, v = tensors()
    length = 2 if shape == "two queries" else T
    q, q_far = q[:, :, -length:], q_far[:, :, -length:]
    q_pos, k_pos = torch.arange(T - length, T)[None], torch.arange(T)[None]
    g = torch.Generator().manual_seed(3)
    if shape == "keys":  # key padding: (1, 1, 1, Tk)
        mask = torch.rand(1, 1, 1, T, generator=g) > 0.3
    else:
        mask = torch.rand(1, 1, length, T, generator=g) > 0.3
    mask[..., 0] = True  # every query keeps a key
    got = two_score_attention(q, k, q_far, k_far, v, q_pos, k_pos, 4, scale=0.3, mask=mask, block=1)
    torch.testing.assert_close(got, by_hand(q, k, q_far, k_far, v, q_pos, k_pos, 4, mask))


def test_a_query_with_no_key_to_read_returns_zeros():
    q, k, q_far, k_far, v = tensors()
    positions = torch.arange(T)[None]
    mask = torch.ones(1, 1, T, T, dtype=torch.bool)
    mask[..., 5, :] = False
    got = two_score_attention(q, k, q_far, k_far, v, positions, positions, 4, scale=0.3, mask=mask)
    assert torch.equal(got[:, :, 5], torch.zeros_like(got[:, :, 5]))
    assert got[:, :, 4].abs().sum() > 0


@pytest.mark.parametrize("case", ["keys differ per row", "queries differ per row", "queries not the last keys"])
def test_positions_the_fused_path_cannot_serve_go_the_general_way(case):
    q, k, q_far, k_far, v = tensors()
    q, k, q_far, k_far, v = (t.expand(2, -1, -1, -1) for t in (q, k, q_far, k_far, v))
    plain = torch.arange(T)
    if case == "keys differ per row":  # row 1's keys hold a gap
        q_pos, k_pos = plain[None], torch.stack([plain, torch.cat([plain[:10], plain[10:] + 3])])
    elif case == "queries differ per row":
        q_pos, k_pos = torch.stack([plain, torch.cat([plain[:10], plain[10:] + 3])]), plain[None]
    else:  # keys at 0..T−1, queries one step behind them
        q_pos, k_pos = (plain - 1)[None], plain[None]
    got = two_score_attention(q, k, q_far, k_far, v, q_pos, k_pos, 4, scale=0.3)
    everything = torch.ones(1, 1, T, T, dtype=torch.bool)
    torch.testing.assert_close(got, by_hand(q, k, q_far, k_far, v, q_pos, k_pos, 4, everything))


@pytest.mark.parametrize("masked", [False, True])
def test_half_precision_inputs_are_computed_in_float32_and_returned_in_their_dtype(masked):
    q, k, q_far, k_far, v = tensors(dtype=torch.bfloat16)
    positions = torch.arange(T)[None]
    mask = torch.ones(1, 1, T, T, dtype=torch.bool) if masked else None
    got = two_score_attention(q, k, q_far, k_far, v, positions, positions, 4, scale=0.3, mask=mask, block=7)
    assert got.dtype == torch.bfloat16
    want = by_hand(*(t.double() for t in (q, k, q_far, k_far, v)), positions, positions, 4,
                   torch.ones(1, 1, T, T, dtype=torch.bool))
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
