import json
import os

import pytest
import torch

from posenc.bench import (bench_attention, bench_rope_apply, bench_score_forms, bench_training_step, describe,
                          one_line, saved_activation_bytes)
from posenc.lm.runtime import cpu_model
from posenc.cli import main
from posenc.kernels import offset_bias
from posenc.lm.model import LanguageModel, ModelConfig


def test_bench_rows_are_ratios_to_eager_in_the_same_run():
    rows = bench_attention("cpu", lengths=(32,), heads=2, head_dim=8, rounds=2)
    by_key = {(r["encoding"], r["backend"]): r for r in rows}
    assert by_key[("rope", "eager")]["ratio"] == 1.0
    assert ("shaw", "sdpa") in by_key and ("shaw", "flex") not in by_key  # a backend that cannot serve is left out
    for r in rows:
        assert r["ms"] > 0 and r["ratio_low"] <= r["ratio"] <= r["ratio_high"]


def test_training_and_rope_tables_have_their_baselines():
    steps = bench_training_step(shapes=((8, 2),), encodings=("none", "rope"), rounds=2)
    assert [r["encoding"] for r in steps] == ["none", "rope"] and steps[0]["ratio"] == 1.0
    assert not any(r["compiled"] for r in steps)  # compiled only when asked
    rope = bench_rope_apply(shape=(1, 2, 16, 8), rounds=2)
    names = [r["contender"] for r in rope]
    assert names[0] == "copy_ (baseline)" and "posenc rotate_pairs" in names
    assert "transformers (Llama formula)" in names  # transformers is a test dependency


def test_training_table_steps_each_model_on_its_shape_and_names_its_backend_and_form(monkeypatch):
    """Each shape's models step on (batch, length + 1) bytes, compiled whole when asked, NoPE on "auto"; a row names
    the forms ``kernels.dispatch`` chose for its encoding's class at its length."""
    from posenc.bench import training

    steps, compiled, timed = [], [], []
    real_loss = training._loss

    def loss(model, tokens, autocast=None):
        steps.append((tokens.shape, int(tokens.min()) >= 0 and int(tokens.max()) < 256, autocast))
        return real_loss(model, tokens, autocast)

    def round_robin(contenders, *, baseline, rounds, device, warmup, label):
        timed.append((baseline, rounds, warmup, label))
        for step in contenders.values():
            step()
        return {name: {"ms": 1.0, "ratio": 1.0, "ratio_low": 1.0, "ratio_high": 1.0} for name in contenders}

    def compile(model, fullgraph):
        compiled.append((type(model.encoding).__name__, model.config.backend, fullgraph))
        return model

    monkeypatch.setattr(training, "_loss", loss)
    monkeypatch.setattr(training, "round_robin", round_robin)
    monkeypatch.setattr(training.torch, "compile", compile)
    monkeypatch.setattr(training.dispatch, "chosen", lambda: {
        "ALiBi float32 causal train B·H=8 Hkv=4 Tq=16 Tk=16": "table", "ALiBi float32 causal train Tq=16 x": "bias",
        "ALiBi float32 causal infer Tq=16": "channels", "ALiBi float32 causal train Tq=8": "channels",
        "ALiBiExtra float32 causal train Tq=16": "mask"})
    rows = training.bench_training_step(shapes=((16, 2), (8, 3)), encodings=("none", "alibi"), rounds=3,
                                        compile=True, backend="eager", autocast=torch.bfloat16)
    assert [(r["encoding"], r["length"], r["batch"], r["backend"], r["compiled"], r["form"]) for r in rows] == [
        ("none", 16, 2, "auto", True, "—"), ("alibi", 16, 2, "eager", True, "bias, table"),
        ("none", 8, 3, "auto", True, "—"), ("alibi", 8, 3, "eager", True, "channels")]
    assert steps == [(torch.Size([2, 17]), True, torch.bfloat16)] * 2 + [(torch.Size([3, 9]), True, torch.bfloat16)] * 2
    assert compiled == [("NoPE", "auto", True), ("ALiBi", "eager", True)] * 2
    assert timed == [("none", 3, 2, "training L=16 B=2 compiled"), ("none", 3, 2, "training L=8 B=3 compiled")]


