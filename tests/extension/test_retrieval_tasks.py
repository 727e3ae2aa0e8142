"""RULER's multi-value and variable-tracking questions: planted where the plan says, worded by the haystack's
format, scored by exact words, and asked from the cache as from the whole prompt."""

import hashlib
import json

import pytest
import torch

from posenc.experiments.pretrained.measure import ByteTokens, tiny_llama
from posenc.extension import retrieval, retrieval_tasks
from posenc.extension.retrieval_tasks import Question, answer_words, score
from tests.extension.test_retrieval import whole_prompt_answer

TOKENS = ByteTokens()
TEXT = TOKENS.encode("def f(x):\n    return x * 2\n" * 20)
TASKS = {"multi-value": 2, "variable-tracking": 2}
#: sha256 of three haystacks with tasks as 2688fd0 made them (the multi-value one uses all 16 labels)
DIGEST_WITH_TASKS = "05dd4dab56f5679f48a7a1c049f9b168926ab549f778368949fc9d0e88070c41"


def planted_text(haystack, span) -> str:
    return TOKENS.decode(haystack.ids[span[0] : span[1]])


def test_without_tasks_a_haystack_is_what_it_was_before_tasks_existed():
    """The digest of ten haystacks as the code made them before tasks existed (commit 818152e): committed
    measurements and resumed runs stay valid."""
    made = []
    for wording in retrieval.FORMATS:
        for seed in (0, 7):
            h = retrieval.make_haystack(TOKENS.encode, TEXT, 3000, 4, 2, seed=seed, format=wording)
            made.append([h.ids, [(n.label, n.key, n.depth, n.band) for n in h.needles], h.spans])
            assert h.questions == ()
    digest = hashlib.sha256(json.dumps(made).encode()).hexdigest()
    assert digest == "c403f1505b8731be6433c931db7e4616b7756080fdcbfc1f3562c8d60971abdf"


@pytest.mark.parametrize("wording", ["remember", "made-up-twice"])
def test_each_question_plants_its_sentences_in_order_one_per_band_worded_as_the_keys(wording):
    size = 3
    haystack = retrieval.make_haystack(TOKENS.encode, TEXT, 4000, 2, 2, seed=3, format=wording, tasks=TASKS,
                                       task_size=size)
    form = retrieval.FORMATS[wording]
    assert len(haystack.ids) == 4000 and len(haystack.needles) == 4 and len(haystack.spans) == 4 + 4 * size
    texts = [planted_text(haystack, span) for span in haystack.spans]
    starts = [span[0] for span in haystack.spans]
    assert starts == sorted(starts) and all(a[1] <= b[0] for a, b in zip(haystack.spans, haystack.spans[1:]))
    multi, chains = haystack.questions[:2], haystack.questions[2:]
    assert [q.task for q in haystack.questions] == ["multi-value"] * 2 + ["variable-tracking"] * 2
    for q in haystack.questions:
        if q.task == "multi-value":
            assert q.prompt == f"\nThe {size} values of {q.label} are:"
            mine = [form.sentence(q.label, key) for key in q.answers]
        else:
            assert q.prompt == f"\nThe {size} names equal to {q.label} are:"
            mine = [form.sentence(name, earlier) for name, earlier in zip(q.answers, (q.label,) + q.answers[:-1])]
        assert len(q.answers) == size
        assert [t for t in texts if t in mine] == mine  # in planted order: a chain's key first, read forward
        own = [haystack.spans[texts.index(t)] for t in mine]
        assert [int(start / 4000 * size) for start, _ in own] == list(range(size))  # one in each of size bands
        assert q.depth == own[0][0] / 4000 and q.band == int(q.depth * 2)  # 2 bands of keys
    labels = [n.label for n in haystack.needles] + [q.label for q in multi] + [n for q in chains for n in q.answers]
    assert len(set(labels)) == len(labels) and set(labels) <= set(form.labels)
    words = [n.key for n in haystack.needles] + [w for q in multi for w in q.answers] + [q.label for q in chains]
    assert len(set(words)) == len(words) and set(words) <= set(retrieval.VALUES)
    scored = haystack.scored()
    assert scored.dtype == torch.bool
    for start, end in haystack.spans:  # no sentence of any task is scored by the loss
        assert not scored[max(start - 1, 0) : end - 1].any()
    assert scored.sum() == 3999 - sum(end - start for start, end in haystack.spans)


def test_the_keys_of_a_seed_do_not_move_when_tasks_are_added():
    plain = retrieval.make_haystack(TOKENS.encode, TEXT, 4000, 2, 2, seed=5)
    tasked = retrieval.make_haystack(TOKENS.encode, TEXT, 4000, 2, 2, seed=5, tasks=TASKS)
    assert [(n.label, n.key, n.band) for n in plain.needles] == [(n.label, n.key, n.band) for n in tasked.needles]


@pytest.mark.parametrize("text, correct, found", [
    (" candle, river.", True, 2), (" river and candle", True, 2), (" Candle, River", True, 2),
    (" candle, candle", False, 1), (" candles, river", False, 1), (" candle", False, 1),
    (" apple, candle, river", False, 1), ("", False, 0), (" 3, candle, river", True, 2)])
def test_an_answer_is_right_only_when_its_first_words_are_exactly_the_list(text, correct, found):
    assert score(Question("multi-value", "wug", ("candle", "river")), text) == {"correct": correct,
                                                                                "words_found": found}


