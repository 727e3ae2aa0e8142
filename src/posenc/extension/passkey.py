"""Passkey retrieval (Mohtashami & Jaggi 2023; used by the PI and YaRN papers).

A 5-digit key sits at a chosen depth of filler text; the model reads the whole prompt
and must continue "The pass key is" with the key. Prompts are assembled from token
lists, so the key starts exactly at ``intro + round(depth · filler)`` tokens and the
prompt is exactly ``length`` tokens long. Keys come from a seeded generator.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"


@dataclass(frozen=True)
class PasskeyPrompt:
    ids: list[int]  # exactly `length` token ids
    key: str  # 5 digits
    key_start: int  # index of the key sentence's first token
    depth: float


def make_prompt(encode, length: int, depth: float, key: str) -> PasskeyPrompt:
    """A prompt of ``length`` tokens with the key sentence at ``depth`` (0: first, 1: last) of the filler.

    ``encode``: text -> list of token ids (no special tokens).
    """
    if not 0 <= depth <= 1:
        raise ValueError(f"passkey depth must be in [0, 1], got {depth}")
    intro, key_ids, question = encode(INTRO), encode(KEY.format(key=key)), encode(QUESTION)
    budget = length - len(intro) - len(key_ids) - len(question)
    if budget < 1:
        raise ValueError(f"passkey length {length} is too short: the fixed text alone takes "
                         f"{length - budget} tokens")
    filler_once = encode(FILLER)
    filler = (filler_once * (budget // len(filler_once) + 1))[:budget]
    before = round(depth * budget)
    ids = intro + filler[:before] + key_ids + filler[before:] + question
    return PasskeyPrompt(ids, key, len(intro) + before, depth)


def read_answer(text: str) -> str | None:
    """The first run of digits in a continuation, e.g. ' 52718. Remember' -> '52718'."""
    match = re.search(r"\d+", text)
    return match.group(0) if match else None


def keys(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{rng.randint(10000, 99999)}" for _ in range(count)]


@torch.no_grad()
def answer(model, prompt: PasskeyPrompt, decode, max_new_tokens: int = 8) -> str:
    """Greedy continuation of the prompt, decoded to text. ``model``: a transformers causal LM."""
    ids = torch.tensor([prompt.ids], device=next(model.parameters()).device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=model.config.eos_token_id or 0)
    return decode(out[0, ids.shape[1]:].tolist())
