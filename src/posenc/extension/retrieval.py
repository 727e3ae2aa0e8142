"""Multi-key retrieval from one prefilled haystack (RULER's multi-key needle, Hsieh et al. 2024).

Labelled keys ("The secret word for kayak: candle.") are planted at several depths of one long text. The haystack
is run once; every question ("The secret word for kayak:") then continues from its KV cache, which is cropped back
to the haystack after each one, so a haystack costs one long forward plus a few short ones. Per key: the greedy
answer, scored by exact match of its first word (no substring credit), and the teacher-forced log-probability of
the right word, which shows partial decay.

The wording of a key and its question is a ``Format`` (``FORMATS``). Which one a model answers inside its own
context is measured, not assumed: ``posenc pretrained`` asks the unscaled model on dev documents at half its
context, format after format in ``CALIBRATION_ORDER``, until one reaches ``CALIBRATION_BAR`` (``--retrieval-format
auto``), and plants the test keys in the best it asked (docs/pretrained.md has SmolLM2-135M's calibration). In every
format the label is the last word before the answer. RULER's multi-value and variable-tracking questions
(``retrieval_tasks``) can be planted beside the keys, worded by the same format, and asked from the same cache.

Asking from the cache equals asking with the whole prompt at once (tests say so) for every scaling whose
frequencies are fixed. ``dynamic`` NTK (and LongRoPE across its switch) changes frequencies with the length, so
keys cached under the haystack's frequencies would be read under the question's: for those, ``whole_prompt=True``
runs haystack + question as one sequence per key (one long forward per key, as a user of that scaling would).
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import retrieval_tasks

# Labels are words unlikely in the text (not colours, which the Bible uses); MADE_UP_LABELS mean nothing at all, so
# no label pulls the answer toward a word it evokes ("mango = banana").
LABELS = ("kayak", "tractor", "violin", "penguin", "laptop", "tulip", "volcano", "saxophone", "cactus", "rocket",
          "igloo", "walrus", "bicycle", "pyramid", "tornado", "mango")
VALUES = ("apple", "river", "candle", "garden", "silver", "thunder", "pencil", "window", "orange", "planet", "castle",
          "forest", "button", "mirror", "engine", "pillow", "rabbit", "ticket", "wallet", "bridge", "basket", "copper",
          "meadow", "parrot", "saddle", "lantern", "marble", "pepper", "harbor", "velvet", "ladder", "cotton")
MADE_UP_LABELS = ("blicket", "wug", "zorp", "glorp", "snerk", "plimble", "vornak", "quibble", "trellox", "mrobin",
                  "yintar", "fepple", "daxon", "kirrup", "toveth", "brindle")


@dataclass(frozen=True)
class Format:
    """How a key is planted and asked: ``needle`` and ``question`` templates over {label} (and {key}); the question
    is the needle's text up to its key, so the answer is the key word that follows it."""
    needle: str
    question: str
    labels: tuple[str, ...] = LABELS

    def sentence(self, label: str, key: str) -> str:
        return self.needle.format(label=label, key=key)

    def ask(self, label: str) -> str:
        return self.question.format(label=label)


# Candidate wordings: the first posenc used, and what SmolLM2-135M answered best of fourteen tried on dev documents
# at half its context (docs/pretrained.md). A short "label = key" line beats a sentence; made-up labels beat real words
# (a real one pulls the answer toward a word it evokes); saying the pair twice helps a weak retriever.
REMEMBER = Format("\nRemember: {label} = {key}.\n", "\nRemember: {label} =")
REMEMBER_TWICE = Format("\nRemember: {label} = {key}. Remember: {label} = {key}.\n", "\nRemember: {label} =")
FORMATS = {
    "secret-word": Format("\nThe secret word for {label}: {key}.\n", "\nThe secret word for {label}:"),
    "remember": REMEMBER,
    "remember-twice": REMEMBER_TWICE,
    "made-up": Format(REMEMBER.needle, REMEMBER.question, MADE_UP_LABELS),
    "made-up-twice": Format(REMEMBER_TWICE.needle, REMEMBER_TWICE.question, MADE_UP_LABELS),
}
DEFAULT_FORMAT = "secret-word"
# The order ``--retrieval-format auto`` tries the wordings in, stopping at the first that the unscaled model answers
# at CALIBRATION_BAR on dev: SmolLM2-135M's ranking on dev documents (docs/pretrained.md), most keys first.
CALIBRATION_ORDER = ("made-up-twice", "made-up", "remember-twice", "remember", "secret-word")
CALIBRATION_BAR = 0.8  # the share of dev keys found at half the context that makes a wording good enough


