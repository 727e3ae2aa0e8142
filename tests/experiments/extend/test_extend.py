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

import posenc
from posenc.lm.runtime import provenance, provenance_line
from posenc.cli import main
from tests.helpers import failure_text

ENV = {**os.environ, "POSENC_FLEX_COMPILE": "0", "OMP_NUM_THREADS": "1"}
LENGTHS = ["16", "32", "64", "128"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("extend") / "run"
    assert main(["extend", "--preset", "smoke", "--out", str(out)]) == 0
    return out, json.loads((out / "results.json").read_text())


FINE_TUNED = ["rope fine-tuned", "rope+pi fine-tuned", "rope+ntk fine-tuned", "rope+dynamic fine-tuned",
              "rope+yarn fine-tuned", "rope+longrope fine-tuned", "alibi fine-tuned"]


def test_smoke_writes_every_file_row_and_column(smoke):
    out, results = smoke
    for name in ("results.json", "results.md", "extension.png", "finetune_curve.png", "longrope_factors.png",
                 "rope_parameters.json", "search_log-seed0.json", "longrope-seed0.json"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "extension.png").read_bytes()[:4] == b"\x89PNG"
    assert results["provenance"] == provenance()  # versions, commit, CPU
    assert provenance_line(results["provenance"]) in (out / "results.md").read_text()
    names = [row["name"] for row in results["rows"]]
    assert names == ["rope", "rope+pi", "rope+ntk", "rope+dynamic", "rope+yarn", "rope+longrope"] + FINE_TUNED[:-1] + [
        "alibi", "alibi fine-tuned"]
    assert results["eval_lengths"] == [16, 32, 64, 128] and results["target_length"] == 128
    for row in results["rows"]:
        assert list(row["bits_per_byte"]) == LENGTHS
        assert all(math.isfinite(v) and 0 < v < 9 for v in row["bits_per_byte"].values()), row["name"]
        for n in LENGTHS:
            low, high = row["interval"][n]
            assert low <= row["bits_per_byte"][n] <= high
            assert len(row["window_bits"][n]) == results["windows"]["count"] == 4
            assert row["bits_per_byte"][n] == pytest.approx(sum(row["window_bits"][n]) / 4, abs=1e-9)
    rows = {row["name"]: row for row in results["rows"]}
    for name in ("rope", "rope+pi", "rope+ntk", "rope+yarn", "rope+longrope", "alibi"):
        zero, tuned = rows[name]["bits_per_byte"], rows[f"{name} fine-tuned"]["bits_per_byte"]
        assert all(abs(zero[n] - tuned[n]) > 1e-3 for n in LENGTHS), name
    markdown = (out / "results.md").read_text()
    assert "| rope+yarn fine-tuned | fine-tuned |" in markdown and "## LongRoPE search" in markdown
    assert "## Wall time per stage" in markdown and "n̂" in markdown and "## Paired comparisons" in markdown


def test_the_control_and_every_fine_tuned_row_see_the_same_tokens(smoke):
    _, results = smoke
    rows = {row["name"]: row for row in results["rows"]}
    assert rows["rope fine-tuned"]["scaling"] is None and rows["rope fine-tuned"]["method"] == "rope"
    assert {rows[name]["extra_tokens"] for name in FINE_TUNED} == {8 * 4 * 128} == {results["finetune_tokens"]}
    control = [c for c in results["comparisons"] if c["b"] == "rope fine-tuned"]
    assert {c["a"] for c in control} == set(FINE_TUNED[1:-1])


def test_from_scratch_trains_on_exactly_the_pretraining_plus_fine_tuning_tokens(smoke, tmp_path):
    out, _ = smoke
    assert main(["extend", "--preset", "smoke", "--run", str(out / "base"), "--methods", "pi", "--from-scratch",
                 "--out", str(tmp_path / "scratch")]) == 0
    results = json.loads((tmp_path / "scratch" / "results.json").read_text())
    assert results["pretraining_tokens"] == 20 * 8 * 16 and results["finetune_tokens"] == 8 * 4 * 128
    assert results["scratch_tokens"] == results["pretraining_tokens"] + results["finetune_tokens"]
    trained = json.loads((tmp_path / "scratch" / "scratch" / "seed0" / "train.json").read_text())
    assert trained["tokens"] == results["scratch_tokens"]
    rows = {row["name"]: row for row in results["rows"]}
    assert rows["rope trained at target"]["extra_tokens"] == results["scratch_tokens"]
    assert any(c["a"] == "rope trained at target" and c["b"] == "rope fine-tuned" for c in results["comparisons"])


def test_comparisons_are_paired_differences_of_the_rows(smoke):
    _, results = smoke
    rows = {row["name"]: row for row in results["rows"]}
    for comparison in results["comparisons"]:
        for n in LENGTHS:
            a, b = rows[comparison["a"]]["window_bits"][n], rows[comparison["b"]]["window_bits"][n]
            difference = comparison["difference"][n]
            assert difference["mean"] == pytest.approx(sum(a) / len(a) - sum(b) / len(b), abs=1e-9)
            assert difference["low"] <= difference["mean"] <= difference["high"]
    for row in results["rows"]:
        assert row["change_from_1x"]["16"]["mean"] == 0
        change = row["change_from_1x"]["128"]["mean"]
        assert change == pytest.approx(row["bits_per_byte"]["128"] - row["bits_per_byte"]["16"], abs=1e-9)


def test_each_rate_is_swept_and_the_best_on_dev_is_kept(smoke):
    out, results = smoke
    for name in FINE_TUNED:
        sweep = results["sweep"][name]
        grid = {lr: sweep["dev_bits"][lr] for lr in ("0.0003", "0.002")}
        # two rates: the better one is an edge, so the smoke preset's one widening adds a rate a step past it
        beyond = "4.5e-05" if grid["0.0003"] <= grid["0.002"] else "0.0133333"
        assert list(sweep["dev_bits"]) == sorted([*grid, beyond], key=float)
        best = min(sweep["dev_bits"], key=sweep["dev_bits"].get)
        assert sweep["chosen"] == [pytest.approx(float(best), rel=1e-5)]
        assert sweep["at_edge"] == [best == beyond]
        selection = json.loads((out / "finetune" / name.replace(" ", "-") / "seed0" / "selection.json").read_text())
        assert selection["lr"] == sweep["chosen"][0] and selection["widened"] == [pytest.approx(float(beyond), rel=1e-5)]
        assert (out / "finetune" / name.replace(" ", "-") / "seed0" / f"lr{beyond}" / "model.safetensors").exists()
        rows = {row["name"]: row for row in results["rows"]}
        assert rows[name]["learning_rates"] == sweep["chosen"]


def test_curves_start_at_the_zero_shot_row_and_end_at_the_fine_tuned_row(smoke):
    _, results = smoke
    rows = {row["name"]: row for row in results["rows"]}
    assert set(results["curves"]) == set(FINE_TUNED)
    for name, curve in results["curves"].items():  # the smoke's curve windows are its report windows at 128
        zero_shot = name.removesuffix(" fine-tuned")
        assert curve["0"]["mean"] == pytest.approx(rows[zero_shot]["bits_per_byte"]["128"], abs=1e-6)
        assert curve["8"]["mean"] == pytest.approx(rows[name]["bits_per_byte"]["128"], abs=1e-6)
        assert curve["8"]["low"] <= curve["8"]["mean"] <= curve["8"]["high"]


def test_the_search_and_the_rate_sweep_read_dev_and_the_curves_read_test(smoke, tmp_path, monkeypatch):
    from posenc.experiments.extend import searching, tuning
    from posenc.lm.data import stdlib_corpus

    seen = {"search": [], "dev": [], "curve": []}
    objective, evaluate = searching.lm_objective, tuning.evaluate

    def objective_spy(model, windows, **kwargs):
        seen["search"].append(windows.clone())
        return objective(model, windows, **kwargs)

    def evaluate_spy(model, windows, lengths, **kwargs):
        seen["dev" if kwargs["label"].startswith("dev") else "curve"].append(windows.clone())
        return evaluate(model, windows, lengths, **kwargs)

    monkeypatch.setattr(searching, "lm_objective", objective_spy)
    monkeypatch.setattr(tuning, "evaluate", evaluate_spy)
    out, _ = smoke
    assert main(["extend", "--preset", "smoke", "--run", str(out / "base"), "--methods", "longrope",
                 "--out", str(tmp_path / "spied")]) == 0
    corpus = stdlib_corpus()
    dev, test = bytes(corpus.dev.data.tolist()), bytes(corpus.test.data.tolist())
    assert all(seen.values())
    for purpose, split, other in (("search", dev, test), ("dev", dev, test), ("curve", test, dev)):
        rows = [bytes(row.tolist()) for windows in seen[purpose] for row in windows]
        assert all(row in split and row not in other for row in rows), purpose


def test_exported_rope_parameters_load_in_posenc_and_transformers(smoke):
    out, results = smoke
    exported = json.loads((out / "rope_parameters.json").read_text())
    params, metadata = exported["rope_parameters"], exported["metadata"]
    assert params["rope_type"] == "longrope" and params["factor"] == 8.0
    assert params["original_max_position_embeddings"] == 16 and len(params["long_factor"]) == 8
    assert "no field in transformers' longrope format" in metadata["n_hat_note"] and metadata["n_hat"] == 0
    assert params == {row["name"]: row for row in results["rows"]}["rope+longrope"]["scaling"]
    log = json.loads((out / "search_log-seed0.json").read_text())
    assert params["long_factor"] == log["best"]["factors"]
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=32, num_attention_heads=2, max_position_embeddings=16, rope_parameters=params)
    for seq_len in (8, 100):
        theirs, their_factor = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=seq_len)
        ours, our_factor = posenc.rope_frequencies(16, params, seq_len=seq_len)
        assert torch.equal(ours, theirs) and our_factor == pytest.approx(their_factor)


