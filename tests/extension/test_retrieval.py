"""Multi-key retrieval: needles land where the grid says, and asking from the cache equals asking with the
whole prompt (same answer, same log-probability)."""

import pytest
import torch
import torch.nn.functional as F

from posenc.experiments.pretrained.measure import ByteTokens, tiny_llama
from posenc.extension import retrieval
from posenc.extension.self_extend import use_self_extend

TOKENS = ByteTokens()
TEXT = TOKENS.encode("def f(x):\n    return x * 2\n" * 20)


@pytest.mark.parametrize("wording", list(retrieval.FORMATS))
def test_needles_sit_at_their_depth_bands_and_the_haystack_has_the_asked_length(wording):
    haystack = retrieval.make_haystack(TOKENS.encode, TEXT, 2000, 4, 3, seed=0, format=wording)
    assert len(haystack.ids) == 2000 and len(haystack.needles) == 12 and haystack.format == wording
    assert [n.band for n in haystack.needles] == [b for b in range(4) for _ in range(3)]
    for needle in haystack.needles:
        start = round(needle.depth * 2000)
        sentence = TOKENS.encode(retrieval.FORMATS[wording].sentence(needle.label, needle.key))
        assert sentence[: len(TOKENS.encode(retrieval.FORMATS[wording].ask(needle.label)))] == TOKENS.encode(
            retrieval.FORMATS[wording].ask(needle.label))  # the question is the needle up to its key
        assert haystack.ids[start : start + len(sentence)] == sentence
        assert needle.band / 4 <= needle.depth < (needle.band + 1) / 4 + 0.05
    assert len({n.label for n in haystack.needles}) == 12 and all(n.key in retrieval.VALUES for n in haystack.needles)
    assert len({n.key for n in haystack.needles}) == 12  # every key its own word


def whole_prompt_answer(model, prefix, question, answer, steps):
    ids = torch.tensor([prefix + question + answer])
    logits = model(ids).logits[0]
    predicting = logits[len(prefix) + len(question) - 1 : -1]
    log_prob = F.log_softmax(predicting, -1).gather(1, ids[0, len(prefix) + len(question):, None]).sum().item()
    greedy = model.generate(torch.tensor([prefix + question]), max_new_tokens=steps, do_sample=False,
                            attention_mask=torch.ones(1, len(prefix) + len(question), dtype=torch.long),
                            pad_token_id=0)[0, len(prefix) + len(question):].tolist()
    return greedy, log_prob


@pytest.mark.parametrize("self_extend, wording", [(False, "secret-word"), (True, "remember")])
def test_asking_from_the_cache_equals_asking_with_the_whole_prompt(self_extend, wording):
    model = tiny_llama(0, 64).double()
    if self_extend:
        use_self_extend(model, 24, 3)
    haystack = retrieval.make_haystack(TOKENS.encode, TEXT, 300, 2, 2, seed=1, format=wording)
    records = retrieval.retrieve(model, haystack, TOKENS.encode, TOKENS.decode, max_new_tokens=5)
    whole = retrieval.retrieve(model, haystack, TOKENS.encode, TOKENS.decode, max_new_tokens=5, whole_prompt=True)
    for record, again, needle in zip(records, whole, haystack.needles):
        question = TOKENS.encode(retrieval.FORMATS[wording].ask(needle.label))
        greedy, log_prob = whole_prompt_answer(model, haystack.ids, question, TOKENS.encode(" " + needle.key), 5)
        assert record["log_prob"] == pytest.approx(log_prob, abs=1e-9) == again["log_prob"]
        assert record["answer"] == TOKENS.decode(greedy) == again["answer"]


def test_too_short_a_haystack_or_too_many_keys_is_refused():
    with pytest.raises(ValueError, match="retrieval length 100 is too short for 12 key sentences"):
        retrieval.make_haystack(TOKENS.encode, TEXT, 100, 4, 3, seed=0)
    with pytest.raises(ValueError, match="at most 16 labels per haystack; 20 keys"):
        retrieval.make_haystack(TOKENS.encode, TEXT, 10_000, 5, 4, seed=0)
    with pytest.raises(ValueError, match="--retrieval-format must be one of secret-word, remember, remember-twice, made-up, made-up-twice"):
        retrieval.make_haystack(TOKENS.encode, TEXT, 2000, 4, 3, seed=0, format="needle")
    assert retrieval.read_answer(" candle.\n The") == "candle" and retrieval.read_answer(" 123.") is None
    assert retrieval.read_answer(" candles") == "candles"  # exact match: the plural is not the key
    assert retrieval.read_answer(" Candle!") == "Candle"  # capitals are letters (and not the lower-case key)


@pytest.mark.parametrize("answer, correct", [
    (" {key}.\nThe", True), ("{key}", True), (" {key}, and more", True),
    (" {key}s", False), (" x{key}", False), (" {key}light", False), (" {stem}", False), (" the {key}", False),
    (" {key}{key}", False), ("", False)])
def test_a_key_is_found_only_when_the_answers_first_word_is_exactly_it(answer, correct):
    """Pins the wrong version that credits an answer merely holding the key (``key in answer``, or a first word that
    starts with it or contains it): the record of ``retrieve``, whose ``correct`` the tables average, must score the
    first word of the greedy continuation by exact match. ``decode`` here stands in for the model's continuation."""
    model = tiny_llama(0, 64).double()
    haystack = retrieval.make_haystack(TOKENS.encode, TEXT, 200, 1, 1, seed=3)
    key = haystack.needles[0].key
    text = answer.format(key=key, stem=key[:-1])
    [record] = retrieval.retrieve(model, haystack, TOKENS.encode, lambda ids: text, max_new_tokens=2)
    assert record["answer"] == text and record["key"] == key
    assert record["correct"] == correct
    assert (retrieval.read_answer(text) == key) is correct  # the word it scores is the continuation's first
