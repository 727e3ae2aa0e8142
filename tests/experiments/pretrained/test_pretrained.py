"""``posenc extend --hf`` end to end on the smoke preset (a tiny random Llama over bytes): every row and file,
choose on dev / report on test, the exported folder, resume after SIGKILL, torchrun, and bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posenc.cli import main
from posenc.experiments.pretrained import PretrainedConfig
from posenc.experiments.pretrained.measure import ByteTokens, long_documents, position_losses, sliding_losses
from posenc.experiments.pretrained.stages import plan_rows

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ROWS = ["none", "yarn", "ntk", "self-extend", "yarn+pose", "yarn+control"]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "run"
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--out", str(out),
                 "--export", str(out.parent / "exported")]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_hf_smoke_writes_every_file_row_and_measure(smoke):
    out, results = smoke
    for name in ("results.json", "results.md", "loss_by_position.png", "retrieval.png", "finetune_curve.png",
                 "rope_parameters.json"):
        assert (out / name).stat().st_size > 0, name
    assert list(results["rows"]) == ROWS and results["factor"] == 16.0 and results["original_context"] == 64
    config = results["config"]
    for name, row in results["rows"].items():
        assert len(row["test"]) == config["documents"] == 4 and len(row["dev"]) == config["dev_documents"]
        for length in config["retrieval_lengths"]:
            keys = row["retrieval"][str(length)]
            assert len(keys) == config["bands"] * config["keys_per_band"] == 12
            assert all(k["log_prob"] < 0 for k in keys)
        assert row["past"]["low"] <= row["past"]["mean"] <= row["past"]["high"]
    past = {name: round(row["past"]["mean"], 6) for name, row in results["rows"].items()}
    assert len(set(past.values())) == len(ROWS)  # every row changes the model
    # Self-Extend is exact inside its window: its first tokens score as the unscaled model's
    assert results["rows"]["self-extend"]["first"]["mean"] == pytest.approx(results["rows"]["none"]["first"]["mean"],
                                                                             abs=1e-5)
    assert set(results["finetune"]) == {"yarn+pose", "yarn+control"}
    assert "yarn+pose − yarn+control" in results["comparisons"] and "| yarn+pose |" in (out / "results.md").read_text()


def test_test_and_dev_windows_come_from_different_files_each_inside_one_document(smoke):
    _, results = smoke
    test = {w["file"] for w in results["windows"]["test"]}
    dev = {w["file"] for w in results["windows"]["dev"]}
    assert test and dev and not test & dev
    config = PretrainedConfig.from_preset("smoke")
    windows = long_documents(config, ByteTokens(), "test", 4, config.to)
    assert all(w["ids"].shape == (config.to,) for w in windows)


def test_the_best_row_is_chosen_on_dev_and_exported_as_a_folder_from_pretrained_loads(smoke):
    transformers = pytest.importorskip("transformers")
    out, results = smoke
    rows = results["rows"]
    candidates = {n: r["dev_past"] for n, r in rows.items() if n not in ("none", "self-extend")}
    assert results["best_row"] == min(candidates, key=candidates.get)
    exported = json.loads((out / "rope_parameters.json").read_text())
    assert exported["metadata"]["row"] == results["best_row"]
    model = transformers.AutoModelForCausalLM.from_pretrained(out.parent / "exported", local_files_only=True)
    assert model.config.rope_parameters == results["best_rope_parameters"]
    # the exported model scores the first test window as the run measured the best row
    config = PretrainedConfig.from_preset("smoke")
    window = long_documents(config, ByteTokens(), "test", 1, config.to)[0]["ids"]
    losses = position_losses(model, window, config.chunk)
    assert losses[63:].mean().item() == pytest.approx(rows[results["best_row"]]["test"][0]["past"], abs=1e-5)


def test_the_context_control_reads_at_most_the_context():
    model = torch.nn.Module()
    calls = []

    def scorer(_, tokens, chunk, label=""):
        calls.append(tokens.shape[0])
        return torch.arange(tokens.shape[0] - 1, dtype=torch.float32)

    import posenc.experiments.pretrained.measure as measure

    original, measure.position_losses = measure.position_losses, scorer
    try:
        losses = sliding_losses(model, torch.zeros(200, dtype=torch.long), 64, 32, 63, chunk=8)
    finally:
        measure.position_losses = original
    assert losses.shape == (200 - 1 - 63,) and max(calls) <= 65 and len(calls) == 5
    # each value is the scored position's index in its window = its context: between context − stride and context
    assert losses.min().item() == 32 and losses.max().item() == 63 and losses[-1].item() == 63


def test_rows_follow_the_methods_and_the_finetune_mode():
    config = PretrainedConfig.from_preset("smoke", finetune="full")
    assert list(plan_rows(config)) == ["none", "yarn", "ntk", "self-extend", "yarn+full"]
    rows = plan_rows(PretrainedConfig.from_preset("smoke", methods="none,rerope"))
    assert rows["rerope"]["attention"] == "rerope" and rows["yarn+control"]["finetune"] == "control"


@pytest.mark.parametrize("args, message", [
    (["--to", "64"], "--to 64 is not above the model's context (64)"),
    (["--methods", "none,self-extended"], "unknown methods ['self-extended']"),
    (["--finetune-window", "128"], "--finetune-window (128) is longer than the model's context (64): PoSE"),
    (["--lora", "0"], "--lora must be a rank >= 1"),
    (["--self-extend-group", "1"], "--self-extend-group must be an integer >= 2"),
    (["--self-extend-window", "1024"], "--self-extend-window (1024) must be below --to (1024)"),
    (["--finetune-lrs", "1e-3", "--from-scratch"], "--finetune-lrs, --from-scratch apply to posenc's own models"),
    (["--finetune", "none", "--lora", "4"], "--lora apply to fine-tuning: add --finetune pose"),
    (["--finetune", "full", "--finetune-window", "32"], "--finetune-window apply to --finetune pose; --finetune full"),
    (["--methods", "none,yarn", "--self-extend-window", "16"], "--self-extend-window apply to the self-extend and"),
])
def test_bad_hf_input_is_one_line_before_any_work(tmp_path, capsys, args, message):
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", *args, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_not_enough_long_documents_says_how_many_there_are(tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("x = 1\n" * 200)
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--text", str(text), "--out", str(tmp_path / "o")]) == 2
    assert "not enough long text: the test split has 0 windows of 1,024 tokens" in capsys.readouterr().err


def test_export_refuses_a_folder_it_did_not_write_before_any_work(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--out", str(tmp_path / "o"),
                 "--export", str(tmp_path / "mine")]) == 2
    assert "exists and was not written by posenc.hf.export" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me" and not (tmp_path / "o").exists()


def test_sigkill_then_resume_equals_the_uninterrupted_run(smoke, tmp_path):
    _, reference = smoke
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "posenc", "extend", "--hf", "tiny", "--preset", "smoke", "--out", str(out)]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = out / "finetune" / "yarn+control" / "last.pt"  # killed inside the second fine-tune
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = out / "finetune" / "yarn+pose" / "model.safetensors"
    stamp = finished.stat().st_mtime_ns if finished.exists() else None
    subprocess.run(command + ["--resume"], env=ENV, check=True, capture_output=True, timeout=300)
    if stamp is not None:
        assert finished.stat().st_mtime_ns == stamp  # a finished fine-tune is not redone
    got = json.loads((out / "results.json").read_text())
    for name, row in reference["rows"].items():
        assert [w["past"] for w in got["rows"][name]["test"]] == pytest.approx([w["past"] for w in row["test"]],
                                                                              abs=1e-5), name
    assert got["finetune"]["yarn+control"]["losses"] == pytest.approx(reference["finetune"]["yarn+control"]["losses"])


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists(),
                    reason="torchrun not installed")
def test_fine_tuning_under_torchrun_with_two_cpu_processes_matches_one(smoke, tmp_path):
    _, reference = smoke
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun if torchrun.exists() else "torchrun"), "--standalone", "--nproc_per_node", "2",
               "-m", "posenc", "extend", "--hf", "tiny", "--preset", "smoke", "--methods", "none",
               "--finetune-batch", "2", "--out", str(tmp_path / "ddp")]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    single = tmp_path / "single"
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--methods", "none", "--finetune-batch", "2",
                 "--out", str(single)]) == 0
    got = json.loads((tmp_path / "ddp" / "results.json").read_text())
    want = json.loads((single / "results.json").read_text())
    for name in ("yarn+pose", "yarn+control"):  # two processes, one global batch: the same model
        assert [w["past"] for w in got["rows"][name]["test"]] == pytest.approx(
            [w["past"] for w in want["rows"][name]["test"]], abs=1e-4), name
