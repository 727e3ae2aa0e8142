"""The synthetic tasks' sequences, their exact-match scorer, and randomized positions.

The synthetic tasks at their edges: which lengths they take and refuse (by name), recall with a set number of
questions, every draw from the caller's generator, and copies that hold the whole string.
"""

import pytest
import torch
import torch.nn.functional as F

from posenc import randomized_positions
from posenc.lm.model import LanguageModel, ModelConfig
from posenc.lm.tasks import IGNORE, CopyTask, RecallTask, exact_match
from posenc.lm.train import TrainConfig, train


def generator(seed=0):
    return torch.Generator().manual_seed(seed)


def copy_solver(inputs: torch.Tensor, task: CopyTask) -> torch.Tensor:
    """Logits of a perfect copier: after the separator at n, predict input t − n (one-hot). (B, T, V)."""
    logits = torch.zeros(*inputs.shape, task.vocab_size)
    for b, row in enumerate(inputs):
        n = int((row == task.symbols).nonzero()[0])
        for t in range(n, min(2 * n, len(row))):
            logits[b, t, row[t - n]] = 1.0
    return logits


def test_copy_sequences_are_a_string_a_separator_and_the_string_again():
    task = CopyTask(symbols=5)
    inputs, targets = task.batch(20, 64, generator())
    assert inputs.shape == targets.shape == (64, 20)
    sizes = []
    for row, target in zip(inputs, targets):
        n = int((row == 5).nonzero()[0])
        sizes.append(n)
        scored = target != IGNORE
        assert scored.sum() == n and torch.equal(target[scored], row[:n])  # the second copy, every symbol
        assert (row[2 * n + 1 :] == 6).all()  # padding after the copy
    assert min(sizes) >= 1 and max(sizes) == 10 and len(set(sizes)) > 5  # random lengths up to half
    full, _ = task.batch(20, 8, generator(), full=True)
    assert (full[:, 10] == 5).all()  # evaluation strings fill the length
    with pytest.raises(ValueError, match="copy needs an even length"):
        task.batch(21, 2, generator())


def test_recall_asks_every_pair_once_and_scores_its_value():
    task = RecallTask(keys=40, values=6)
    inputs, targets = task.batch(32, 16, generator())
    m = 8
    for row, target in zip(inputs, targets):
        keys, values = row[: 2 * m : 2], row[1 : 2 * m : 2]
        assert len(set(keys.tolist())) == m and (keys < 40).all() and ((values >= 40) & (values < 46)).all()
        assert row[2 * m] == 46  # the separator
        lookup = dict(zip(keys.tolist(), values.tolist()))
        asked = row[2 * m + 1 :: 2].tolist()
        scored = target[target != IGNORE].tolist()
        assert sorted(asked) == sorted(keys.tolist()) and len(scored) == m
        assert scored == [lookup[key] for key in asked]
    with pytest.raises(ValueError, match="holds 16 pairs but has only 8 keys; raise keys to at least 16"):
        RecallTask(keys=8).batch(64, 1, generator())
    with pytest.raises(ValueError, match="recall needs a length a multiple of 4"):
        task.batch(30, 1, generator())


def test_exact_match_fails_a_copy_with_one_wrong_token_and_scores_recall_per_answer():
    task = CopyTask(symbols=7)
    inputs, targets = task.batch(24, 32, generator(1), full=True)
    perfect = copy_solver(inputs, task)
    assert exact_match(perfect, targets, task).tolist() == [1.0] * 32
    one_wrong = perfect.clone()
    one_wrong[3, 17] = one_wrong[3, 17].roll(1)  # a single token of row 3
    scores = exact_match(one_wrong, targets, task)
    assert scores[3] == 0 and scores.sum() == 31
    recall = RecallTask(keys=20, values=4)
    inputs, targets = recall.batch(16, 2, generator())
    logits = F.one_hot(targets.clamp(min=0), recall.vocab_size).float()
    logits[0, -1] = logits[0, -1].roll(1)  # the last answer of row 0 wrong
    assert exact_match(logits, targets, recall).tolist() == [1.0, 1.0, 1.0, 0.0] + [1.0] * 4  # row 0, then row 1


def test_randomized_positions_are_sorted_distinct_subsets():
    positions = randomized_positions(64, 16, 128, generator())
    assert positions.shape == (64, 16) and positions.dtype == torch.int64
    assert (positions.diff(dim=-1) > 0).all() and positions.min() >= 0 and positions.max() < 128
    assert positions.max() > 100 and positions[:, 0].float().mean() < 16  # spread over the whole range
    assert torch.equal(positions, randomized_positions(64, 16, 128, generator()))
    assert torch.equal(randomized_positions(2, 5, 5), torch.arange(5).expand(2, -1))
    with pytest.raises(ValueError, match=r"max_position \(4\) must be at least the length \(5\)"):
        randomized_positions(1, 5, 4)


def test_training_feeds_randomized_positions_to_the_model(tmp_path, monkeypatch):
    task = CopyTask(symbols=4)
    model = LanguageModel(ModelConfig(encoding="rope", dim=16, num_layers=1, num_heads=2, vocab_size=task.vocab_size,
                                      max_positions=64))
    seen = []
    original = model.forward
    monkeypatch.setattr(model, "forward", lambda tokens, positions=None, **kw: seen.append(positions) or original(
        tokens, positions, **kw))
    config = TrainConfig(steps=3, batch_size=4, length=8, lr=1e-3, warmup=0, random_positions=64)
    train(model, task, config, checkpoint=tmp_path / "last.pt", device=torch.device("cpu"),
          sample=lambda spec, length, batch, g: spec.batch(length, batch, g))
    assert len(seen) == 3 and all(p.shape == (4, 8) and (p.diff(dim=-1) > 0).all() and p.max() < 64 for p in seen)
    assert not torch.equal(seen[0], seen[1]) and max(int(p.max()) for p in seen) > 8


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