def test_the_peers_rope_rotates_q_and_k_as_posenc_does():
    """The table times other libraries' RoPE beside posenc's: each must rotate the same q and k by the same angles
    (transformers' Llama formula rotates halves, posenc's default layout), or its time would be of other work.
    rotary-embedding-torch and x-transformers, timed where installed, are not test dependencies: not checked here."""
    from posenc.bench.rope_apply import _peers
    from posenc.encodings.scaling import rope_frequencies
    from posenc.kernels import rope_cos_sin, rotate_pairs

    q, k = torch.randn(2, 3, 40, 16), torch.randn(2, 3, 40, 16)
    cos, sin = rope_cos_sin(torch.arange(40)[None], rope_frequencies(16)[0])
    q_rotated, k_rotated = _peers(q, k)["transformers (Llama formula)"]()  # transformers is a test dependency
    torch.testing.assert_close(q_rotated, rotate_pairs(q, cos, sin))
    torch.testing.assert_close(k_rotated, rotate_pairs(k, cos, sin))


def test_rope_training_step_keeps_no_more_activations_than_nope_but_cos_sin():
    """The model rotates q and k inside its own projection and the rotation saves only cos/sin,
    so RoPE adds exactly the (1, 1, T, F) cos and sin tables to NoPE's activation memory."""
    tokens = torch.randint(0, 256, (2, 17))
    config = dict(dim=16, num_layers=2, num_heads=2, max_positions=16)
    nope = saved_activation_bytes(LanguageModel(ModelConfig(encoding="none", **config)), tokens)
    rope = saved_activation_bytes(LanguageModel(ModelConfig(encoding="rope", **config)), tokens)
    assert nope > 0 and rope - nope == 2 * 16 * 4 * 4  # cos and sin: T=16 x F=4 float32, shared by layers


def test_memory_table_counts_each_shapes_bytes_in_mib_against_nope_and_under_autocast():
    from posenc.bench.training import bench_activation_memory
    from posenc.encodings.registry import one_axis

    rows = bench_activation_memory(shapes=((8, 2), (16, 1)), encodings=("none", "rope"), backend="eager")
    config = dict(dim=128, num_layers=4, num_heads=4)  # the default preset's model

    def counted(encoding, length, batch, autocast=None, backend="auto"):
        model = LanguageModel(ModelConfig(encoding=encoding, max_positions=length, backend=backend, **config))
        return saved_activation_bytes(model, torch.zeros(batch, length + 1, dtype=torch.long), autocast)

    expected = [(name, length, batch, backend, counted(name, length, batch, backend=backend))
                for length, batch in ((8, 2), (16, 1)) for name, backend in (("none", "auto"), ("rope", "eager"))]
    assert [(r["encoding"], r["length"], r["batch"], r["backend"], r["mib"] * 2**20) for r in rows] == expected
    assert [r["ratio"] for r in rows] == [1.0, expected[1][-1] / expected[0][-1], 1.0, expected[3][-1] / expected[2][-1]]
    every = bench_activation_memory(shapes=((4, 1),))
    assert [r["encoding"] for r in every] == list(one_axis()) and every[0]["encoding"] == "none"
    half = bench_activation_memory(shapes=((8, 2),), encodings=("none",), autocast=torch.bfloat16)
    # autocast saves the weights' bf16 copies too: the count is its own, not the float32 one
    assert half[0]["mib"] * 2**20 == counted("none", 8, 2, torch.bfloat16) != expected[0][-1]


def test_bench_cli_writes_json_and_markdown_naming_the_machine(tmp_path, capsys):
    args = ["bench", "--tables", "attention,memory", "--lengths", "16", "--train-shapes", "8x2", "--rounds", "2",
            "--json", str(tmp_path / "b.json"), "--markdown", str(tmp_path / "b.md")]
    assert main(args) == 0
    out = capsys.readouterr().out
    machine = one_line(describe("cpu"))
    assert "time / eager" in out and out.count(f"on {machine}") == 2  # under each table's title
    saved = json.loads((tmp_path / "b.json").read_text())
    assert set(saved["tables"]) == {"attention", "memory"}
    assert saved["cpu"] == cpu_model() and saved["cores"] == os.cpu_count() and saved["torch"] == torch.__version__
    markdown = (tmp_path / "b.md").read_text()
    assert "| encoding |" in markdown and markdown.count(f"On {machine}.") == 2