def check_format(name: str) -> Format:
    """The ``Format`` called ``name``; a ValueError lists the known ones."""
    if name not in FORMATS:
        raise ValueError(f"--retrieval-format must be one of {', '.join(FORMATS)} (or auto), got {name!r}")
    return FORMATS[name]


@dataclass(frozen=True)
class Needle:
    label: str
    key: str  # one word of VALUES
    depth: float  # where its sentence starts, as a fraction of the haystack
    band: int  # which depth band it was drawn for


@dataclass(frozen=True)
class Haystack:
    ids: list[int]  # exactly `length` token ids
    needles: tuple[Needle, ...]
    spans: tuple[tuple[int, int], ...] = ()  # [start, end) of each needle's sentence in ids
    format: str = DEFAULT_FORMAT  # a key of FORMATS: how the needles were planted, and so how they are asked
    questions: tuple[retrieval_tasks.Question, ...] = ()  # multi-value and variable-tracking, asked after the keys

    def scored(self) -> torch.Tensor:
        """(length − 1,) bool: next-token targets that are text, not a needle's sentence (the loss reads these)."""
        keep = torch.ones(len(self.ids), dtype=torch.bool)
        for start, end in self.spans:
            keep[start:end] = False
        return keep[1:]


def depth_grid(bands: int, per_band: int) -> list[tuple[int, float]]:
    """(band, depth) for ``per_band`` evenly spaced depths inside each of ``bands`` equal bands of [0, 1)."""
    return [(b, (b + (i + 0.5) / per_band) / bands) for b in range(bands) for i in range(per_band)]


