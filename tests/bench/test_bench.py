import json
import os

import pytest
import torch

from posenc.bench import (bench_attention, bench_rope_apply, bench_score_forms, bench_training_step, describe,
                          one_line, saved_activation_bytes)
from posenc.lm.runtime import cpu_model
from posenc.bench.timing import round_robin
from posenc.cli import main
from posenc.lm.model import LanguageModel, ModelConfig


def test_bench_rows_are_ratios_to_eager_in_the_same_run():
    rows = bench_attention("cpu", lengths=(32,), heads=2, head_dim=8, rounds=2)
    by_key = {(r["encoding"], r["backend"]): r for r in rows}
    assert by_key[("rope", "eager")]["ratio"] == 1.0
    assert ("shaw", "sdpa") in by_key and ("shaw", "flex") not in by_key  # a backend that cannot serve is left out
    for r in rows:
        assert r["ms"] > 0 and r["ratio_low"] <= r["ratio"] <= r["ratio_high"]


def test_round_robin_interleaves_contenders_and_divides_within_a_round():
    calls = []
    timed = round_robin({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, baseline="a", rounds=3,
                        device=torch.device("cpu"), warmup=0)
    assert calls == ["a", "b"] * 3
    assert timed["a"]["ratio"] == 1.0
    with pytest.raises(ValueError, match="baseline 'c'"):
        round_robin({"a": lambda: None}, baseline="c", rounds=1, device=torch.device("cpu"))


def test_training_and_rope_tables_have_their_baselines():
    steps = bench_training_step(shapes=((8, 2),), encodings=("none", "rope"), rounds=2)
    assert [r["encoding"] for r in steps] == ["none", "rope"] and steps[0]["ratio"] == 1.0
    rope = bench_rope_apply(shape=(1, 2, 16, 8), rounds=2)
    names = [r["contender"] for r in rope]
    assert names[0] == "copy_ (baseline)" and "posenc rotate_pairs" in names
    assert "transformers (Llama formula)" in names  # transformers is a test dependency


def test_rope_training_step_keeps_no_more_activations_than_nope_but_cos_sin():
    """The model rotates q and k inside its own projection and the rotation saves only cos/sin,
    so RoPE adds exactly the (1, 1, T, F) cos and sin tables to NoPE's activation memory."""
    tokens = torch.randint(0, 256, (2, 17))
    config = dict(dim=16, num_layers=2, num_heads=2, max_positions=16)
    nope = saved_activation_bytes(LanguageModel(ModelConfig(encoding="none", **config)), tokens)
    rope = saved_activation_bytes(LanguageModel(ModelConfig(encoding="rope", **config)), tokens)
    assert nope > 0 and rope - nope == 2 * 16 * 4 * 4  # cos and sin: T=16 x F=4 float32, shared by layers


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


def test_score_forms_table_times_bias_and_channels_against_nope():
    rows = bench_score_forms(lengths=(16,), rounds=2)
    forms = {(r["encoding"], r["form"]) for r in rows}
    assert forms == {("none", "(causal)"), ("alibi", "table"), ("alibi", "bias"), ("alibi", "channels"),
                     ("sandwich", "table"), ("sandwich", "bias"), ("sandwich", "channels"), ("kerple", "table"),
                     ("kerple", "bias"), ("t5", "table"), ("t5", "bias"), ("transformer_xl", "bias"),
                     ("transformer_xl", "channels")}
    assert rows[0]["ratio"] == 1.0 and all(r["batch"] == 4096 // 16 and r["ms"] > 0 for r in rows)


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
    (["--encodings", "foo"], "--encodings must be one of"),
    (["--encodings", ","], "--encodings names no encoding"),
    (["--encodings", "mrope"], "--encodings must be one of"),
    (["--tables", "rope", "--compile"], "--compile times the training table: add training to --tables"),
    (["--backend", "flex", "--encodings", "alibi"],
     "backend='flex' cannot serve ALiBi: FlexAttention has no backward pass on CPU; use backend='sdpa' or 'eager'"),
])
def test_bad_encodings_and_compile_without_training_are_one_line(args, message, tmp_path, capsys):
    assert main(["bench", "--tables", "memory", "--train-shapes", "8x2", *args, "--json", str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "b.json").exists()
