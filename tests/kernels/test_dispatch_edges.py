"""``kernels.dispatch`` at its edges: where the cache lives, what the fingerprint reads, what a key tells apart,
what is remembered after each way of choosing, and what a stand-in's backward differentiates."""

import json

import pytest
import torch

import posenc
from posenc.kernels import dispatch
from tests.kernels.dispatch_clock import make


def test_the_cache_defaults_to_the_users_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(dispatch.CACHE_VARIABLE, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert dispatch.cache_path() == tmp_path / ".cache" / "posenc" / "attention-forms.json"
    monkeypatch.setenv(dispatch.CACHE_VARIABLE, str(tmp_path / "elsewhere.json"))
    assert dispatch.cache_path() == tmp_path / "elsewhere.json"


def test_the_fingerprint_follows_every_kernel_source_and_nothing_else(tmp_path):
    sources = {"a.cpp": "int a;", "tiles.h": "#define T 32", "blockwise.py": "x = 1", "tiles_triton.py": "y = 2"}
    for name, text in {**sources, "notes.txt": "x"}.items():
        (tmp_path / name).write_text(text)
    first = dispatch.fingerprint(tmp_path)
    assert len(first) == 16 and int(first, 16) >= 0
    seen = {first}
    for name in sources:
        (tmp_path / name).write_text((tmp_path / name).read_text() + " ")
        seen.add(dispatch.fingerprint(tmp_path))
    assert len(seen) == 5, "a changed .cpp, .h, blockwise.py or tiles_triton.py must change the fingerprint"
    (tmp_path / "notes.txt").write_text("changed")
    assert dispatch.fingerprint(tmp_path) in seen
    assert dispatch.fingerprint() == dispatch.fingerprint(dispatch.Path(dispatch.__file__).parent)


def test_a_key_tells_causal_from_bidirectional_and_training_from_inference():
    q = torch.empty(1, 2, 8, 4)
    keys = {dispatch.shape_key("ALiBi", q, q, q, causal, grad) for causal in (True, False) for grad in (True, False)}
    assert keys == {f"ALiBi float32 {mask} {mode} B·H=2 Hkv=2 Tq=8 Tk=8 Dh=4 Dv=4"
                    for mask in ("causal", "bidirectional") for mode in ("train", "infer")}


def test_chosen_names_the_form_that_ran_however_it_was_chosen(fresh, clock):
    only = make(clock, {"mask": 1.0})[0]
    dispatch.choose("one form", list(only), lambda: only)
    contenders, calls = make(clock, {"table": 2.0, "mask": 5.0})
    dispatch.choose("timed", list(contenders), lambda: contenders)
    assert dispatch.chosen() == {"one form": "mask", "timed": "table"}
    dispatch._chosen.clear()  # a new process: the file answers, and the answer is named too
    assert dispatch.choose("timed", list(contenders), lambda: contenders) == "table"
    assert dispatch.chosen() == {"timed": "table"}
    fresh.unlink()  # memory answers now, without the file and without a timing
    assert dispatch.choose("timed", list(contenders), lambda: contenders) == "table"
    assert calls == {"table": 1 + dispatch.ROUNDS, "mask": 1 + dispatch.ROUNDS}


def test_memory_answers_only_for_its_own_key(fresh, clock):
    first = make(clock, {"table": 2.0, "mask": 5.0})[0]
    dispatch.choose("key A", list(first), lambda: first)
    fresh.unlink()
    contenders, calls = make(clock, {"table": 9.0, "mask": 5.0})
    assert dispatch.choose("key B", list(contenders), lambda: contenders) == "mask"
    assert calls["mask"] == 1 + dispatch.ROUNDS


def test_the_file_keeps_milliseconds_to_four_places(fresh, clock):
    contenders, _ = make(clock, {"table": 2.123456, "mask": 5.000049})
    dispatch.choose("key A", list(contenders), lambda: contenders)
    assert json.loads(fresh.read_text())["key A"]["ms"] == {"table": 2.1235, "mask": 5.0}


def test_a_cache_file_that_is_not_an_object_is_timed_over(fresh, clock):
    fresh.write_text(json.dumps(["not", "a", "dict"]))
    contenders, calls = make(clock, {"table": 2.0, "mask": 5.0})
    assert dispatch.choose("key A", list(contenders), lambda: contenders) == "table"
    assert calls["table"] == 1 + dispatch.ROUNDS
    assert json.loads(fresh.read_text())["key A"]["form"] == "table"


@pytest.mark.parametrize("needs_grad", [True, False])
def test_a_stand_in_differentiates_the_encodings_parameters_only_when_training(needs_grad, monkeypatch):
    """A training key's timing includes the gradient of the encoding's parameters (Kerple's), as the real step
    will; an inference key's runs no backward at all."""
    encoding = posenc.build("kerple", num_heads=2)
    at = encoding.at(torch.arange(6)[None], torch.arange(6)[None], contiguous=True)
    asked, original = [], torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda out, inputs, **kw: asked.append(inputs) or original(
        out, inputs, **kw))
    q = torch.randn(1, 2, 6, 4)

    def form(q, k, v, at):
        return posenc.attention(q, k, v, at, backend="eager")

    dispatch.stand_ins({"mask": form}, q, q, q, at, (), needs_grad)["mask"]()
    if needs_grad:
        [inputs] = asked
        assert len(inputs) == 3 + len(list(encoding.parameters())) and len(list(encoding.parameters())) > 0
        assert all(p.grad is None for p in encoding.parameters())
    else:
        assert asked == []
