"""The form a score term runs in on CPU is timed at first use, remembered in memory and on disk, timed again when
the disk entry is stale or the shape new, and can be forced.

``kernels.dispatch`` at its edges: where the cache lives, what the fingerprint reads, what a key tells apart,
what is remembered after each way of choosing, and what a stand-in's backward differentiates.
"""

import importlib.util
import json

import pytest
import torch

import posenc
from posenc.kernels import dispatch
from tests.kernels.dispatch_clock import make


def test_the_fastest_form_is_chosen_once_and_remembered_on_disk(fresh, clock):
    contenders, calls = make(clock, {"table": 2.0, "mask": 5.0, "channels": 3.0})
    assert dispatch.choose("key A", list(contenders), lambda: contenders) == "table"
    assert calls == {name: 1 + dispatch.ROUNDS for name in calls}  # a warm-up call and the rounds, each
    entry = json.loads(fresh.read_text())["key A"]
    assert entry["form"] == "table" and entry["fingerprint"] == dispatch.fingerprint()
    assert entry["ms"] == {"table": 2.0, "mask": 5.0, "channels": 3.0}
    assert dispatch.choose("key A", list(contenders), lambda: contenders) == "table" and calls["table"] == 1 + dispatch.ROUNDS  # memory
    dispatch._chosen.clear()  # a new process: the file answers
    assert dispatch.choose("key A", list(contenders), lambda: contenders) == "table" and calls["table"] == 1 + dispatch.ROUNDS


def test_a_new_shape_is_timed_and_kept_beside_the_others(fresh, clock):
    first = make(clock, {"table": 2.0, "mask": 5.0})[0]
    dispatch.choose("key A", list(first), lambda: first)
    contenders, calls = make(clock, {"table": 9.0, "mask": 5.0})
    assert dispatch.choose("key B", list(contenders), lambda: contenders) == "mask" and calls["mask"] == 1 + dispatch.ROUNDS
    assert {key: entry["form"] for key, entry in json.loads(fresh.read_text()).items()} == {
        "key A": "table", "key B": "mask"}


def test_a_stale_or_damaged_entry_is_timed_again(fresh, clock):
    fresh.write_text(json.dumps({"key A": {"form": "mask", "ms": {}, "fingerprint": "another torch or CPU"}}))
    contenders, calls = make(clock, {"table": 2.0, "mask": 5.0})
    assert dispatch.choose("key A", list(contenders), lambda: contenders) == "table" and calls["table"] == 1 + dispatch.ROUNDS
    assert json.loads(fresh.read_text())["key A"]["fingerprint"] == dispatch.fingerprint()
    dispatch._chosen.clear()
    fresh.write_text("{ half a file")
    assert dispatch.choose("key A", list(contenders), lambda: contenders) == "table" and calls["table"] == 2 * (1 + dispatch.ROUNDS)
    assert json.loads(fresh.read_text())["key A"]["form"] == "table"


def test_a_forced_form_runs_wherever_it_serves(fresh, clock, monkeypatch):
    contenders, calls = make(clock, {"table": 2.0, "mask": 5.0})
    with dispatch.force("mask"):
        assert dispatch.choose("key A", list(contenders), lambda: contenders) == "mask"
    monkeypatch.setenv(dispatch.FORCE_VARIABLE, "channels")  # serves nowhere here: the timing decides
    assert dispatch.choose("key A", list(contenders), lambda: contenders) == "table"
    assert all(calls[name] > 0 for name in calls)
    monkeypatch.setenv(dispatch.FORCE_VARIABLE, "fastest")
    with pytest.raises(ValueError, match=r"ATTENTION_FORM must be one of \['blocks', 'channels', 'counts', 'flex', 'gates', 'lookups', 'mask', 'segments', 'table', 'tiles'\]"):
        dispatch.choose("key B", list(contenders), lambda: contenders)
    with pytest.raises(ValueError, match="form must be one of"):
        with dispatch.force("blockwise"):
            pass


def test_one_form_is_never_timed(fresh, clock):
    contenders, calls = make(clock, {"mask": 5.0})
    assert dispatch.choose("key A", list(contenders), lambda: contenders) == "mask" and calls == {"mask": 0} and not fresh.exists()


def test_shapes_within_a_factor_of_two_share_a_key():
    q = torch.empty(2, 4, 300, 32)
    key = dispatch.shape_key("ALiBi", q, torch.empty(2, 4, 300, 32), torch.empty(2, 4, 300, 32), True, True)
    assert key == "ALiBi float32 causal train B·H=8 Hkv=4 Tq=512 Tk=512 Dh=32 Dv=32"
    same = dispatch.shape_key("ALiBi", torch.empty(2, 4, 400, 32), torch.empty(2, 4, 400, 32),
                              torch.empty(2, 4, 400, 32), True, True)
    longer = dispatch.shape_key("ALiBi", torch.empty(2, 4, 600, 32), torch.empty(2, 4, 600, 32),
                                torch.empty(2, 4, 600, 32), True, True)
    assert same == key and longer != key and dispatch.bucket(1) == 1 and dispatch.bucket(513) == 1024


