import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posenc.lm.runtime import provenance, provenance_line
from posenc.cli import main
from posenc.experiments.extrapolate import ExperimentConfig, all_rows, run
from tests.helpers import failure_text

ENV = {**os.environ, "POSENC_FLEX_COMPILE": "0", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    assert main(["extrapolate", "--preset", "smoke", "--encodings", "all", "--out", str(out)]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_smoke_run_writes_every_file_row_and_column(smoke_run):
    out, results = smoke_run
    for name in ("results.json", "results.md", "extrapolation.png", "position_loss.png"):
        assert (out / name).stat().st_size > 0
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results["eval_lengths"] == [16, 32, 64, 128]
    assert [row["name"] for row in results["rows"]] == list(all_rows())  # every row, the 2022-24 encodings too
    for row in results["rows"]:
        for length in map(str, results["eval_lengths"]):
            value = row["bits_per_byte"][length]
            if row["name"] == "learned" and length != "16":
                assert value is None and "beyond the learned table" in row["errors"][length]
            else:
                assert math.isfinite(value) and 0 < value < 9
    assert results["corpus"]["sha256"] and results["protocol"] == "non-overlapping windows"
    markdown = (out / "results.md").read_text()
    assert "| learned | " in markdown and "N/A" in markdown
    assert "the same for every encoding, plus the encoding's own tables (learned 512, " in markdown
    overlap = results["train_overlap"]  # its values: tests/lm/test_data.py
    assert overlap["probe_bytes"] == 64 and overlap["probes"] == results["windows"]["count"] * (129 // 64)
    assert 0 <= overlap["in_train"] < 0.5 and all(0 < share <= 1 for share in overlap["files"].values())
    assert f"Train/test overlap: {overlap['in_train']:.1%} of {overlap['probes']:,} 64-byte probes" in markdown


def test_factor_one_scalings_equal_plain_rope(smoke_run):
    _, results = smoke_run
    rows = {row["name"]: row for row in results["rows"]}
    for name in ("rope+pi", "rope+ntk", "rope+dynamic", "rope+dynamic1", "rope+yarn"):
        assert rows[name]["bits_per_byte"]["16"] == pytest.approx(rows["rope"]["bits_per_byte"]["16"], abs=1e-6)
    # the same in a layout, whose global RoPE has its own base (θ 1M): the scaling keeps it
    assert rows["swa+global+yarn"]["bits_per_byte"]["16"] == pytest.approx(rows["swa+global"]["bits_per_byte"]["16"],
                                                                         abs=1e-6)
    assert rows["rope+pi"]["bits_per_byte"]["128"] != rows["rope"]["bits_per_byte"]["128"]
    # factor 1 grows the base less than factor = the column's: the two dynamic rows differ past 1x
    assert rows["rope+dynamic1"]["bits_per_byte"]["128"] != rows["rope+dynamic"]["bits_per_byte"]["128"]


def test_dynamic_rows_scale_by_length_with_their_own_factor():
    rows = all_rows()
    assert rows["rope+dynamic1"].eval_kwargs(4.0, 64)["scaling"]["factor"] == 1.0
    assert rows["rope+dynamic"].eval_kwargs(4.0, 64)["scaling"]["factor"] == 4.0


def test_a_one_layer_layout_is_its_global_layer_alone(smoke_run):
    """The smoke model has one layer, which a layout makes global: iRoPE and rnope-swa are then NoPE, from the same
    initialisation, to the digit."""
    _, results = smoke_run
    rows = {row["name"]: row["bits_per_byte"] for row in results["rows"]}
    assert rows["irope"] == rows["rnope-swa"] == rows["none"]
    assert rows["irope+temperature"] == rows["none+temperature"]


def test_layout_rows_build_local_layers_and_scale_only_the_global_ones():
    config, rows = ExperimentConfig.from_preset("default"), all_rows()
    irope = config.model_config(rows["irope+temperature"], rows["irope+temperature"].eval_kwargs(4.0, 64))
    assert irope.encoding == "none" and irope.encoding_kwargs["temperature"]["floor"] == 64
    assert irope.layers == ({"encoding": "rope", "encoding_kwargs": {}, "chunk": 16},) * 3 + ({},)
    row = rows["swa+global+yarn"]
    gemma = config.model_config(row, row.eval_kwargs(4.0, 64))
    assert gemma.encoding == "rope" and gemma.encoding_kwargs["base"] == 1_000_000.0
    assert gemma.encoding_kwargs["scaling"]["rope_type"] == "yarn" and gemma.encoding_kwargs["scaling"]["factor"] == 4.0
    assert [layer.get("window") for layer in gemma.layers] == [16, 16, 16, None]
    assert all("scaling" not in layer.get("encoding_kwargs", {}) for layer in gemma.layers)


def test_every_cell_has_an_interval_and_the_comparisons_are_paired(smoke_run):
    out, results = smoke_run
    assert results["windows"]["split"] == "test" and results["windows"]["count"] == 4
    rows = {row["name"]: row for row in results["rows"]}
    for row in results["rows"]:
        for n in map(str, results["eval_lengths"]):
            if row["bits_per_byte"][n] is None:
                assert row["interval"][n] is None and row["vs_best"][n] is None
                continue
            low, high = row["interval"][n]
            assert low <= row["bits_per_byte"][n] <= high
            versus = row["vs_best"][n]
            best = rows[versus["best"]]
            assert versus["mean"] == pytest.approx(row["bits_per_byte"][n] - best["bits_per_byte"][n], abs=1e-9)
            assert best["bits_per_byte"][n] == min(r["bits_per_byte"][n] for r in rows.values()
                                                   if r["bits_per_byte"][n] is not None)
    markdown = (out / "results.md").read_text()
    assert "## Change from the row's own 1× score" in markdown and "`rope+dynamic1`: " in markdown
    position = rows["rope"]["position_bits"]
    assert len(position["low"]) == len(position["bits"]) == len(position["high"])


@pytest.fixture
def scored(monkeypatch):
    """Every windows tensor the extrapolate stages hand to evaluate(), in call order."""
    import posenc.experiments.extrapolate.stages as stages

    seen, evaluate = [], stages.evaluate

    def spy(model, windows, lengths, **kwargs):
        seen.append(windows.clone())
        return evaluate(model, windows, lengths, **kwargs)

    monkeypatch.setattr(stages, "evaluate", spy)
    return seen


def test_the_scored_windows_are_a_sample_of_the_test_files(tmp_path, scored):
    from posenc.lm.data import sample_windows, stdlib_corpus

    results = run(ExperimentConfig.from_preset("smoke", encodings="none", steps=1, eval_windows=12),
                  tmp_path / "r", log=lambda *_: None)
    test = stdlib_corpus().test
    expected = sample_windows(test, 128, 12)
    assert scored and all(torch.equal(tokens, expected.tokens) for tokens in scored)
    assert len(set(expected.files)) >= 10 and set(expected.files) <= set(test.files)
    assert results["windows"]["files"] == len(set(expected.files))


def test_every_encoding_scores_the_same_bytes(tmp_path, scored):
    run(ExperimentConfig.from_preset("smoke", encodings="none,alibi,t5", steps=2), tmp_path / "r", log=lambda *_: None)
    assert len(scored) == 3 * 4
    assert all(t.equal(scored[0]) for t in scored)


def test_seeds_report_mean_and_std_and_the_declared_family(tmp_path, capsys):
    config = ExperimentConfig.from_preset("smoke", encodings="rope,rope+yarn", steps=3, seeds=2, eval_factors=(1, 2),
                                          compare="rope+yarn:rope@2")
    results = run(config, tmp_path / "seeds", log=lambda *_: None)
    assert results["family"] == {"declared": "before the run: --compare, pinned in config.json by its first invocation",
                                 "exploratory": False, "comparisons": [{"a": "rope+yarn", "b": "rope", "factor": 2}]}
    (name, compared), = results["comparisons"].items()
    yarn, rope = ([seed["32"] for seed in row["per_seed"]] for row in results["rows"][::-1])
    assert name == "bits at 2× (32): rope+yarn − rope" and compared["comparisons"] == 1
    assert list(compared["per_document"].values()) == pytest.approx([yarn[0] - rope[0], yarn[1] - rope[1]])
    assert "## Declared comparisons" in (tmp_path / "seeds" / "results.md").read_text()
    # the same run resumed with another family: fixed after its results could be seen
    assert main(["extrapolate", "--preset", "smoke", "--encodings", "rope,rope+yarn", "--steps", "3", "--seeds", "2",
                 "--eval-factors", "1,2", "--compare", "rope:rope+yarn", "--resume", "--out", str(tmp_path / "seeds")]) == 0
    family = json.loads((tmp_path / "seeds" / "results.json").read_text())["family"]
    assert family["exploratory"] and "changed on --resume" in family["declared"] and len(family["comparisons"]) == 2
    assert "Exploratory: its corrections hold only" in " ".join((tmp_path / "seeds" / "results.md").read_text().split())
    for row in results["rows"]:
        assert len(row["per_seed"]) == 2
        for length in ("16", "32"):
            values = [seed[length] for seed in row["per_seed"]]
            assert row["bits_per_byte"][length] == pytest.approx(sum(values) / 2)
            assert row["bits_per_byte_std"][length] == pytest.approx(abs(values[0] - values[1]) / 2**0.5)
    assert results["rows"][0]["per_seed"][0] != results["rows"][0]["per_seed"][1]  # seeds differ
    assert " ± " in (tmp_path / "seeds" / "results.md").read_text()


def test_sliding_protocol_is_recorded(tmp_path):
    config = ExperimentConfig.from_preset("smoke", encodings="alibi", steps=2, eval_stride=8, eval_factors=(1, 2))
    results = run(config, tmp_path / "s", log=lambda *_: None)
    assert results["protocol"] == "sliding windows, stride 8"
    assert all(math.isfinite(v) for v in results["rows"][0]["bits_per_byte"].values())


def test_too_small_corpus_fails_before_training(tmp_path, capsys):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("x" * 2000)
    code = main(["extrapolate", "--preset", "smoke", "--text", str(tiny), "--out", str(tmp_path / "o")])
    assert code == 2
    assert "corpus too small: the test split has 100 bytes" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag, value, message", [
    ("--steps", "0", "steps must be an integer >= 1"),
    ("--lr", "-1", "lr must be a finite number > 0.0"),
    ("--lr", "inf", "lr must be a finite number > 0.0, got inf"),
    ("--eval-factors", "1,0", "--eval-factors must be integers >= 1"),
    ("--eval-stride", "0", "--eval-stride must be an integer >= 1"),
    ("--dim", "31", "--dim (31) must be --heads (2) times an even head width, got 15.5 per head"),
    ("--dim", "6", "--dim (6) must be --heads (2) times an even head width, got 3 per head"),
    ("--compare", "none:alibi", "--compare pairs rows over seeds: it needs --seeds >= 2"),
    ("--compare", "none-alibi", "each comparison is ROW:ROW or ROW:ROW@FACTOR"),
])
def test_bad_settings_fail_before_anything_runs(tmp_path, capsys, flag, value, message):
    assert main(["extrapolate", "--preset", "smoke", flag, value, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", [["extrapolate"], ["task", "copy"]])
def test_a_diverged_training_stops_the_run_instead_of_reporting_nan(tmp_path, capsys, command):
    out = tmp_path / "o"
    assert main([*command, "--preset", "smoke", "--encodings", "none", "--steps", "2", "--lr", "1e9",
                 "--out", str(out)]) == 2
    assert "none (seed 0) diverged at learning rate 1e+09 (final training loss nan): start a new run with a " \
           "smaller --lr" in capsys.readouterr().err
    assert not (out / "results.json").exists()


def test_unknown_encoding_is_a_clear_error(tmp_path, capsys):
    assert main(["extrapolate", "--preset", "smoke", "--encodings", "rope,rotary", "--out", str(tmp_path / "o")]) == 2
    assert "unknown rows ['rotary']" in capsys.readouterr().err


def test_reusing_an_out_dir_needs_resume_and_the_same_training_config(smoke_run, capsys):
    out, _ = smoke_run
    assert main(["extrapolate", "--preset", "smoke", "--out", str(out)]) == 2
    assert main(["extrapolate", "--preset", "smoke", "--steps", "3", "--out", str(out), "--resume"]) == 2
    assert "differs in ['steps', 'warmup']" in capsys.readouterr().err


def test_resume_can_reevaluate_checkpoints_with_another_protocol(tmp_path, capsys):
    out = tmp_path / "r"
    args = ["extrapolate", "--preset", "smoke", "--encodings", "alibi", "--steps", "3", "--out", str(out)]
    assert main(args) == 0
    assert main(args + ["--resume", "--eval-stride", "4", "--eval-factors", "1,2"]) == 0
    assert "alibi (seed 0): already trained, skipping" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"] == "sliding windows, stride 4" and results["eval_lengths"] == [16, 32]
    assert results["provenance"] == provenance()  # versions, commit, CPU
    assert results["commits"] == [provenance()["commit"]]  # one commit made both invocations
    assert json.loads((out / "run.json").read_text())["corpus"]["sha256"] == results["corpus"]["sha256"]
    assert provenance_line(results["provenance"]) in (out / "results.md").read_text()


def test_a_run_pins_its_corpus_and_lists_every_commit_that_worked_on_it(tmp_path):
    from posenc.experiments.extrapolate.stages import pin_corpus_and_commit

    corpus = {"source": "stdlib (Python 3.11.7)", "sha256": "a" * 64, "files": 3}
    assert pin_corpus_and_commit(tmp_path, corpus, "c1") == ["c1"]
    assert pin_corpus_and_commit(tmp_path, {**corpus, "python_version": "3.11.7"}, "c2") == ["c1", "c2"]
    assert pin_corpus_and_commit(tmp_path, corpus, "c1") == ["c2", "c1"]  # the latest last, each once
    with pytest.raises(ValueError, match="another corpus"):
        pin_corpus_and_commit(tmp_path, {**corpus, "sha256": "b" * 64}, "c3")
    assert json.loads((tmp_path / "run.json").read_text())["commits"] == ["c2", "c1"]  # the refusal wrote nothing


def _cli(*args):
    return [sys.executable, "-m", "posenc", "extrapolate", "--preset", "smoke", *args]


def test_resume_after_sigkill_loses_no_finished_encoding(tmp_path):
    args = ["--encodings", "none,alibi,rope", "--steps", "300"]
    reference = tmp_path / "reference"
    subprocess.run(_cli(*args, "--out", str(reference)), env=ENV, check=True, capture_output=True, timeout=300)

    killed = tmp_path / "killed"
    process = subprocess.Popen(_cli(*args, "--out", str(killed)), env=ENV,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first_done = killed / "checkpoints" / "none-seed0" / "train.json"
    second_partial = killed / "checkpoints" / "alibi-seed0" / "last.pt"
    deadline = time.time() + 120
    while not (first_done.exists() and second_partial.exists()) and time.time() < deadline:
        if process.poll() is not None:  # finished before we could kill it: the resume still must skip
            break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert first_done.exists(), "the first encoding should have finished before the kill"
    finished_weights = (killed / "checkpoints" / "none-seed0" / "model.safetensors").stat().st_mtime_ns

    resumed = subprocess.run(_cli(*args, "--out", str(killed), "--resume"), env=ENV, check=True,
                             capture_output=True, text=True, timeout=300)
    assert "none (seed 0): already trained, skipping" in resumed.stdout
    assert (killed / "checkpoints" / "none-seed0" / "model.safetensors").stat().st_mtime_ns == finished_weights
    got = json.loads((killed / "results.json").read_text())["rows"]
    want = json.loads((reference / "results.json").read_text())["rows"]
    for a, b in zip(got, want):  # resumed training continues the same data order and optimizer state
        assert a["bits_per_byte"] == pytest.approx(b["bits_per_byte"], abs=1e-4), a["name"]


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists(),
                    reason="torchrun not installed")
def test_ddp_smoke_run_with_two_cpu_processes(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun if torchrun.exists() else "torchrun"), "--standalone", "--nproc_per_node", "2",
               "-m", "posenc", "extrapolate", "--preset", "smoke", "--encodings", "alibi,rope",
               "--lrs", "1e-3,3e-3", "--lr-widenings", "0", "--out", str(tmp_path / "ddp")]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, failure_text(done.stderr)
    results = json.loads((tmp_path / "ddp" / "results.json").read_text())
    assert results["processes"] == 2
    assert {row["name"] for row in results["rows"]} == {"alibi", "rope"}
    assert all(math.isfinite(v) for row in results["rows"] for v in row["bits_per_byte"].values())
    for row in results["rows"]:  # both ranks trained every rate and followed rank 0's choice on dev
        sweep = row["rate_sweeps"][0]
        assert sorted(sweep["scores"]) == ["0.001", "0.003"] and row["learning_rates"] == [sweep["lr"]]
        assert sweep["lr"] == float(min(sweep["scores"], key=sweep["scores"].get))


def test_resume_of_a_folder_without_a_run_says_so(tmp_path, capsys):
    empty = tmp_path / "typo"
    empty.mkdir()
    assert main(["extrapolate", "--preset", "smoke", "--out", str(empty), "--resume"]) == 2
    assert f"{empty} holds no posenc extrapolate run" in capsys.readouterr().err
    assert not (empty / "config.json").exists()


def test_damaged_weights_name_the_file_and_the_way_out(tmp_path, capsys):
    out = tmp_path / "r"
    args = ["extrapolate", "--preset", "smoke", "--encodings", "alibi", "--steps", "3", "--out", str(out)]
    assert main(args) == 0
    weights = out / "checkpoints" / "alibi-seed0" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    for evaluation in (out / "evals").rglob("*.json"):
        evaluation.unlink()  # so the resumed run must read the weights again
    assert main(args + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert str(weights) in err and "damaged or truncated" in err and "delete it and run again with --resume" in err
    weights.unlink()  # the way out the message gives: the stage that wrote it is redone
    assert main(args + ["--resume"]) == 0
    assert weights.exists()


def test_the_overlap_line_names_the_share_and_the_files_that_leak_most():
    from posenc.experiments.extrapolate.report import overlap_line

    overlap = {"probe_bytes": 64, "probes": 3840, "in_train": 0.078125,
               "files": {"encodings/cp932.py": 0.625, "bz2.py": 0.4125, "a.py": 0.1, "b.py": 0.05}}
    assert overlap_line(overlap) == ("Train/test overlap: 7.8% of 3,840 64-byte probes of the scored windows stand "
                                     "verbatim in train (most in encodings/cp932.py 62%, bz2.py 41%, a.py 10%).")
    assert overlap_line({**overlap, "in_train": 0.0, "files": {}}).endswith("stand verbatim in train.")
    assert overlap_line(None) == "Train/test overlap: not measured by this run."
