"""PoSE's skip-wise position ids as properties over many draws."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from posenc.positions import skipwise_positions


@settings(max_examples=60, deadline=None)
@given(window=st.integers(2, 64), extra=st.integers(0, 300), chunks=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_ids_start_at_zero_increase_stay_in_range_and_chunks_sum_to_the_window(window, extra, chunks, seed):
    chunks = min(chunks, window)
    target = window + extra
    ids = skipwise_positions(8, window, target, chunks, torch.Generator().manual_seed(seed))
    assert ids.shape == (8, window) and ids.dtype == torch.int64
    assert (ids[:, 0] == 0).all() and (ids < target).all()
    steps = ids.diff(dim=1)
    assert (steps >= 1).all()  # strictly increasing
    # Chunks are runs of consecutive ids; there are at most `chunks` of them, and their lengths sum to the window.
    runs = 1 + (steps > 1).sum(dim=1)
    assert (runs <= chunks).all()


def test_skips_cover_the_target_over_many_draws():
    window, target = 16, 200
    ids = skipwise_positions(2000, window, target, 2, torch.Generator().manual_seed(0))
    assert set(ids.flatten().tolist()) == set(range(target))
    assert ids[:, -1].max() == target - 1


def test_chunk_lengths_are_random_and_every_chunk_holds_a_token():
    ids = skipwise_positions(500, 10, 10_000, 3, torch.Generator().manual_seed(0))
    first_jumps = (ids.diff(dim=1) > 1).float().argmax(dim=1)
    assert len(set(first_jumps.tolist())) > 5  # the first cut lands at many places
    assert ((ids.diff(dim=1) > 1).sum(dim=1) <= 2).all()


def test_the_control_is_the_plain_ids():
    ids = skipwise_positions(3, 12, 12, 2, torch.Generator().manual_seed(0))
    assert torch.equal(ids, torch.arange(12).expand(3, 12))


@pytest.mark.parametrize("window,target,chunks,match", [(8, 4, 2, "target \\(4\\) must be at least the window"),
                                                        (3, 10, 4, "chunks \\(4\\) must be at most the window"),
                                                        (0, 10, 1, "window must be an integer >= 1")])
def test_bad_arguments_are_one_line_errors(window, target, chunks, match):
    with pytest.raises(ValueError, match=match):
        skipwise_positions(1, window, target, chunks)