def test_search_summary_reports_n_hat_zero_beside_the_best(smoke):
    out, results = smoke
    longrope = results["longrope"]
    assert longrope["loss_best_n_hat"] <= min(longrope["seed_losses"].values())
    assert longrope["loss_n_hat_0"] >= longrope["loss_best_n_hat"] - 1e-9
    assert list(longrope["seed_losses"]) == ["pi", "ntk", "yarn"]
    assert all(b <= a for a, b in zip(longrope["best_loss_per_generation"], longrope["best_loss_per_generation"][1:]))
    assert longrope["candidates_per_s"] > 0


def test_extend_from_a_finished_run_reuses_its_checkpoints(smoke, tmp_path, capsys):
    out, results = smoke
    assert main(["extend", "--preset", "smoke", "--run", str(out / "base"), "--methods", "pi",
                 "--finetune-steps", "0", "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert [r["name"] for r in again["rows"]] == ["rope", "rope+pi", "alibi"]
    assert again["rows"][1]["bits_per_byte"] == results["rows"][1]["bits_per_byte"]  # same weights, same windows
    assert "trained in" not in capsys.readouterr().out
    assert not (tmp_path / "again" / "longrope_factors.png").exists()


def test_a_run_without_rope_names_what_it_has(smoke, tmp_path, capsys):
    out, _ = smoke
    run = tmp_path / "alibi-only"
    shutil.copytree(out / "base", run)
    shutil.rmtree(run / "checkpoints" / "rope-seed0")
    assert main(["extend", "--preset", "smoke", "--run", str(run), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "has no finished RoPE checkpoint" in err and "it has: alibi-seed0" in err
    assert not (tmp_path / "o").exists()


def test_a_damaged_checkpoint_in_the_run_is_named(smoke, tmp_path, capsys):
    out, _ = smoke
    run = tmp_path / "damaged"
    shutil.copytree(out / "base", run)
    weights = run / "checkpoints" / "rope-seed0" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    assert main(["extend", "--preset", "smoke", "--run", str(run), "--methods", "pi", "--finetune-steps", "0",
                 "--out", str(tmp_path / "o")]) == 2
    assert f"{weights} is damaged or truncated" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--factor", "0.5"], "--factor must be a finite number >= 1, got 0.5"),
    (["--factor", "nan"], "--factor must be a finite number >= 1, got nan"),
    (["--factor", "2.03"], "is not a whole number of tokens"),
    (["--methods", "pi,rerope"], "unknown methods ['rerope']"),
    (["--finetune-steps", "-1"], "--finetune-steps must be an integer >= 0"),
    (["--search-population", "3"], "--search-population must be an integer >= 4"),
    (["--factor", "5"], "share no evaluation window of a sensible size"),
    (["--seeds", "0"], "--seeds must be an integer >= 1"),
    (["--sweep-windows", "0"], "--sweep-windows must be an integer >= 1"),
    (["--finetune-widenings", "-1"], "--finetune-widenings must be an integer >= 0"),
    (["--finetune-warmup", "-1"], "--finetune-warmup must be an integer >= 0"),
    (["--finetune-warmup", "9"], "--finetune-warmup (9) must be at most --finetune-steps (8)"),
    (["--finetune-steps", "4", "--finetune-warmup", "5"], "--finetune-warmup (5) must be at most --finetune-steps (4)"),
    (["--finetune-lrs", "1e-3,0.001"], "--finetune-lrs must not repeat a rate"),
    (["--factor", "16384"], "corpus too small"),
])
def test_bad_input_fails_before_anything_runs(tmp_path, capsys, args, message):
    assert main(["extend", "--preset", "smoke", *args, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, message", [
    (["--to", "1024"], "unrecognized arguments: --to 1024 (--to: flags of posenc pretrained)"),
    (["--draw", "seeded", "--corpus=kjv"], "(--corpus, --draw: flags of posenc pretrained)"),
])
def test_a_pretrained_models_flags_are_refused_with_the_command_that_takes_them(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit:
        main(["extend", "--preset", "smoke", *args, "--out", str(tmp_path / "o")])
    assert exit.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_not_a_number_factor_is_an_argument_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["extend", "--preset", "smoke", "--factor", "eight", "--out", str(tmp_path / "o")])
    assert "invalid float value: 'eight'" in capsys.readouterr().err


@pytest.mark.parametrize("rates", ["0", "1e-3,-1", "fast", ""])
def test_bad_learning_rates_are_an_argument_error(tmp_path, capsys, rates):
    with pytest.raises(SystemExit):
        main(["extend", "--preset", "smoke", "--finetune-lrs", rates, "--out", str(tmp_path / "o")])
    assert "expected comma-separated numbers > 0" in capsys.readouterr().err


def test_resume_refuses_a_changed_config_and_a_folder_without_a_run(smoke, tmp_path, capsys):
    out, _ = smoke
    assert main(["extend", "--preset", "smoke", "--out", str(out)]) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    assert main(["extend", "--preset", "smoke", "--finetune-steps", "9", "--out", str(out), "--resume"]) == 2
    assert "differs in ['finetune_steps']" in capsys.readouterr().err
    (tmp_path / "typo").mkdir()
    assert main(["extend", "--preset", "smoke", "--out", str(tmp_path / "typo"), "--resume"]) == 2
    assert "holds no posenc extend run" in capsys.readouterr().err


def test_a_damaged_search_log_is_named(smoke, tmp_path, capsys):
    out, _ = smoke
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for name in ("longrope-seed0.json", "rope_parameters.json"):
        (copy / name).unlink()
    (copy / "search_log-seed0.json").write_text('{"config": ')
    assert main(["extend", "--preset", "smoke", "--out", str(copy), "--resume"]) == 2
    assert f"search log {copy / 'search_log-seed0.json'} is damaged or truncated" in capsys.readouterr().err


def _cli(*args):
    return [sys.executable, "-m", "posenc", "extend", "--preset", "smoke", *args]


def test_sigkill_then_resume_loses_no_finished_stage(smoke, tmp_path):
    out, _ = smoke
    args = ["--run", str(out / "base")]
    subprocess.run(_cli(*args, "--out", str(tmp_path / "reference")), env=ENV, check=True, capture_output=True,
                   timeout=300)
    killed = tmp_path / "killed"
    process = subprocess.Popen(_cli(*args, "--out", str(killed)), env=ENV, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    marker = killed / "finetune" / "rope+ntk-fine-tuned" / "seed0" / "lr0.0003" / "curve.json"
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = killed / "finetune" / "rope+pi-fine-tuned" / "seed0" / "lr0.002" / "model.safetensors"
    stamp = finished.stat().st_mtime_ns if finished.exists() else None
    subprocess.run(_cli(*args, "--out", str(killed), "--resume"), env=ENV, check=True, capture_output=True,
                   timeout=300)
    if stamp is not None:
        assert finished.stat().st_mtime_ns == stamp  # a finished fine-tune is not redone
    got = json.loads((killed / "results.json").read_text())
    want = json.loads((tmp_path / "reference" / "results.json").read_text())
    assert got["longrope"]["best"] == want["longrope"]["best"]
    for a, b in zip(got["rows"], want["rows"]):
        assert a["bits_per_byte"] == pytest.approx(b["bits_per_byte"], abs=1e-4), a["name"]
    for name, curve in want["curves"].items():
        assert {s: v["mean"] for s, v in got["curves"][name].items()} == pytest.approx(
            {s: v["mean"] for s, v in curve.items()}, abs=1e-4), name
    assert got["sweep"] == want["sweep"]


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists(),
                    reason="torchrun not installed")
def test_ddp_extend_with_two_cpu_processes_matches_one(smoke, tmp_path):
    out, single = smoke
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun if torchrun.exists() else "torchrun"), "--standalone", "--nproc_per_node", "2",
               "-m", "posenc", "extend", "--preset", "smoke", "--run-dir", str(out / "base"), "--methods", "yarn",
               "--out", str(tmp_path / "ddp")]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, failure_text(done.stderr)
    rows = {row["name"]: row for row in json.loads((tmp_path / "ddp" / "results.json").read_text())["rows"]}
    want = {row["name"]: row for row in single["rows"]}
    for name in ("rope+yarn fine-tuned", "alibi fine-tuned"):  # two processes, one global batch: the same model
        assert rows[name]["bits_per_byte"] == pytest.approx(want[name]["bits_per_byte"], abs=1e-3), name


