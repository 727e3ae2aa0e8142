"""The synthetic tasks at their edges: which lengths they take and refuse (by name), recall with a set number of
questions, every draw from the caller's generator, and copies that hold the whole string."""

import pytest
import torch

from posenc.lm.tasks import IGNORE, CopyTask, RecallTask


def draw(task, length: int, seed: int, *, full: bool = False, batch: int = 64):
    return task.batch(length, batch, torch.Generator().manual_seed(seed), full=full)


@pytest.mark.parametrize("task", [CopyTask(), RecallTask(), RecallTask(queries=2)])
def test_every_draw_comes_from_the_callers_generator(task):
    torch.manual_seed(0)
    first = draw(task, 16, seed=5)
    torch.manual_seed(1)  # the global generator moves; the batch must not
    again = draw(task, 16, seed=5)
    other = draw(task, 16, seed=6)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])


def test_copy_strings_run_from_one_symbol_to_the_longest_and_use_every_symbol():
    inputs, targets = draw(CopyTask(symbols=4), 8, seed=0, batch=256)
    lengths = (targets != IGNORE).sum(1)  # the second copy: one scored token per symbol
    assert lengths.min() == 1 and lengths.max() == 4
    first_copies = [row[:n] for row, n in zip(inputs.tolist(), lengths.tolist())]
    assert {s for copy in first_copies for s in copy} == {0, 1, 2, 3}


def test_a_full_copy_holds_the_whole_string_twice_without_padding():
    task = CopyTask(symbols=16)
    inputs, targets = draw(task, 16, seed=1, full=True)
    sequence = torch.cat([inputs, targets[:, -1:]], 1)  # the last target is the copy's last symbol
    padding, separator = task.symbols + 1, task.symbols
    assert not (sequence == padding).any() and (sequence[:, 8] == separator).all()
    assert torch.equal(sequence[:, :8], sequence[:, 9:])
    assert (sequence[:, 7] != sequence[:, 6]).any()  # the last symbol is drawn, not repeated from the one before


def test_recall_with_a_set_number_of_questions_asks_that_many_about_its_own_pairs():
    task = RecallTask(keys=64, values=16, queries=2)
    assert task.pairs(16) == 6 and task.asked(16) == 2 and task.scored_per_sequence(16) == 2
    inputs, targets = draw(task, 16, seed=2)
    scored = targets != IGNORE
    assert (scored.sum(1) == 2).all()
    for row, target, mask in zip(inputs.tolist(), targets.tolist(), scored.tolist()):
        pairs = dict(zip(row[0:12:2], row[1:12:2]))
        assert len(pairs) == 6 and row[12] == task.keys + task.values  # distinct keys, then the separator
        asked = [(row[i], target[i]) for i in range(16) if mask[i]]  # each scored value follows its key
        assert all(pairs[key] == value for key, value in asked) and asked[0][0] != asked[1][0]
    assert RecallTask().scored_per_sequence(16) == 4 and CopyTask().scored_per_sequence(16) == 1


@pytest.mark.parametrize("task, length", [(CopyTask(), 2), (RecallTask(), 4), (RecallTask(queries=1), 4),
                                          (RecallTask(keys=4), 16), (RecallTask(queries=2), 8)])
def test_the_smallest_lengths_each_task_holds(task, length):
    task.check_length(length)
    inputs, _ = task.batch(length, 2, torch.Generator().manual_seed(0))
    assert inputs.shape == (2, length)


@pytest.mark.parametrize("task, length, message", [
    (CopyTask(), 1, "length must be an integer >= 2"),
    (CopyTask(), 6 + 1, "copy needs an even length"),
    (RecallTask(), 3, "length must be an integer >= 4"),
    (RecallTask(), 6, "recall needs a length a multiple of 4, got 6"),
    (RecallTask(queries=2), 6, "recall needs a length even and >= 8, got 6"),
    (RecallTask(keys=4), 20, "holds 5 pairs but has only 4 keys; raise keys to at least 5"),
])
def test_lengths_a_task_cannot_hold_are_refused_by_name(task, length, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        task.check_length(length)


def test_recall_values_use_every_value_symbol():
    task = RecallTask(keys=64, values=4)
    inputs, _ = draw(task, 16, seed=3)
    assert set(inputs[:, 1:8:2].flatten().tolist()) == {64, 65, 66, 67}
