"""RULER's multi-value and variable-tracking questions (Hsieh et al. 2024), planted beside the multi-key keys of a
``retrieval.Haystack`` and asked from the same KV cache.

- **multi-value**: one label said with ``size`` different keys at spread depths ("Remember: wug = candle." …
  "Remember: wug = river."), asked "The 2 values of wug are:";
- **variable tracking**: a chain of ``size`` assignments from a key ("Remember: wug = candle." … "Remember: zorp =
  wug."), asked "The 2 names equal to candle are:".

Each sentence is worded by the haystack's ``Format`` (its needle template with the label and key filled in), so the
wording calibrated for multi-key carries all three tasks. An answer is right when its first ``size`` words (runs of
letters, lower-cased, "and" skipped) are exactly the expected words in any order: no substring credit, no credit for
part of a list (``words_found`` counts those, for the record).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

TASKS = ("multi-key", "multi-value", "variable-tracking")
EXTRA_TASKS = TASKS[1:]  # what ``--retrieval-tasks`` adds to the multi-key keys every haystack has
QUESTIONS = {"multi-value": "\nThe {count} values of {label} are:",
             "variable-tracking": "\nThe {count} names equal to {label} are:"}


@dataclass(frozen=True)
class Question:
    task: str  # one of EXTRA_TASKS
    label: str  # what is asked about: the multi-value label, or the key a chain starts from
    answers: tuple[str, ...]  # the words a right answer lists (in the order they were planted)
    depth: float = 0.0  # where its first sentence starts, as a fraction of the haystack (set once planted)
    band: int = 0  # the depth band of that first sentence

    @property
    def prompt(self) -> str:
        return QUESTIONS[self.task].format(count=len(self.answers), label=self.label)


@dataclass(frozen=True)
class Sentence:
    depth: float  # where it is planted, as a fraction of the text around the sentences
    text: str
    question: int  # which Question it belongs to (an index into plant's list)


def check_tasks(tasks: dict[str, int], size: int) -> None:
    """``tasks``: {task of EXTRA_TASKS: questions per haystack}; ``size``: values per multi-value question, links
    per variable-tracking chain."""
    for task, count in tasks.items():
        if task not in EXTRA_TASKS:
            raise ValueError(f"--retrieval-tasks must name tasks of {', '.join(EXTRA_TASKS)}, got {task!r}")
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"--task-questions must be an integer >= 1, got {count!r}")
    if tasks and (not isinstance(size, int) or size < 2):
        raise ValueError(f"--task-size must be an integer >= 2 (a list of one is a multi-key question), got {size!r}")


def labels_needed(tasks: dict[str, int], size: int) -> int:
    """Distinct labels the questions use: one per multi-value question, ``size`` names per chain."""
    return tasks.get("multi-value", 0) + size * tasks.get("variable-tracking", 0)


def values_needed(tasks: dict[str, int], size: int) -> int:
    """Distinct key words the questions use: ``size`` per multi-value question, one per chain."""
    return size * tasks.get("multi-value", 0) + tasks.get("variable-tracking", 0)


def plant(tasks: dict[str, int], size: int, sentence: Callable[[str, str], str], rng: random.Random,
          labels: list[str], values: list[str]) -> tuple[list[Question], list[Sentence]]:
    """The questions of ``tasks`` and their sentences (worded by ``sentence(label, key)``), labels and keys drawn
    by ``rng`` from ``labels`` and ``values`` (those no other key of the haystack uses). The m sentences of the q-th
    of n questions of a task sit one in each of m equal depth bands, at (j + (q + ½) / n) / m, in the order a
    reader must follow them (a chain's key first)."""
    check_tasks(tasks, size)
    names = rng.sample(labels, labels_needed(tasks, size))
    words = rng.sample(values, values_needed(tasks, size))
    questions, sentences = [], []
    for task in EXTRA_TASKS:
        count = tasks.get(task, 0)
        for q in range(count):
            depths = [(j + (q + 0.5) / count) / size for j in range(size)]
            if task == "multi-value":
                label, keys = names.pop(), tuple(words.pop() for _ in range(size))
                texts = [sentence(label, key) for key in keys]
                questions.append(Question(task, label, keys))
            else:
                key, chain = words.pop(), tuple(names.pop() for _ in range(size))
                texts = [sentence(name, earlier) for name, earlier in zip(chain, (key,) + chain[:-1])]
                questions.append(Question(task, key, chain))
            sentences += [Sentence(depth, text, len(questions) - 1) for depth, text in zip(depths, texts)]
    return questions, sentences


def answer_words(text: str, count: int) -> list[str]:
    """The first ``count`` words of a continuation: runs of letters, lower-cased, the joining "and" skipped."""
    words = [w.lower() for w in re.findall(r"[A-Za-z]+", text)]
    return [w for w in words if w != "and"][:count]


def score(question: Question, text: str) -> dict:
    """{"correct": the first words are exactly the answers (any order), "words_found": how many answers are among
    them}."""
    words = answer_words(text, len(question.answers))
    return {"correct": sorted(words) == sorted(question.answers),
            "words_found": len(set(words) & set(question.answers))}
