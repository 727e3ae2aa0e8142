"""Passkey prompts: the key lands token-exactly at the asked depth; answers are read as the first number."""

import pytest

from posenc.extension import passkey


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_passkey_prompt_puts_the_key_at_the_asked_depth_token_exactly(depth):
    prompt = passkey.make_prompt(byte_ids, 700, depth, "52718")
    key_ids = byte_ids(passkey.KEY.format(key="52718"))
    intro, question = byte_ids(passkey.INTRO), byte_ids(passkey.QUESTION)
    budget = 700 - len(intro) - len(key_ids) - len(question)
    assert len(prompt.ids) == 700
    assert prompt.key_start == len(intro) + round(depth * budget)
    assert prompt.ids[prompt.key_start : prompt.key_start + len(key_ids)] == key_ids
    assert prompt.ids[-len(question):] == question and prompt.ids[: len(intro)] == intro


def test_the_scorer_reads_the_first_number():
    assert passkey.read_answer(" 52718. Remember it.") == "52718"
    assert passkey.read_answer(" is 5 2718") == "5"
    assert passkey.read_answer(" I don't know.") is None
    assert passkey.keys(3, 4) == passkey.keys(3, 4) and all(len(k) == 5 for k in passkey.keys(3, 4))


def test_a_prompt_shorter_than_its_fixed_text_is_refused():
    with pytest.raises(ValueError, match="passkey length 100 is too short"):
        passkey.make_prompt(byte_ids, 100, 0.5, "12345")


def test_the_prompt_records_its_key_and_depth_and_refuses_a_depth_outside_0_1():
    prompt = passkey.make_prompt(byte_ids, 700, 0.3, "52718")
    assert prompt.key == "52718" and prompt.depth == 0.3
    for depth in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"passkey depth must be in \\[0, 1\\], got {depth}"):
            passkey.make_prompt(byte_ids, 700, depth, "52718")


def test_a_prompt_with_exactly_one_filler_token_is_built():
    fixed = len(byte_ids(passkey.INTRO)) + len(byte_ids(passkey.KEY.format(key="12345"))) + len(
        byte_ids(passkey.QUESTION))
    assert len(passkey.make_prompt(byte_ids, fixed + 1, 0.5, "12345").ids) == fixed + 1
    for length in (fixed, fixed - 5):
        with pytest.raises(ValueError, match=f"too short: the fixed text alone takes {fixed} tokens"):
            passkey.make_prompt(byte_ids, length, 0.5, "12345")
