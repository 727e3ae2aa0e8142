"""evaluate(): every byte scored once, per window, under both protocols; checked against a closed form."""

import math

import pytest
import torch
from torch import nn

from posenc.lm.evaluate import evaluate


class Bigram(nn.Module):
    """Logits depend on the current byte only: every protocol must give each byte the same loss."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(256, 256, generator=torch.Generator().manual_seed(0)))

    def forward(self, tokens):
        return self.table[tokens]


class Positional(nn.Module):
    """Logits depend on the position inside the window only: the loss of a byte depends on where it is scored."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(64, 256, generator=torch.Generator().manual_seed(1)))

    def forward(self, tokens):
        return self.table[: tokens.shape[1]].expand(tokens.shape[0], -1, -1)


def closed_form_bits(model, windows):
    """Per-window mean bits of each byte given the byte before it, computed directly."""
    log_probs = torch.log_softmax(model.table, -1)
    nats = -log_probs[windows[:, :-1], windows[:, 1:]]  # (N, C)
    return (nats.mean(1) / math.log(2)).tolist()


@pytest.fixture
def windows():
    return torch.randint(0, 256, (5, 33), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("stride", [None, 1, 3, 8, 16])
def test_every_byte_is_scored_once_whatever_the_protocol(windows, stride):
    model = Bigram()
    result = evaluate(model, windows, [8, 16, 32], stride=stride)
    expected = closed_form_bits(model, windows)
    for length in (8, 16, 32):
        assert result["window_bits"][length] == pytest.approx(expected, abs=1e-5)
        assert result["bits_per_byte"][length] == pytest.approx(sum(expected) / 5, abs=1e-5)


def test_non_overlapping_pieces_start_at_each_multiple_of_the_length(windows):
    """With position-only logits, byte j of a window is scored at position j mod W."""
    model = Positional()
    result = evaluate(model, windows, [8, 32])
    log_probs = torch.log_softmax(model.table, -1)
    for length in (8, 32):
        positions = torch.arange(32) % length
        nats = -log_probs[positions, windows[:, 1:]]
        assert result["window_bits"][length] == pytest.approx((nats.mean(1) / math.log(2)).tolist(), abs=1e-5)


def test_sliding_windows_score_late_bytes_with_full_context(windows):
    """Stride 4, length 8: the first piece scores positions 0..7, every later piece its last 4 positions."""
    model = Positional()
    result = evaluate(model, windows, [8], stride=4)
    log_probs = torch.log_softmax(model.table, -1)
    positions = torch.tensor(list(range(8)) + [4, 5, 6, 7] * 6)
    nats = -log_probs[positions, windows[:, 1:]]
    assert result["window_bits"][8] == pytest.approx((nats.mean(1) / math.log(2)).tolist(), abs=1e-5)


def test_position_bins_hold_each_windows_values(windows):
    model = Positional()
    position = evaluate(model, windows, [8, 32], bins=4)["position_bits"]
    assert position["length"] == 32 and position["bin_edges"] == [0, 8, 16, 24, 32]
    per_window = torch.tensor(position["window_bits"])
    assert per_window.shape == (5, 4)
    assert per_window.mean(0).tolist() == pytest.approx(position["bits"], abs=1e-6)


def test_lengths_must_divide_the_window(windows):
    with pytest.raises(ValueError, match="not a whole number of lengths"):
        evaluate(Bigram(), windows, [8, 12])


class Linear(nn.Module):
    """Embedding then a linear layer: a bfloat16 autocast would move its losses by ~1e-2."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.embed = nn.Parameter(torch.randn(256, 64, generator=generator))
        self.out = nn.Linear(64, 256)

    def forward(self, tokens):
        return self.out(self.embed[tokens])


def test_small_batches_and_no_autocast_give_the_exact_float32_losses(windows):
    model = Linear()
    with torch.no_grad():
        log_probs = torch.log_softmax(model.out(model.embed), -1)
    expected = (-log_probs[windows[:, :-1], windows[:, 1:]]).mean(1) / math.log(2)
    for tokens_per_batch in (16, 4096):  # 2 pieces of 8 per forward, or all at once
        result = evaluate(model, windows, [8, 32], tokens_per_batch=tokens_per_batch)
        for length in (8, 32):
            assert result["window_bits"][length] == pytest.approx(expected.tolist(), abs=1e-5)


def test_position_bins_are_bits_by_closed_form(windows):
    model = Positional()
    position = evaluate(model, windows, [32], bins=4)["position_bits"]
    nats = -torch.log_softmax(model.table, -1)[torch.arange(32), windows[:, 1:]]  # (N, 32)
    expected = [(nats[:, a : a + 8].mean() / math.log(2)).item() for a in (0, 8, 16, 24)]
    assert position["bits"] == pytest.approx(expected, abs=1e-5)