def make_haystack(encode, text_ids: list[int], length: int, bands: int, per_band: int, seed: int,
                  format: str = DEFAULT_FORMAT, tasks: dict[str, int] | None = None, task_size: int = 2) -> Haystack:
    """``length`` tokens of ``text_ids`` (repeated if short) with ``bands × per_band`` labelled key sentences,
    worded as ``FORMATS[format]``, and the questions of ``tasks`` ({task: questions}, ``retrieval_tasks``; each of
    ``task_size`` values or links) planted around them. Without tasks, the haystack of a seed is what it was before
    tasks existed: they draw their labels and words after the keys'."""
    wording = check_format(format)
    tasks = tasks or {}
    retrieval_tasks.check_tasks(tasks, task_size)
    grid = depth_grid(bands, per_band)
    labels_needed = len(grid) + retrieval_tasks.labels_needed(tasks, task_size)
    if labels_needed > len(wording.labels):
        raise ValueError(f"at most {len(wording.labels)} labels per haystack; {len(grid)} keys (bands × keys per "
                         f"band) and the tasks' questions need {labels_needed}")
    rng = random.Random(seed)
    labels = rng.sample(wording.labels, len(grid))
    keys = rng.sample(VALUES, len(grid))
    questions, task_sentences = retrieval_tasks.plant(
        tasks, task_size, wording.sentence, rng, [label for label in wording.labels if label not in labels],
        [value for value in VALUES if value not in keys])
    planted = sorted([(depth, wording.sentence(label, key), (label, key, band))
                      for (band, depth), label, key in zip(grid, labels, keys)]
                     + [(s.depth, s.text, s.question) for s in task_sentences], key=lambda entry: entry[0])
    sentences = [encode(text) for _, text, _ in planted]
    budget = length - sum(len(s) for s in sentences)
    if budget < len(planted) or not text_ids:
        raise ValueError(f"retrieval length {length} is too short for {len(planted)} key sentences "
                         f"({length - budget} tokens)")
    filler = (text_ids * (budget // len(text_ids) + 1))[:budget]
    ids, needles, spans, taken, starts = [], [], [], 0, {}
    for (depth, _, owner), sentence in zip(planted, sentences):
        cut = round(depth * budget)
        ids += filler[taken:cut]
        taken = cut
        if isinstance(owner, tuple):
            needles.append(Needle(owner[0], owner[1], len(ids) / length, owner[2]))
        else:
            starts.setdefault(owner, len(ids) / length)
        spans.append((len(ids), len(ids) + len(sentence)))
        ids += sentence
    ids += filler[taken:]
    placed = tuple(dataclasses.replace(q, depth=starts[i], band=min(int(starts[i] * bands), bands - 1))
                   for i, q in enumerate(questions))
    return Haystack(ids, tuple(needles), tuple(spans), format, placed)


def read_answer(text: str) -> str | None:
    """The first word (a run of letters) of a continuation."""
    match = re.search(r"[A-Za-z]+", text)
    return match.group(0) if match else None


@torch.no_grad()
def ask_from_cache(model, cache, prefix_length: int, question: list[int], answer: list[int], max_new_tokens: int = 8,
                   last_logits: torch.Tensor | None = None) -> tuple[list[int], float]:
    """Continue a cached prefix with ``question``: (greedy continuation ids, log-probability of ``answer`` ids
    teacher-forced after the question, nats). The cache is cropped back to ``prefix_length`` afterwards.
    ``last_logits`` (V,): the prefix's last logits, needed when ``question`` is empty."""
    device = next(model.parameters()).device
    forced = torch.tensor([question + answer], device=device)
    positions = torch.arange(prefix_length, prefix_length + forced.shape[1], device=device)[None]
    logits = model(input_ids=forced, past_key_values=cache, position_ids=positions, use_cache=True).logits[0]
    logits = logits.double() if logits.dtype == torch.float64 else logits.float()
    if question:
        predicting = logits[len(question) - 1 : -1]  # (len(answer), V): the logits that predict each answer token
    else:
        predicting = torch.cat([last_logits.to(logits.dtype)[None], logits[:-1]])
    log_prob = F.log_softmax(predicting, dim=-1).gather(1, forced[0, len(question):, None]).sum().item()
    _crop(cache, prefix_length + len(question))
    greedy, step = [], predicting[0].argmax().item()
    for offset in range(max_new_tokens):
        greedy.append(step)
        if offset == max_new_tokens - 1:
            break
        position = torch.tensor([[prefix_length + len(question) + offset]], device=device)
        out = model(input_ids=torch.tensor([[step]], device=device), past_key_values=cache, position_ids=position,
                    use_cache=True)
        step = out.logits[0, -1].argmax().item()
    _crop(cache, prefix_length)
    return greedy, log_prob


def _crop(cache, length: int) -> None:
    """Keep the first ``length`` cached tokens (transformers 5's ``crop`` takes how many to remove, negated)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@torch.no_grad()
def ask_whole(model, prefix: list[int], question: list[int], answer: list[int], max_new_tokens: int = 8
              ) -> tuple[list[int], float]:
    """``ask_from_cache`` with no shared cache: the whole prompt runs again for this question."""
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([prefix + question], device=device), use_cache=True)
    return ask_from_cache(model, out.past_key_values, len(prefix) + len(question), [], answer, max_new_tokens,
                          last_logits=out.logits[0, -1])


@torch.no_grad()
def retrieve(model, haystack: Haystack, encode, decode, max_new_tokens: int = 8, whole_prompt: bool = False,
             cache=None) -> list[dict]:
    """Ask for every key of a haystack, then each of its task questions: from ``cache`` (the haystack's own,
    prefilled by the caller, e.g. while scoring its loss) or from one prefill made here; ``whole_prompt``: haystack
    + question prefilled per question instead. One record per needle, then one per question; a list's answer may
    run ``max_new_tokens`` per word it names."""
    device = next(model.parameters()).device
    if cache is None and not whole_prompt:
        cache = model(input_ids=torch.tensor([haystack.ids], device=device), use_cache=True).past_key_values

    def ask(question: str, answer: str, steps: int) -> tuple[str, float]:
        question_ids, answer_ids = encode(question), encode(answer)
        if whole_prompt:
            greedy, log_prob = ask_whole(model, haystack.ids, question_ids, answer_ids, steps)
        else:
            greedy, log_prob = ask_from_cache(model, cache, len(haystack.ids), question_ids, answer_ids, steps)
        return decode(greedy), log_prob

    records, wording = [], FORMATS[haystack.format]
    for needle in haystack.needles:
        text, log_prob = ask(wording.ask(needle.label), " " + needle.key, max_new_tokens)
        records.append({"task": "multi-key", "label": needle.label, "key": needle.key, "depth": needle.depth,
                        "band": needle.band, "answer": text, "correct": read_answer(text) == needle.key,
                        "log_prob": log_prob})
    for question in haystack.questions:
        text, log_prob = ask(question.prompt, " " + ", ".join(question.answers),
                             max_new_tokens * len(question.answers))
        records.append({"task": question.task, "label": question.label, "answers": list(question.answers),
                        "depth": question.depth, "band": question.band, "answer": text,
                        **retrieval_tasks.score(question, text), "log_prob": log_prob})
    return records