def test_answer_words_reads_letters_lower_cased_and_skips_the_joining_and():
    assert answer_words(" Candle and RIVER, and pencil.\nThe", 2) == ["candle", "river"]
    assert answer_words(" wug-zorp", 3) == ["wug", "zorp"]


def test_asking_a_task_question_from_the_cache_equals_asking_with_the_whole_prompt():
    model = tiny_llama(0, 64).double()
    haystack = retrieval.make_haystack(TOKENS.encode, TEXT, 400, 1, 1, seed=2, format="remember", tasks=TASKS)
    # two tokens per key: the cache is cropped back by exactly one after each key (an off-by-one keeps it)
    records = retrieval.retrieve(model, haystack, TOKENS.encode, TOKENS.decode, max_new_tokens=2)
    whole = retrieval.retrieve(model, haystack, TOKENS.encode, TOKENS.decode, max_new_tokens=2, whole_prompt=True)
    assert [r["task"] for r in records] == ["multi-key", "multi-value", "multi-value", "variable-tracking",
                                            "variable-tracking"]
    for record, again, question in zip(records[1:], whole[1:], haystack.questions):
        greedy, log_prob = whole_prompt_answer(model, haystack.ids, TOKENS.encode(question.prompt),
                                               TOKENS.encode(" " + ", ".join(question.answers)), 2 * 2)
        assert record["log_prob"] == pytest.approx(log_prob, abs=1e-9) == again["log_prob"]
        assert record["answer"] == TOKENS.decode(greedy) == again["answer"]  # 2 tokens per word of the list
        assert record["answers"] == list(question.answers) and record["label"] == question.label
        assert {k: record[k] for k in ("correct", "words_found")} == score(question, record["answer"])
        assert (record["depth"], record["band"]) == (question.depth, question.band)


@pytest.mark.parametrize("tasks, size, message", [
    ({"needle": 1}, 2, "--retrieval-tasks must name tasks of multi-value, variable-tracking, got 'needle'"),
    ({"multi-value": 0}, 2, "--task-questions must be an integer >= 1, got 0"),
    ({"variable-tracking": 1}, 1, "--task-size must be an integer >= 2"),
    ({"variable-tracking": 4}, 4, r"at most 16 labels per haystack; 4 keys \(bands × keys per band\) and the "
                                  r"tasks' questions need 20"),
])
def test_bad_tasks_are_refused_naming_the_flag(tasks, size, message):
    with pytest.raises(ValueError, match=message):
        retrieval.make_haystack(TOKENS.encode, TEXT, 4000, 2, 2, seed=0, tasks=tasks, task_size=size)


def test_the_label_and_word_budgets_are_what_the_questions_use():
    assert retrieval_tasks.labels_needed({"multi-value": 2, "variable-tracking": 3}, 4) == 2 + 12
    assert retrieval_tasks.values_needed({"multi-value": 2, "variable-tracking": 3}, 4) == 8 + 3


def test_a_question_is_banded_by_its_first_sentence_and_every_label_may_be_used():
    haystack = retrieval.make_haystack(TOKENS.encode, TEXT, 4000, 4, 1, seed=0, format="remember",
                                       tasks={"multi-value": 2})
    assert [q.band for q in haystack.questions] == [0, 1]  # first sentences at 1/8 and 3/8 of the text
    full = retrieval.make_haystack(TOKENS.encode, TEXT, 4000, 4, 1, seed=0, format="remember",
                                   tasks={"variable-tracking": 4}, task_size=3)  # 4 keys + 12 names: all 16
    assert len({n.label for n in full.needles} | {name for q in full.questions for name in q.answers}) == 16


def test_too_short_a_haystack_names_the_tokens_its_sentences_need():
    haystack = retrieval.make_haystack(TOKENS.encode, TEXT, 4000, 1, 1, seed=0, format="remember", tasks=TASKS)
    needed = sum(end - start for start, end in haystack.spans)
    with pytest.raises(ValueError, match=rf"retrieval length {needed + 8} is too short for 9 key sentences "
                                         rf"\({needed} tokens\)"):  # 1 key and 4 questions of 2 sentences
        retrieval.make_haystack(TOKENS.encode, TEXT, needed + 8, 1, 1, seed=0, format="remember", tasks=TASKS)
    assert len(retrieval.make_haystack(TOKENS.encode, TEXT, needed + 9, 1, 1, seed=0, format="remember",
                                       tasks=TASKS).ids) == needed + 9  # one filler token per sentence: enough


def test_a_haystack_with_tasks_is_the_same_for_a_seed_in_every_version():
    """Resumed runs read their measurements back by name: the keys, questions and words a seed draws are pinned."""
    made = []
    for tasks, size in [(TASKS, 2), ({"multi-value": 12}, 2), ({"variable-tracking": 3}, 4)]:
        h = retrieval.make_haystack(TOKENS.encode, TEXT, 3000, 4, 1, seed=11, format="made-up", tasks=tasks,
                                    task_size=size)
        made.append([h.ids, h.spans, [(q.task, q.label, q.answers, q.depth, q.band) for q in h.questions]])
    assert hashlib.sha256(json.dumps(made).encode()).hexdigest() == DIGEST_WITH_TASKS