def test_two_processes_can_share_the_seeds_and_a_third_call_writes_the_same_tables(tmp_path, capsys):
    base = tmp_path / "base"
    assert main(["extrapolate", "--preset", "smoke", "--encodings", "rope", "--seeds", "2", "--out", str(base)]) == 0
    args = ["extend", "--preset", "smoke", "--run", str(base), "--seeds", "2", "--methods", "pi",
            "--finetune-lrs", "3e-4", "--finetune-widenings", "0"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    split = tmp_path / "split"
    assert main([*args, "--out", str(split), "--only-seeds", "1"]) == 0
    assert "seeds [1] done" in capsys.readouterr().out
    assert not (split / "results.json").exists()
    assert sorted(path.name for path in (split / "evals").rglob("*.json")) == [
        "rope+pi-fine-tuned-seed1.json", "rope+pi-seed1.json", "rope-fine-tuned-seed1.json", "rope-seed1.json"]
    assert main([*args, "--out", str(split), "--only-seeds", "0", "--resume"]) == 0
    assert main([*args, "--out", str(split), "--resume"]) == 0
    assert "fine-tuning" not in capsys.readouterr().out  # the collecting call found every stage finished
    got, want = (json.loads((folder / "results.json").read_text()) for folder in (split, tmp_path / "whole"))
    assert got["seeds"] == want["seeds"] == [0, 1]
    for a, b in zip(got["rows"], want["rows"], strict=True):
        assert a["per_seed"] == b["per_seed"], a["name"]


@pytest.mark.parametrize("args, message", [
    (["--only-seeds", "0"], "--only-seeds needs --run"),
    (["--run", "RUN", "--only-seeds", "0,1"], "--only-seeds [1] are not among this run's seeds [0]"),
    (["--run", "RUN", "--only-seeds", ""], "--only-seeds [] are not among"),
])
def test_only_seeds_outside_the_run_or_without_one_is_refused(smoke, tmp_path, capsys, args, message):
    out, _ = smoke
    args = [str(out / "base") if arg == "RUN" else arg for arg in args]
    assert main(["extend", "--preset", "smoke", *args, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("steps, warmup, want", [(None, None, 8), (10, None, 1), (40, None, 4), (0, None, 0),
                                                 (10, 3, 3), (None, 0, 0)])
def test_fewer_fine_tuning_steps_keep_the_presets_warm_up_fraction_unless_one_is_given(steps, warmup, want):
    from posenc.experiments.extend import ExtendConfig

    config = ExtendConfig.from_preset("default", finetune_steps=steps, finetune_warmup=warmup)
    assert config.finetune_warmup == want