def test_attention_times_the_forms_of_its_first_call_per_shape(fresh):
    """ALiBi, causal, at its own positions: the table, channel and mask forms all serve on CPU, are all timed,
    and the result equals eager whichever wins."""
    enc = posenc.build("alibi", num_heads=4)
    q, k, v = (torch.randn(2, 4, 48, 16) for _ in range(3))
    with torch.no_grad():
        out = posenc.attention(q, k, v, enc, backend="sdpa")
    (key, form), = dispatch.chosen().items()
    assert key == "ALiBi float32 causal infer B·H=8 Hkv=4 Tq=64 Tk=64 Dh=16 Dv=16"
    assert set(json.loads(fresh.read_text())[key]["ms"]) == {"table", "channels", "mask"}
    torch.testing.assert_close(out, posenc.attention(q, k, v, enc, backend="eager"), rtol=0, atol=1e-5)
    for name in dispatch.FORMS:
        with dispatch.force(name):
            torch.testing.assert_close(posenc.attention(q, k, v, enc, backend="sdpa"), out, rtol=0, atol=1e-5)


def test_stand_ins_are_made_only_for_a_timing(fresh, monkeypatch):
    """A remembered choice costs a dictionary lookup: no stand-in tensors are drawn again (drawing them every
    call once cost a 4-layer training step 3.5× its time)."""
    made = []
    original = dispatch.stand_ins
    monkeypatch.setattr(dispatch, "stand_ins", lambda *args: made.append(1) or original(*args))
    enc = posenc.build("t5", num_heads=4)
    q, k, v = (torch.randn(2, 4, 20, 8) for _ in range(3))
    with torch.no_grad():
        for _ in range(3):
            posenc.attention(q, k, v, enc, backend="sdpa")
    assert made == [1]


def test_a_timing_of_token_gates_leaves_the_callers_graph_whole(fresh, monkeypatch):
    """FoX's gates come from the tokens: a stand-in's backward must not run into the model's graph (it freed it, and
    the model's own backward then failed, on an H200). Two forms offered on CPU time them here; the loss and every
    gradient equal the untimed run's (which runs the one form a CPU offers)."""
    import sys

    from posenc.kernels import forms
    from posenc.lm.model import LanguageModel, ModelConfig

    torch.manual_seed(3)
    model = LanguageModel(ModelConfig(encoding="fox", dim=32, num_layers=2, num_heads=2, max_positions=40))
    tokens = torch.randint(0, 256, (2, 41))

    def loss_and_grads():
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        return loss, torch.autograd.grad(loss, list(model.parameters()))

    untimed, untimed_grads = loss_and_grads()
    mask_form = forms._mask_form
    monkeypatch.setattr(sys.modules["posenc.attention"], "score_forms", lambda *a: {"mask": mask_form,
                                                                                   "channels": mask_form})
    timed, timed_grads = loss_and_grads()
    assert any(" ForgettingGates " in f" {key} " for key in dispatch.chosen())  # a timing ran
    torch.testing.assert_close(timed, untimed, rtol=0, atol=1e-6)
    for a, b in zip(timed_grads, untimed_grads):  # the untimed call ran the gates kernel, the timed one the mask
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_form_that_fails_at_first_use_is_left_out_with_one_warning(fresh, clock):
    """Out of memory (or a compile error) in one form's warm-up leaves the others to the timing, said once; the
    choice and the file name only the forms that ran. When every form fails, the first error is raised."""
    contenders, calls = make(clock, {"table": 2.0, "mask": 5.0, "flex": 1.0})

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 GiB")
    contenders["flex"] = out_of_memory
    with pytest.warns(RuntimeWarning, match="left out of the timing after failing at first use: flex: CUDA out of"):
        assert dispatch.choose("key A", list(contenders), lambda: contenders) == "table"
    assert calls["table"] == calls["mask"] == 1 + dispatch.ROUNDS
    assert set(json.loads(fresh.read_text())["key A"]["ms"]) == {"table", "mask"}

    def broken():
        raise RuntimeError("first")
    with pytest.raises(RuntimeError, match="first"):
        dispatch.choose("key B", ["table", "mask"], lambda: {"table": broken, "mask": out_of_memory})


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (the test extra)")
def test_a_form_that_triton_cannot_compile_or_fit_is_left_out_too(fresh, clock):
    """Triton's resource and compile errors derive from ``TritonError``, not RuntimeError: a Triton form whose tiles
    do not fit the GPU's shared memory is left out like an out-of-memory one, and the timing goes on."""
    from triton.runtime.errors import OutOfResources

    contenders, calls = make(clock, {"lookups": 1.0, "channels": 5.0})

    def too_big():
        raise OutOfResources(270336, 232448, "shared memory")
    contenders["lookups"] = too_big
    with pytest.warns(RuntimeWarning, match="failing at first use: lookups: out of resource: shared memory"):
        assert dispatch.choose("key C", list(contenders), lambda: contenders) == "channels"


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