def test_cpu_model_is_read_from_proc_cpuinfo(tmp_path):
    from posenc.bench import machine
    from posenc.lm import runtime

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\n")
    assert runtime.cpu_model(cpuinfo) == "AMD EPYC 9B14"
    facts = {"cpu": "AMD EPYC 9B14", "cores": 2, "threads": 2, "cpu_capability": "AVX512", "torch": "2.13.0",
             "device": "cpu"}
    assert machine.one_line(facts) == "AMD EPYC 9B14 (2 cores, 2 threads, AVX512), torch 2.13.0, device cpu"


def test_a_gpu_run_names_its_gpu_and_a_cpu_run_on_a_gpu_machine_does_not(monkeypatch):
    from posenc.bench import machine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"GPU of {device}")
    facts = machine.describe("cuda:1")
    assert facts["gpu"] == "GPU of cuda:1" and facts["device"] == "cuda:1"
    assert "gpu" not in machine.describe("cpu") and machine.describe()["device"] == "cpu"
    facts.update(cpu="AMD EPYC 9B14", cores=2, threads=2, cpu_capability="AVX512", torch="2.11.0")
    assert machine.one_line(facts) == ("AMD EPYC 9B14 (2 cores, 2 threads, AVX512), GPU GPU of cuda:1, torch 2.11.0, "
                                       "device cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "gpu" not in machine.describe("cuda")  # a --device cuda run that will fail on its own, not here


def test_score_forms_table_times_bias_and_channels_against_nope():
    rows = bench_score_forms(lengths=(16,), rounds=2)
    forms = {(r["encoding"], r["form"]) for r in rows}
    assert forms == {("none", "(causal)"), ("alibi", "table"), ("alibi", "bias"), ("alibi", "channels"),
                     ("sandwich", "table"), ("sandwich", "bias"), ("sandwich", "channels"), ("kerple", "table"),
                     ("kerple", "bias"), ("t5", "table"), ("t5", "bias"), ("transformer_xl", "bias"),
                     ("transformer_xl", "channels")}
    assert rows[0]["ratio"] == 1.0 and all(r["batch"] == 4096 // 16 and r["ms"] > 0 for r in rows)


@pytest.mark.skipif(offset_bias.extension() is None, reason="no C++ toolchain to build the table form's kernel")
def test_score_forms_rows_per_length_race_a_causal_nope_and_the_bias_form_as_attention_runs_it(monkeypatch):
    """Each contender called once, the kernels it reaches recorded: NoPE is causal SDPA at the heads' scale; the bias
    form takes the blockwise kernel where the bias needs a gradient or from 1,024 keys, SDPA below them."""
    import types

    import torch.nn.functional as F

    from posenc.bench import forms

    running, sdpa, blockwise = [], [], []  # the contender being called; the kernels it reached

    def round_robin(contenders, *, baseline, rounds, device, label):
        for name, call in contenders.items():
            running.append(name)
            call()
        return {name: {"ms": 1.0, "ratio": 1.0, "ratio_low": 1.0, "ratio_high": 1.0} for name in contenders}

    def recorded_sdpa(q, k, v, **kwargs):
        sdpa.append((running[-1], q.shape[2], kwargs.get("is_causal", False), kwargs.get("scale")))
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    real_blockwise = forms.blockwise.blockwise_attention
    monkeypatch.setattr(forms, "round_robin", round_robin)
    monkeypatch.setattr(forms, "F", types.SimpleNamespace(scaled_dot_product_attention=recorded_sdpa))
    monkeypatch.setattr(forms.blockwise, "blockwise_attention",
                        lambda q, *args, **kwargs: (blockwise.append((running[-1], q.shape[2])),
                                                    real_blockwise(q, *args, **kwargs))[1])
    rows = forms.bench_score_forms(lengths=(8, 1024), rounds=2)
    assert [(r["encoding"], r["form"], r["length"], r["batch"]) for r in rows[:2]] == [
        ("none", "(causal)", 8, 512), ("alibi", "table", 8, 512)]
    assert [(r["length"], r["batch"]) for r in rows] == [(8, 512)] * 13 + [(1024, 4)] * 13
    scale = forms.HEAD_DIM**-0.5
    assert ("none (causal)", 8, True, scale) in sdpa and ("none (causal)", 1024, True, scale) in sdpa
    learned = {"kerple bias", "t5 bias", "transformer_xl bias"}  # their biases carry a gradient
    bias_forms = [(name, length) for name, length in blockwise if name.endswith(" bias")]
    assert {name for name, length in bias_forms if length == 8} == learned
    assert {name for name, length in bias_forms if length == 1024} == learned | {"alibi bias", "sandwich bias"}
    assert {name for name, length, *_ in sdpa if name.endswith(" bias")} == {"alibi bias", "sandwich bias"}
    assert {length for name, length, *_ in sdpa if name.endswith(" bias")} == {8}


@pytest.mark.parametrize("length", [16, 1024])  # 1,024 keys: the bias form takes the blockwise kernel, as attention()
def test_every_score_form_the_table_races_computes_causal_attention_with_its_encoding(length):
    """A form that were faster because it computed something else would win the race: each form's output equals
    ``attention()`` in float64 on the same encoding."""
    from posenc.attention import attention
    from posenc.bench import forms
    from posenc.encodings import build_for_model

    torch.manual_seed(0)
    sizes = {"head_dim": forms.HEAD_DIM, "num_heads": forms.HEADS}
    q, k, v = (torch.randn(1, forms.HEADS, length, forms.HEAD_DIM) for _ in range(3))
    positions = torch.arange(length)[None]
    scale = forms.HEAD_DIM**-0.5
    nope = attention(q.double(), k.double(), v.double()).float()
    for name in forms.offset_terms():
        enc = build_for_model(name, sizes=sizes)
        expected = attention(q.double(), k.double(), v.double(), enc.double(), backend="eager").float()
        assert not torch.allclose(expected, nope, atol=1e-3), name  # the encoding changes the output
        enc.float()
        ran = {"bias": forms._bias_form(enc.at(positions, positions, contiguous=True), q, k, v, scale)}
        if enc.has_bias and offset_bias.serves(q):  # the table form's kernel is built where a C++ toolchain is
            ran["table"] = forms._table_form(enc.at(positions, positions, contiguous=True), q, k, v, scale)
        if enc.has_score_channels:
            ran["channels"] = forms._channel_form(enc.at(positions, positions, contiguous=True), q, k, v, scale)
        for form, out in ran.items():
            torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5, msg=f"{name} {form}")


@pytest.mark.parametrize("args", [["--lengths", "0,-1"], ["--train-shapes", "64"], ["--backend", "fast"]])
def test_bench_rejects_bad_shapes_before_any_work(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args])
    assert exit_info.value.code == 2 and args[0] in capsys.readouterr().err


