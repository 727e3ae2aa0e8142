"""Synthetic tasks on which length generalisation is pass/fail: copy and associative recall.

A task makes (inputs, targets) batches of token ids with targets ``IGNORE`` wherever nothing
is scored, so the same training loop and loss serve it as serve the byte LM. ``length`` is
the number of input tokens; a task scales its content with it, so a model trained at L and
tested at 8L faces 8x the content and 8x the distances.

- ``copy``: a random string over ``symbols`` symbols, a separator, the string again; the
  second copy is scored. Training strings have a random length up to the longest that fits;
  evaluation strings fill the whole length. Symbols repeat, so a model must address the
  position to copy from, not only match content.
- ``recall``: ``m`` (key, value) pairs with distinct keys, a separator, then keys from the
  pairs (every pair once, shuffled, unless ``queries`` says how many) each followed by its
  value; the values after the separator are scored.
  Keys never repeat inside a sequence, so finding the key is content matching and reading
  its value is one step to the right.

Exact match: a copy is right when every scored token is the argmax; a recall answer is right on its own.
Shapes: B batch, T = ``length`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .. import checks

IGNORE = -100  # F.cross_entropy's default ignore_index


@dataclass(frozen=True)
class CopyTask:
    symbols: int = 16

    @property
    def vocab_size(self) -> int:
        return self.symbols + 2  # symbols, separator, padding

    def scored_per_sequence(self, length: int) -> int:
        """How many of ``exact_match``'s items one evaluation sequence gives: one (the whole copy)."""
        return 1

    def check_length(self, length: int) -> None:
        if checks.positive_int("length", length, minimum=2) % 2:
            raise ValueError(f"copy needs an even length (string, separator, string), got {length}")

    def batch(self, length: int, batch: int, generator: torch.Generator, full: bool = False) -> tuple[Tensor, Tensor]:
        """(B, T) inputs and targets. ``full``: every string fills the length (evaluation)."""
        self.check_length(length)
        longest = length // 2
        separator, padding = self.symbols, self.symbols + 1
        sizes = torch.full((batch,), longest) if full else torch.randint(1, longest + 1, (batch,), generator=generator)
        strings = torch.randint(0, self.symbols, (batch, longest), generator=generator)
        index = torch.arange(length + 1)[None, :]  # (1, T + 1)
        n = sizes[:, None]  # (B, 1)
        first, second = index < n, (index > n) & (index <= 2 * n)
        source = torch.where(second, index - n - 1, index).clamp(max=longest - 1)  # which string symbol sits here
        sequence = torch.where(first | second, strings.gather(1, source), torch.full_like(source, padding))
        sequence = torch.where(index == n, separator, sequence)  # (B, T + 1)
        targets = sequence[:, 1:].masked_fill(~second[:, 1:], IGNORE)
        return sequence[:, :-1], targets


@dataclass(frozen=True)
class RecallTask:
    keys: int = 64
    values: int = 16
    queries: int | None = None  # None: every pair is asked once, in a random order

    @property
    def vocab_size(self) -> int:
        return self.keys + self.values + 1  # keys, values, separator

    def pairs(self, length: int) -> int:
        """Pairs that fit: 2m pair tokens + separator + 2q query tokens = T + 1."""
        return length // 4 if self.queries is None else (length - 2 * self.queries) // 2

    def asked(self, length: int) -> int:
        return self.pairs(length) if self.queries is None else self.queries

    def scored_per_sequence(self, length: int) -> int:
        """How many of ``exact_match``'s items one evaluation sequence gives: one per asked pair."""
        return self.asked(length)

    def check_length(self, length: int) -> None:
        checks.positive_int("length", length, minimum=4)
        pairs = self.pairs(length)
        fits = 2 * pairs + 2 * self.asked(length) == length and 1 <= self.asked(length) <= pairs
        if not fits:
            need = "a multiple of 4" if self.queries is None else f"even and >= {4 * self.queries}"
            raise ValueError(f"recall needs a length {need}, got {length}")
        if pairs > self.keys:
            raise ValueError(f"recall at length {length} holds {pairs} pairs but has only {self.keys} keys; "
                             f"raise keys to at least {pairs}")

    def batch(self, length: int, batch: int, generator: torch.Generator, full: bool = False) -> tuple[Tensor, Tensor]:
        """(B, T) inputs and targets; ``full`` is accepted for symmetry (recall always fills the length)."""
        self.check_length(length)
        m, q = self.pairs(length), self.asked(length)
        keys = torch.rand(batch, self.keys, generator=generator).argsort(-1)[:, :m]  # distinct keys per row
        values = self.keys + torch.randint(0, self.values, (batch, m), generator=generator)
        asked = torch.rand(batch, m, generator=generator).argsort(-1)[:, :q]  # distinct pairs asked
        pairs = torch.stack((keys, values), -1).flatten(1)  # (B, 2m)
        questions = torch.stack((keys.gather(1, asked), values.gather(1, asked)), -1).flatten(1)  # (B, 2q)
        separator = torch.full((batch, 1), self.keys + self.values)
        sequence = torch.cat((pairs, separator, questions), 1)  # (B, T + 1)
        scored = torch.zeros_like(sequence, dtype=torch.bool)
        scored[:, 2 * m + 2 :: 2] = True  # the value after each asked key
        targets = sequence[:, 1:].masked_fill(~scored[:, 1:], IGNORE)
        return sequence[:, :-1], targets


TASKS = {"copy": CopyTask, "recall": RecallTask}


@torch.no_grad()
def exact_match(logits: Tensor, targets: Tensor, task) -> Tensor:
    """Per scored item, 1.0 if right: per sequence for copy (every scored token), per answer for recall.
    logits (B, T, V), targets (B, T) -> (B,) for copy, (B · queries,) for recall."""
    scored = targets != IGNORE
    right = (logits.argmax(-1) == targets) | ~scored
    if isinstance(task, CopyTask):
        return right.all(-1).float()
    return right[scored].float()
