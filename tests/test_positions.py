"""posenc.positions by hand: each helper's values on a small case, its defaults, and the parameter each error names."""

import re

import pytest
import torch

from posenc import positions as P


def test_default_positions_put_the_queries_last_and_refuse_more_queries_than_keys():
    q, k = P.default_positions(2, 5)
    assert q.tolist() == [[3, 4]] and k.tolist() == [[0, 1, 2, 3, 4]] and k.dtype == torch.int64
    with pytest.raises(ValueError, match=r"so Tq \(6\) must be <= Tk \(5\); pass q_positions and k_positions "
                                         r"explicitly \(e\.g\. for cross-attention\)"):
        P.default_positions(6, 5)


def test_document_positions_restart_at_each_boundary_and_the_mask_keeps_documents_apart():
    ids = torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 7, 7]])
    assert P.document_positions(ids).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]
    assert P.document_positions([3, 3, 4]).tolist() == [0, 1, 0]
    mask = P.document_mask(torch.tensor([0, 0, 1]))
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, True, False], [True, True, False], [False, False, True]]
    cross = P.document_mask(torch.tensor([[1, 2]]), torch.tensor([[2, 2, 1]]))
    assert cross[0, 0].tolist() == [[False, False, True], [True, True, False]]
    assert P.document_mask([[0, 1]] * 3, [0, 0, 1]).shape == (3, 1, 2, 3)  # one row of key ids serves every batch


def test_document_ids_are_integers_of_shape_t_or_b_t():
    for ids in (torch.tensor([0.0, 1.0]), torch.zeros(1, 1, 4, dtype=torch.long), torch.tensor(3)):
        with pytest.raises(ValueError, match=rf"^q_document_ids must be an integer tensor of shape \(T,\) or \(B, T\), "
                                             rf"got {ids.dtype} {re.escape(str(tuple(ids.shape)))}$"):
            P.document_mask(ids, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^k_document_ids must be an integer tensor .* got torch.float32 \(4,\)$"):
        P.document_mask(torch.zeros(4, dtype=torch.long), torch.zeros(4))
    with pytest.raises(ValueError, match=r"^q_document_ids and k_document_ids must share the batch B \(or one of them be "
                                         r"1\), got 2 and 3$"):
        P.document_mask(torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long))


def test_cross_attention_positions_in_each_mode():
    assert P.cross_attention_positions("none", 2, 3) == (None, None)
    q, k = P.cross_attention_positions("query_only", 2, 3)
    assert q.tolist() == [0, 1] and k.tolist() == [0, 0, 0] and k.dtype == torch.int64
    q, k = P.cross_attention_positions("separate", 2, 3)
    assert q.tolist() == [0, 1] and k.tolist() == [0, 1, 2]
    q, k = P.cross_attention_positions("unified", 2, 3)
    assert q.tolist() == [3, 4] and k.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="mode"):
        P.cross_attention_positions("both", 2, 3)
    for name, args in (("q_len", ("separate", 0, 3)), ("k_len", ("separate", 2, 0))):
        with pytest.raises(ValueError, match=f"{name} must be an integer >= 1"):
            P.cross_attention_positions(*args)


def test_grid_and_patch_positions_are_row_major_from_start():
    grid = P.grid_positions(2, 2, 3)  # start 0 by default, frames one apart
    assert grid.tolist() == [[0] * 6 + [1] * 6, [0, 0, 0, 1, 1, 1] * 2, [0, 1, 2] * 4]
    assert P.grid_positions(2, 1, 1, start=5, time_interval=3).tolist() == [[5, 8], [5, 5], [5, 5]]
    assert P.grid_positions(1, 1, 1, start=0).tolist() == [[0], [0], [0]]
    assert P.patch_positions(2, 3).tolist() == [[0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]]


def test_multimodal_positions_count_on_after_a_grid_by_its_longer_side():
    got = P.multimodal_positions([2, (1, 2, 4), 1])  # merge size 1 by default: the grid moves the count by 4
    assert got.tolist() == [[0, 1] + [2] * 8 + [6], [0, 1] + [2, 2, 2, 2, 3, 3, 3, 3] + [6],
                            [0, 1] + [2, 3, 4, 5] * 2 + [6]]
    merged = P.multimodal_positions([1, (1, 2, 4)], spatial_merge_size=2)  # a 1 × 2 grid after merging
    assert merged.tolist() == [[0, 1, 1], [0, 1, 1], [0, 1, 2]]


