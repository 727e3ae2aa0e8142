"""The synthetic tasks' sequences, their exact-match scorer, and randomized positions."""

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
