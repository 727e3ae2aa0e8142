import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from posenc.cli import main
from posenc.experiments.pretrained import PretrainedConfig
from posenc.experiments.pretrained.measure import ByteTokens, position_losses, read_text_tokens

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "run"
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--out", str(out),
                 "--export", str(out.parent / "exported")]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_hf_smoke_writes_every_file_method_and_length(smoke):
    out, results = smoke
    for name in ("results.json", "results.md", "loss_by_position.png", "passkey.png", "rope_parameters.json"):
        assert (out / name).stat().st_size > 0, name
    assert list(results["methods"]) == ["none", "pi", "ntk", "dynamic", "yarn"]
    assert results["factor"] == 8.0 and results["original_context"] == 64
    for method, record in results["methods"].items():
        assert list(record["loss"]) == ["64", "128", "256", "512"]
        assert record["loss"]["512"]["bins"]["loss"] and list(record["passkey"]) == ["320", "512"]
    means = {m: r["loss"]["512"]["mean"] for m, r in results["methods"].items()}
    assert len({round(v, 6) for v in means.values()}) == 5  # every scaling changes the model
    exported = json.loads((out / "rope_parameters.json").read_text())
    assert exported["metadata"]["method"] == results["best_method"] == min(
        (m for m in means if m != "none"), key=means.get)
    assert "| none |" in (out / "results.md").read_text()


def test_export_writes_the_best_scaling_as_a_model_from_pretrained_loads(smoke):
    transformers = pytest.importorskip("transformers")

    out, results = smoke
    model = transformers.AutoModelForCausalLM.from_pretrained(out.parent / "exported", local_files_only=True)
    assert model.config.rope_parameters == results["best_rope_parameters"]
    # the exported model's loss over the first 512 tokens is the one the run measured for that method
    config = PretrainedConfig.from_preset("smoke")
    window = read_text_tokens(config, ByteTokens())[:513]
    with torch.no_grad():
        loss = position_losses(model, window, config.chunk).mean().item()
    assert loss == pytest.approx(results["methods"][results["best_method"]]["loss"]["512"]["mean"], abs=1e-5)


def test_dynamic_runs_a_window_per_length_and_static_methods_share_one(smoke):
    out, _ = smoke
    record = lambda m, n: json.loads((out / "measurements" / f"loss-{m}-{n}.json").read_text())  # noqa: E731
    assert {record("yarn", n)["forward_length"] for n in (64, 512)} == {512}
    assert [record("dynamic", n)["forward_length"] for n in (64, 512)] == [64, 512]


@pytest.mark.parametrize("args, message", [
    (["--to", "64"], "--to 64 is not above the model's context (64)"),
    (["--methods", "none,rerope"], "unknown methods ['rerope']"),
    (["--finetune-lrs", "1e-3", "--from-scratch"], "--finetune-lrs, --from-scratch apply to posenc's own models"),
])
def test_bad_hf_input(tmp_path, capsys, args, message):
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", *args, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_device_cuda_without_cuda_is_refused_before_loading(tmp_path, capsys):
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--device", "cuda", "--out", str(tmp_path / "o")]) == 2
    assert "--device cuda: no CUDA device is available here" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_not_enough_text_says_how_many_tokens_there_are(tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("x = 1\n" * 200)
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--text", str(text), "--out", str(tmp_path / "o")]) == 2
    assert "not enough text: its test split has 60 tokens" in capsys.readouterr().err


def test_export_refuses_a_folder_it_did_not_write_before_any_work(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--out", str(tmp_path / "o"),
                 "--export", str(tmp_path / "mine")]) == 2
    assert "exists and was not written by posenc.hf.export" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me" and not (tmp_path / "o").exists()
    assert main(["extend", "--preset", "smoke", "--export", str(tmp_path / "x")]) == 2
    assert "--export apply to a pretrained model: they need --hf" in capsys.readouterr().err


def test_a_path_that_is_no_model_is_refused(tmp_path, capsys):
    assert main(["extend", "--hf", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "is neither a model directory (with config.json) nor a .gguf file" in capsys.readouterr().err


def test_sigkill_then_resume_keeps_every_finished_measurement(smoke, tmp_path):
    _, reference = smoke
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "posenc", "extend", "--hf", "tiny", "--preset", "smoke", "--out", str(out)]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = out / "measurements" / "passkey-pi-512.json"
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = sorted((out / "measurements").glob("*.json"))
    stamps = {path: path.stat().st_mtime_ns for path in finished}
    subprocess.run(command + ["--resume"], env=ENV, check=True, capture_output=True, timeout=300)
    assert all(path.stat().st_mtime_ns == stamp for path, stamp in stamps.items())  # nothing finished is redone
    got = json.loads((out / "results.json").read_text())
    for method, record in reference["methods"].items():
        for length, loss in record["loss"].items():
            assert got["methods"][method]["loss"][length]["mean"] == pytest.approx(loss["mean"], abs=1e-5)
        assert got["methods"][method]["passkey"] == record["passkey"]


def test_a_smoke_sized_longrope_search_on_a_pretrained_model(tmp_path):
    out = tmp_path / "search"
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--methods", "none,yarn,longrope",
                 "--search-population", "4", "--search-generations", "2", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    log = json.loads((out / "search_log.json").read_text())
    longrope = results["methods"]["longrope"]["rope_parameters"]
    assert longrope["rope_type"] == "longrope" and longrope["long_factor"] == log["best"]["factors"]
    assert len(longrope["long_factor"]) == 8 and longrope["original_max_position_embeddings"] == 64
    losses = [g["best_loss"] for g in log["generations"]]
    assert len(losses) == 2 and losses[1] <= losses[0]
    # the search's objective is the loss at --to on windows after the measured one: not the reported number
    assert log["best"]["loss"] != pytest.approx(results["methods"]["longrope"]["loss"]["512"]["mean"], abs=1e-9)