@pytest.mark.parametrize("call, name", [
    (lambda: P.grid_positions(0, 1, 1), "frames"), (lambda: P.grid_positions(1, 0, 1), "height"),
    (lambda: P.grid_positions(1, 1, 0), "width"), (lambda: P.grid_positions(1, 1, 1, time_interval=0), "time_interval"),
    (lambda: P.patch_positions(0, 2), "height"), (lambda: P.patch_positions(2, 0), "width"),
    (lambda: P.multimodal_positions([2], spatial_merge_size=0), "spatial_merge_size"),
    (lambda: P.multimodal_positions([0]), "text segment"),
    (lambda: P.randomized_positions(1, 0, 4), "length"), (lambda: P.randomized_positions(1, 2, 0), "max_position"),
    (lambda: P.randomized_positions(0, 2, 4), "batch"),
    (lambda: P.skipwise_positions(0, 4, 8), "batch"), (lambda: P.skipwise_positions(1, 4, 8, chunks=0), "chunks"),
    (lambda: P.skipwise_positions(1, 4, 0), "target"), (lambda: P.skipwise_positions(1, 0, 8), "window"),
])
def test_each_bad_size_names_its_parameter(call, name):
    with pytest.raises(ValueError, match=f"^{name} must be an integer >= 1"):
        call()


def test_the_other_refusals_say_what_is_wrong():
    with pytest.raises(ValueError, match="^start must be an integer >= 0, got -1"):
        P.grid_positions(1, 1, 1, start=-1)
    with pytest.raises(ValueError, match="^segments is empty$"):
        P.multimodal_positions([])
    for bad in ((1, 2), "text", 2.5):
        with pytest.raises(ValueError, match="segments holds ints"):
            P.multimodal_positions([bad])
    with pytest.raises(ValueError, match="multiples of spatial_merge_size=2"):
        P.multimodal_positions([(1, 3, 4)], spatial_merge_size=2)
    with pytest.raises(ValueError, match=r"max_position \(3\) must be at least the length \(4\)"):
        P.randomized_positions(1, 4, 3)


def test_randomized_positions_are_sorted_distinct_and_follow_the_generator():
    got = P.randomized_positions(3, 5, 9, generator=torch.Generator().manual_seed(0))
    again = P.randomized_positions(3, 5, 9, generator=torch.Generator().manual_seed(0))
    assert torch.equal(got, again) and got.shape == (3, 5)
    for row in got.tolist():
        assert row == sorted(set(row)) and 0 <= row[0] and row[-1] < 9
    assert P.randomized_positions(2, 4, 4).tolist() == [[0, 1, 2, 3]] * 2


def test_skipwise_positions_default_to_two_chunks_of_at_least_one_token_and_follow_the_generator():
    rows = P.skipwise_positions(200, 2, 9, generator=torch.Generator().manual_seed(0))
    assert (rows[:, 0] == 0).all() and (rows[:, 1] >= 1).all()  # a 2-token window cut once: 1 token per chunk
    assert {int(r[1]) for r in rows} == set(range(1, 9))  # the skip reaches every id up to target − window
    window = P.skipwise_positions(50, 6, 20, generator=torch.Generator().manual_seed(1))
    jumps = (window.diff(dim=1) > 1).sum(1)
    assert int(jumps.max()) <= 1 and int(jumps.sum()) > 0  # two chunks: at most one jump per row
    assert torch.equal(window, P.skipwise_positions(50, 6, 20, generator=torch.Generator().manual_seed(1)))
    assert P.skipwise_positions(2, 5, 5, chunks=3).tolist() == [[0, 1, 2, 3, 4]] * 2  # target = window: the control


def test_document_positions_refuse_ids_document_mask_would_read_otherwise():
    """[0, 1, 0, 1] numbered every token 0 while document_mask joined tokens 0 and 2 as one document; float ids
    were read as ids."""
    assert P.document_positions(torch.tensor([[7, 7, 3], [3, 4, 4]])).tolist() == [[0, 1, 0], [0, 0, 1]]
    assert P.document_positions(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)
    with pytest.raises(ValueError, match=r"^document_ids must keep each document's tokens together \(equal ids "
                                         r"contiguous\): an id returns after another document$"):
        P.document_positions(torch.tensor([[0, 0, 1], [0, 1, 0]]))  # the second row alone
    with pytest.raises(ValueError, match=r"^document_ids must be an integer tensor of shape \(\.\.\., T\), got "
                                         r"torch.float32 \(3,\)$"):
        P.document_positions(torch.tensor([0.7, 0.2, 0.9]))
    with pytest.raises(ValueError, match=r"^document_ids must be an integer tensor of shape \(\.\.\., T\), got "
                                         r"torch.int64 \(\)$"):
        P.document_positions(torch.tensor(3))