def test_bench_rejects_an_unknown_table(capsys):
    assert main(["bench", "--tables", "speed"]) == 2
    assert "--tables must be one of" in capsys.readouterr().err


def test_bench_writes_its_files_after_every_table(tmp_path, monkeypatch):
    """A bench that dies in a later table keeps the tables it finished."""
    from posenc.bench import command

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "bench_rope_apply", crash)
    args = ["bench", "--tables", "memory,rope", "--train-shapes", "8x2", "--rounds", "2", "--json", str(tmp_path / "b.json")]
    assert main(args) == 130
    assert set(json.loads((tmp_path / "b.json").read_text())["tables"]) == {"memory"}


@pytest.mark.parametrize("args, message", [
    (["--encodings", "foo"], "--encodings must be one of SORTED, got 'foo'"),
    (["--encodings", ","], "--encodings names no encoding: pass 'all' or a comma list of EVERY"),
    (["--encodings", "mrope"], "--encodings must be one of SORTED, got 'mrope'"),
    (["--tables", "rope", "--compile"], "--compile times the training table: add training to --tables"),
    (["--backend", "flex", "--encodings", "alibi"],
     "backend='flex' cannot serve ALiBi: FlexAttention has no backward pass on CPU; use backend='sdpa' or 'eager'"),
])
def test_bad_encodings_and_compile_without_training_are_one_line(args, message, tmp_path, capsys):
    from posenc.bench.command import every_encoding

    assert main(["bench", "--tables", "memory", "--train-shapes", "8x2", *args, "--json", str(tmp_path / "b.json")]) == 2
    message = message.replace("SORTED", str(sorted(every_encoding()))).replace("EVERY", ", ".join(every_encoding()))
    assert capsys.readouterr().err == f"posenc bench: error: {message}\n" and not (tmp_path / "b.json").exists()
