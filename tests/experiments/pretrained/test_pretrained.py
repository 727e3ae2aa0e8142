"""``posenc pretrained`` end to end on the smoke preset (a tiny random Llama over bytes): every row and file,
choose on dev / report on test, the exported folder, resume after SIGKILL, torchrun, and bad input."""

import json
import os
import re
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
from posenc.experiments.pretrained import PretrainedConfig
from posenc.experiments.pretrained.measure import (ByteTokens, long_documents, position_losses, sliding_losses,
                                                   tiny_llama)
from posenc import hf
from posenc.extension import retrieval
from posenc.extension.retrieval import make_haystack
from posenc.experiments.pretrained.config import plan_rows
from posenc.experiments.pretrained.stages import _check_against_model
from tests.helpers import failure_text

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ROWS = ["none", "yarn", "ntk", "self-extend", "yarn+pose", "yarn+control"]


SMOKE_SECONDS = []  # how long the smoke run took: no stage of it can have taken longer


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "run"
    started = time.perf_counter()
    assert main(["pretrained", "tiny", "--preset", "smoke", "--out", str(out),
                 "--export", str(out.parent / "exported")]) == 0
    SMOKE_SECONDS.append(time.perf_counter() - started)
    return out, json.loads((out / "results.json").read_text())


def test_hf_smoke_writes_every_file_row_and_measure(smoke):
    out, results = smoke
    for name in ("results.json", "results.md", "loss_by_position.png", "retrieval.png", "finetune_curve.png",
                 "rope_parameters.json"):
        assert (out / name).stat().st_size > 0, name
    assert list(results["rows"]) == ROWS and results["factor"] == 2.0 and results["original_context"] == 512
    assert results["provenance"] == provenance()  # versions, commit, CPU
    assert results["commits"] == [provenance()["commit"]]
    assert provenance_line(results["provenance"]) in (out / "results.md").read_text()
    config = results["config"]
    for name, row in results["rows"].items():
        assert len(row["test"]) == config["documents"] == 4
        assert len(row["dev"]) == (config["dev_documents"] if name not in ("none", "self-extend") else 0)
        for document in row["test"]:  # every planted key asked, from the document's own prefill
            assert len(document["retrieval"]) == config["bands"] * config["keys_per_band"] == 4
            assert all(k["log_prob"] < 0 for k in document["retrieval"])
        assert row["past"]["low"] <= row["past"]["mean"] <= row["past"]["high"]
        assert row["keys"]["total"] == 16 and row["keys"]["low"] <= row["keys"]["accuracy"] <= row["keys"]["high"]
    past = {name: round(row["past"]["mean"], 6) for name, row in results["rows"].items()}
    assert len(set(past.values())) == len(ROWS)  # every row changes the model
    # Self-Extend is exact inside its window: its first tokens score as the unscaled model's
    assert results["rows"]["self-extend"]["first"]["mean"] == pytest.approx(results["rows"]["none"]["first"]["mean"],
                                                                             abs=1e-5)
    assert set(results["finetune"]) == {"yarn+pose", "yarn+control"}
    assert "loss past: yarn+pose − yarn+control" in results["comparisons"]
    assert "| yarn+pose |" in (out / "results.md").read_text()
    assert results["in_context"]["length"] == 256 and results["in_context"]["test_keys"]["total"] == 16
    assert results["control"]["context"] == [512 - 128 + 1, 512]
    assert results["corpus"]["sha256"] and results["documents"]["test"][0].startswith("stdlib/")
    # a file per measurement, each document's its own (a shared name would hand every document the first one's)
    wording, filed = results["retrieval_format"], {p.name for p in (out / "measurements").glob("*.json")}
    assert {f"doc-{name}-test{i}.json" for name in ROWS for i in range(4)} <= filed
    assert {f"doc-{name}-dev{i}.json" for name in ROWS[1:] if name != "self-extend" for i in range(2)} <= filed
    assert {f"{reader}-test{i}.json" for reader in ("control", "short") for i in range(4)} <= filed
    assert {f"in-context-{split}{i}-{wording}.json" for split, n in (("test", 4), ("dev", 2), ("far-test", 4))
            for i in range(n)} <= filed
    assert not [name for name in filed if "None" in name]
    assert set(results["stages_s"]) == {
        "load model and text", "retrieval calibration (unscaled, dev)", "fine-tune yarn+pose", "fine-tune yarn+control",
        *(f"measure {name}" for name in ROWS), "in-context retrieval (unscaled)", "context control",
        "short reader (context use)"}
    assert all(0 <= seconds <= SMOKE_SECONDS[0] for seconds in results["stages_s"].values())


def test_every_comparison_carries_its_documents_and_the_run_wide_correction(smoke):
    _, results = smoke
    family = results["comparisons"]
    assert len(family) == 18 and all(c["comparisons"] == 18 for c in family.values())
    assert results["family"] == {"declared": "before the run: extend --hf's fixed comparisons of the rows its first "
                                             "invocation planned", "exploratory": False, "comparisons": list(family)}
    assert sum(name.startswith("farthest keys: ") for name in family) == len(ROWS) - 1  # every row but none
    for name, c in family.items():
        assert list(c["per_document"]) == results["documents"]["test"], name  # pairs stay pairs
        low, high = c["corrected"]
        assert low <= c["low"] <= c["mean"] <= c["high"] <= high  # the corrected interval is the wider
        assert c["p_holm"] >= c["p"] and c["verdict"] == (not low <= 0 <= high and c["p_holm"] < 0.05)
    rows = results["rows"]
    none = family["loss past: none − context control"]
    want = [d["past"] - k["past"] for d, k in zip(rows["none"]["test"], results["control"]["test"])]
    assert list(none["per_document"].values()) == pytest.approx(want)


def test_each_documents_row_and_control_are_measured_on_that_document_and_the_curve_on_dev(smoke):
    """Recomputed here from the documents alone, on the first and last test documents: the unscaled row's loss
    (first tokens, inside and past the context) and the control's (read in another order, it would pair with
    another document's row; reading less than the context, it would score higher); Self-Extend's row at the run's
    group; the in-context keys at half the context; and the fine-tune curve's step 0 on the first dev document."""
    from posenc.experiments.pretrained import keys
    from posenc.experiments.pretrained.measure import load_model
    from posenc.extension.self_extend import use_attention, use_self_extend

    _, results = smoke
    config = PretrainedConfig.from_preset("smoke")
    model, tokens = load_model(config)
    model.set_attn_implementation("sdpa")
    original, test = results["original_context"], long_documents(config, tokens, "test", 4, config.to)
    for i in (0, 3):
        haystack = keys.haystack(tokens, test[i]["ids"], config.to, config, i, results["retrieval_format"])
        ids, text = torch.tensor(haystack.ids), haystack.scored()  # text: the targets that are not a needle's
        control = sliding_losses(model, ids, original, config.control_stride, original - 1, config.chunk)
        assert control[text[original - 1 :]].mean().item() == pytest.approx(results["control"]["test"][i]["past"],
                                                                            abs=1e-5)
        losses, row = position_losses(model, ids, config.chunk), results["rows"]["none"]["test"][i]
        for key, span in (("first", slice(0, config.first_tokens)), ("inside", slice(0, original - 1)),
                          ("past", slice(original - 1, None))):
            assert losses[span][text[span]].mean().item() == pytest.approx(row[key], abs=1e-5), key
    use_self_extend(model, config.self_extend_window, results["self_extend_group"])
    losses = position_losses(model, torch.tensor(haystack.ids), config.chunk)  # the last document's, grouped
    assert losses[original - 1 :][text[original - 1 :]].mean().item() == pytest.approx(
        results["rows"]["self-extend"]["test"][3]["past"], abs=1e-5)
    use_attention(model, "sdpa")
    half = results["in_context"]["length"]  # the in-context baseline: keys in the first half of the context
    planted = keys.haystack(tokens, test[1]["ids"][:half], half, config, 1, results["retrieval_format"])
    asked = retrieval.retrieve(model, planted, tokens.encode, tokens.decode)
    assert [k["log_prob"] for k in asked] == pytest.approx([k["log_prob"] for k in results["in_context"]["test"][1]],
                                                           abs=1e-5)
    far = results["in_context"]["far_length"]  # the far bands' counterpart: keys up to 15/16 of the context back
    assert far == original - original // 16
    planted = keys.haystack(tokens, test[2]["ids"][:far], far, config, 2, results["retrieval_format"])
    asked = retrieval.retrieve(model, planted, tokens.encode, tokens.decode)
    assert [k["log_prob"] for k in asked] == pytest.approx(
        [k["log_prob"] for k in results["in_context"]["test_far"][2]], abs=1e-5)
    hf.apply_scaling(model, results["rows"]["yarn"]["rope_parameters"])
    dev = long_documents(config, tokens, "dev", 1, config.to)[0]["ids"]
    before_training = position_losses(model, dev, config.chunk)[original - 1 :].mean().item()
    for name in ("yarn+pose", "yarn+control"):
        assert results["finetune"][name]["curve"]["0"] == pytest.approx(before_training, abs=1e-5)


def test_the_context_use_readers_are_filed_as_they_say(smoke):
    """On the last test document, recomputed from the document: the long reader is the unscaled model's losses
    inside the context (as the unscaled row's) and the control's past it; the short reader reads windows of a
    quarter of the context advancing by an eighth; the summary counts the targets the two readers pick."""
    from posenc.experiments.pretrained import context_use, keys
    from posenc.experiments.pretrained.measure import load_model

    out, results = smoke
    config = PretrainedConfig.from_preset("smoke")
    model, tokens = load_model(config)
    model.set_attn_implementation("sdpa")
    original, short = results["original_context"], context_use.short_context(results["original_context"])
    document = long_documents(config, tokens, "test", 4, config.to)[3]
    haystack = keys.haystack(tokens, document["ids"], config.to, config, 3, results["retrieval_format"])
    ids = torch.tensor(haystack.ids)
    long = context_use.load_losses(out, "control-test3")
    assert torch.allclose(long[: original - 1], context_use.load_losses(out, "none-test3")[: original - 1], atol=1e-5)
    assert torch.allclose(long[original - 1 :], sliding_losses(model, ids, original, config.control_stride,
                                                               original - 1, config.chunk), atol=1e-5)
    reader = context_use.load_losses(out, "short-test3")
    assert torch.allclose(reader, sliding_losses(model, ids, short, short // 2, 0, config.chunk), atol=1e-5)
    assert torch.allclose(context_use.load_losses(out, "yarn-test3")[original - 1 :][haystack.scored()[original - 1 :]]
                          .mean(), torch.tensor(results["rows"]["yarn"]["test"][3]["past"]), atol=1e-5)
    needed = context_use.needing_long_context(long, reader, haystack.scored(), original)
    summary = results["context_use"]
    assert summary["targets"]["past"][3] == int(needed[original - 1 :].sum())
    assert summary["targets"]["inside"][3] == int(needed[: original - 1].sum())
    assert list(summary["rows"]) == ROWS and summary["short"] == short


def test_test_and_dev_documents_differ_each_window_inside_one_document(smoke):
    _, results = smoke
    test, dev = set(results["documents"]["test"]), set(results["documents"]["dev"])
    assert len(test) == 4 and len(dev) == 2 and not test & dev
    config = PretrainedConfig.from_preset("smoke")
    windows = long_documents(config, ByteTokens(), "test", 4, config.to)
    assert all(w["ids"].shape == (config.to,) for w in windows)
    assert [w["file"] for w in windows] == results["documents"]["test"]


def test_the_best_row_is_chosen_on_dev_and_exported_as_a_folder_from_pretrained_loads(smoke):
    transformers = pytest.importorskip("transformers")
    out, results = smoke
    rows = results["rows"]
    candidates = {n: sum(d["past"] for d in r["dev"]) / len(r["dev"]) for n, r in rows.items()
                  if n not in ("none", "self-extend")}
    assert results["best_row"] == min(candidates, key=candidates.get)
    exported = json.loads((out / "rope_parameters.json").read_text())
    assert exported["metadata"]["row"] == results["best_row"]
    model = transformers.AutoModelForCausalLM.from_pretrained(out.parent / "exported", local_files_only=True)
    assert model.config.rope_parameters == results["best_rope_parameters"]
    # the exported model scores the first test document (its keys' tokens excluded) as the run measured
    config = PretrainedConfig.from_preset("smoke")
    window = long_documents(config, ByteTokens(), "test", 1, config.to)[0]["ids"]
    haystack = make_haystack(ByteTokens().encode, window.tolist(), config.to, config.bands, config.keys_per_band,
                             seed=0, format=results["retrieval_format"])
    losses = position_losses(model, torch.tensor(haystack.ids), config.chunk)
    past = losses[511:][haystack.scored()[511:]].mean().item()
    assert past == pytest.approx(rows[results["best_row"]]["test"][0]["past"], abs=1e-5)


def test_the_retrieval_format_is_chosen_on_dev_at_half_the_context_and_worded_so_at_test(smoke):
    out, results = smoke
    calibration = results["calibration"]
    # the tiny model finds no key, so no wording reaches the bar and every one is asked, in the calibration's order
    assert calibration["length"] == 256 and list(calibration["formats"]) == list(retrieval.CALIBRATION_ORDER)
    assert calibration["chosen_by"].startswith("the first wording (in retrieval.CALIBRATION_ORDER)")
    scores = {name: (c["accuracy"], c["log_prob"]) for name, c in calibration["formats"].items()}
    assert results["retrieval_format"] == max(scores, key=scores.get)
    assert len(set(scores.values())) == len(scores)  # the tiny model finds no key: log-probabilities decide
    files = sorted(p.name for p in (out / "measurements").glob("in-context-*"))
    assert files == sorted([f"in-context-dev{i}-{name}.json" for i in range(2) for name in retrieval.FORMATS]
                           + [f"in-context-{kind}test{i}-{results['retrieval_format']}.json" for i in range(4)
                              for kind in ("", "far-")])
    # the calibration's number, asked by hand: the unscaled model on dev document 0's first 256 tokens
    config = PretrainedConfig.from_preset("smoke")
    model = tiny_llama(0, 512)
    window = long_documents(config, ByteTokens(), "dev", 1, config.to)[0]["ids"][:256]
    for name, wording in retrieval.FORMATS.items():
        haystack = make_haystack(ByteTokens().encode, window.tolist(), 256, 4, 1, seed=0, format=name)
        got = json.loads((out / "measurements" / f"in-context-dev0-{name}.json").read_text())
        needle = haystack.needles[0]
        _, log_prob = retrieval.ask_whole(model, haystack.ids, list(wording.ask(needle.label).encode()),
                                          list(f" {needle.key}".encode()))
        assert got[0]["key"] == needle.key and got[0]["log_prob"] == pytest.approx(log_prob, abs=1e-4)
    # test documents carry the chosen wording: the first key of the first test document, asked by hand
    window = long_documents(config, ByteTokens(), "test", 1, config.to)[0]["ids"]
    haystack = make_haystack(ByteTokens().encode, window.tolist(), config.to, 4, 1, seed=0,
                             format=results["retrieval_format"])
    hf.apply_scaling(model, results["rows"]["none"]["rope_parameters"])
    needle, wording = haystack.needles[0], retrieval.FORMATS[results["retrieval_format"]]
    _, log_prob = retrieval.ask_whole(model, haystack.ids, list(wording.ask(needle.label).encode()),
                                      list(f" {needle.key}".encode()))
    assert results["rows"]["none"]["test"][0]["retrieval"][0]["log_prob"] == pytest.approx(log_prob, abs=1e-4)
    assert f"Keys worded as {results['retrieval_format']!r}" in (out / "results.md").read_text()


def test_a_named_retrieval_format_is_used_without_calibrating_the_others(tmp_path):
    out = tmp_path / "run"
    assert main(["pretrained", "tiny", "--preset", "smoke", "--methods", "none", "--finetune", "none",
                 "--documents", "2", "--dev-documents", "1", "--retrieval-format", "remember", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["retrieval_format"] == "remember" and list(results["calibration"]["formats"]) == ["remember"]
    assert results["calibration"]["chosen_by"] == "--retrieval-format"


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
    # each value is the scored position's index in its window = its context − 1: context − stride + 1 .. context
    assert losses.min().item() == 32 and losses.max().item() == 63 and losses[-1].item() == 63


@pytest.mark.parametrize("stride", [1, 5])
def test_the_control_equals_rereading_each_target_from_scratch(stride):
    """Stride 1: every target is scored by a fresh read of exactly its last ``context`` tokens; stride s: by a
    fresh read of the window that ends at its block's end (a causal model ignores what follows it)."""
    torch.manual_seed(0)
    model = tiny_llama(0, 16).double()
    tokens = torch.randint(0, 256, (40,))
    context, start = 16, 15
    got = sliding_losses(model, tokens, context, stride, start, chunk=7)
    want = []
    for p in range(start, 39):
        end = min(start + stride * ((p - start) // stride + 1), 39)  # the end of p's stride block
        first = max(0, end - context)
        reread = model(input_ids=tokens[None, first : p + 1]).logits[0, -1]
        assert context - stride + 1 <= p - first + 1 <= context  # what the target at p + 1 sees
        want.append(torch.nn.functional.cross_entropy(reread[None], tokens[p + 1 : p + 2]).item())
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=2e-6)  # float32 logits


def test_a_sliding_window_mask_is_not_rereading_past_one_layer():
    """Why the control re-reads: one pass under a sliding-window mask lets a deep layer see keys whose own
    states were built from tokens further back, so it differs from re-reading for a model of two layers."""
    model = tiny_llama(0, 16).double()
    tokens = torch.randint(0, 256, (33,), generator=torch.Generator().manual_seed(1))
    allowed = torch.ones(33, 33, dtype=torch.bool).tril() & ~torch.ones(33, 33, dtype=torch.bool).tril(-8)
    mask = torch.zeros(33, 33, dtype=torch.float64).masked_fill(~allowed, float("-inf"))[None, None]
    one_pass = model(input_ids=tokens[None], attention_mask=mask).logits[0, -1]
    reread = model(input_ids=tokens[None, -8:]).logits[0, -1]
    assert (one_pass - reread).abs().max().item() > 1e-3


def test_rows_follow_the_methods_and_the_finetune_mode():
    config = PretrainedConfig.from_preset("smoke", finetune="full")
    assert list(plan_rows(config)) == ["none", "yarn", "ntk", "self-extend", "yarn+full"]
    rows = plan_rows(PretrainedConfig.from_preset("smoke", methods="none,rerope"))
    assert rows["rerope"]["attention"] == "rerope" and rows["yarn+control"]["finetune"] == "control"


@pytest.mark.parametrize("args, message", [
    (["--to", "512"], "--to 512 is not above the model's context (512)"),
    (["--corpus", "kjv,bible"], "--corpus must be one or more of stdlib, kjv"),
    (["--corpus", "stdlib", "--text", "x.txt"], "--corpus and --text both name the documents: pass one"),
    (["--control-stride", "1000"], "--control-stride (1000) must be at most the model's context (512)"),
    (["--documents", "1"], "--documents must be an integer >= 2"),
    (["--keys-per-band", "5"], "--keys-per-band (5) x 4 bands is over the 16 labels"),
    (["--retrieval-format", "needle"], "--retrieval-format must be one of secret-word, remember, remember-twice, made-up, made-up-twice"),
    (["--methods", "none,self-extended"], "unknown methods ['self-extended']"),
    (["--finetune-window", "600"], "--finetune-window (600) is longer than the model's context (512): PoSE"),
    (["--lora", "0"], "--lora must be a rank >= 1"),
    (["--self-extend-group", "1"], "--self-extend-group must be an integer >= 2"),
    (["--self-extend-window", "1024"], "--self-extend-window (1024) must be below --to (1024)"),
    (["--finetune", "none", "--lora", "4"], "--lora apply to fine-tuning: add --finetune pose"),
    (["--finetune", "full", "--finetune-window", "32"], "--finetune-window apply to --finetune pose; --finetune full"),
    (["--methods", "none,yarn", "--self-extend-window", "16"], "--self-extend-window apply to the self-extend and"),
    (["--retrieval-tasks", "multi-value,needles"], "--retrieval-tasks must name tasks of multi-value, variable-tracking"),
    (["--retrieval-tasks", "multi-value,multi-value"], "--retrieval-tasks names a task twice"),
    (["--retrieval-tasks", "multi-value", "--task-questions", "0"], "--task-questions must be an integer >= 1, got 0"),
    (["--retrieval-tasks", "variable-tracking", "--task-size", "1"], "--task-size must be an integer >= 2"),
    (["--retrieval-tasks", "variable-tracking", "--task-questions", "5", "--task-size", "3"],
     "the keys (4 bands x --keys-per-band 1) and the tasks' questions need 19 labels, over the 16"),
    (["--task-size", "3"], "--task-size apply to --retrieval-tasks: name multi-value or variable-tracking"),
])
def test_bad_hf_input_is_one_line_before_any_work(tmp_path, capsys, args, message):
    assert main(["pretrained", "tiny", "--preset", "smoke", *args, "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_posenc_extends_own_models_flags_are_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["pretrained", "tiny", "--preset", "smoke", "--finetune-lrs", "1e-3", "--from-scratch"])
    assert exit.value.code == 2
    assert "unrecognized arguments: --finetune-lrs 1e-3 --from-scratch" in capsys.readouterr().err


def test_the_old_spelling_extend_hf_runs_the_pretrained_command_with_a_notice(tmp_path, capsys):
    """``extend --hf MODEL`` (and ``--hf=MODEL``) is ``pretrained MODEL``, said in one line; ``extend`` without
    it is still posenc's own models' command."""
    from posenc.cli import _old_spelling

    assert _old_spelling(["extend", "--preset", "smoke", "--hf", "tiny", "--to", "1024"]) == [
        "pretrained", "tiny", "--preset", "smoke", "--to", "1024"]
    assert _old_spelling(["extend", "--hf=smollm2"]) == ["pretrained", "smollm2"]
    assert _old_spelling(["extend", "--factor", "2"]) == ["extend", "--factor", "2"]
    assert _old_spelling(["verify", "--hf", "x"]) == ["verify", "--hf", "x"]
    capsys.readouterr()
    assert main(["extend", "--hf", "tiny", "--preset", "smoke", "--lora", "0", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["posenc: 'extend --hf' is now 'posenc pretrained MODEL'; running that",
                   "posenc pretrained: error: --lora must be a rank >= 1 (leave it out for full fine-tuning), got 0"]


def test_the_labels_a_document_holds_bound_the_tasks_at_their_edge():
    fits = PretrainedConfig.from_preset("smoke", retrieval_tasks="variable-tracking", task_questions=4, task_size=3)
    assert fits.retrieval_tasks == ("variable-tracking",)  # 4 keys and 4 chains of 3 names: the 16 labels exactly
    with pytest.raises(ValueError, match="need 20 labels, over the 16"):
        PretrainedConfig.from_preset("smoke", retrieval_tasks="variable-tracking,multi-value", task_questions=4,
                                     task_size=3)


@pytest.mark.parametrize("field, edge, past, message", [
    ("to", 513, 512, "--to 512 is not above the model's context"),
    ("finetune_window", 512, 513, "--finetune-window (513) is longer than the model's context"),
    ("self_extend_window", 511, 512, "--self-extend-window (512) must be below the model's context"),
    ("first_tokens", 512, 513, "--first-tokens (513) must be at most the model's context"),
    ("control_stride", 512, 513, "--control-stride (513) must be at most the model's context"),
])
def test_each_bound_against_the_models_context_holds_at_its_edge(field, edge, past, message):
    """The value at the edge is accepted and the next one refused (a bound off by one fails here)."""
    base = dict(to=2048) if field != "to" else {}
    _check_against_model(PretrainedConfig.from_preset("smoke", **base, **{field: edge}), 512)
    with pytest.raises(ValueError, match=re.escape(message)):
        _check_against_model(PretrainedConfig.from_preset("smoke", **base, **{field: past}), 512)


def test_not_enough_long_documents_says_how_many_there_are(tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("x = 1\n" * 200)
    assert main(["pretrained", "tiny", "--preset", "smoke", "--text", str(text), "--out", str(tmp_path / "o")]) == 2
    assert "not enough long text: the test split has 0 documents of at least 1,024 tokens" in capsys.readouterr().err


def test_export_refuses_a_folder_it_did_not_write_before_any_work(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert main(["pretrained", "tiny", "--preset", "smoke", "--out", str(tmp_path / "o"),
                 "--export", str(tmp_path / "mine")]) == 2
    assert "exists and was not written by posenc.hf.export" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me" and not (tmp_path / "o").exists()
    for export in (tmp_path / "mine" / "notes.txt", tmp_path / "mine" / "notes.txt" / "model"):  # through a file
        assert main(["pretrained", "tiny", "--preset", "smoke", "--out", str(tmp_path / "o"),
                     "--export", str(export)]) == 2
        assert capsys.readouterr().err == (f"posenc pretrained: error: --export: cannot write {export}: "
                                           f"{tmp_path / 'mine' / 'notes.txt'} is not a folder\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("earlier", [True, False], ids=["earlier-export", "new-folder"])
def test_a_run_folder_inside_the_export_is_refused_before_any_work(tmp_path, capsys, earlier):
    """The export replaces its folder whole: a run inside an earlier export was deleted with it (its results, the
    'wrote' line a lie); inside a new one the run finished, then the export refused the folder the run had made."""
    export = tmp_path / "exported"
    if earlier:
        export.mkdir()
        (export / "posenc.json").write_text("{}")
    out = export / "run"
    assert main(["pretrained", "tiny", "--preset", "smoke", "--out", str(out), "--export", str(export)]) == 2
    assert capsys.readouterr().err == (f"posenc pretrained: error: --out {out} is inside --export {export}, which "
                                       f"the export replaces whole; name a run directory outside it\n")
    assert not out.exists() and export.exists() == earlier


def test_sigkill_then_resume_equals_the_uninterrupted_run(smoke, tmp_path):
    _, reference = smoke
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "posenc", "pretrained", "tiny", "--preset", "smoke", "--out", str(out)]
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
    for name in ("yarn+pose", "yarn+control"):  # every loss and every curve point, as if never killed
        assert got["finetune"][name]["losses"] == pytest.approx(reference["finetune"][name]["losses"]), name
        assert got["finetune"][name]["curve"] == pytest.approx(reference["finetune"][name]["curve"]), name


def test_resume_adds_fine_tuned_rows_to_a_zero_shot_run_and_keeps_its_files(smoke, tmp_path, capsys):
    _, reference = smoke
    out = tmp_path / "grown"
    base = ["pretrained", "tiny", "--preset", "smoke", "--out", str(out)]
    assert main(base + ["--finetune", "none"]) == 0
    kept = out / "measurements" / "doc-self-extend-test0.json"
    stamp = kept.stat().st_mtime_ns
    assert main(base + ["--finetune", "pose", "--finetune-steps", "3", "--resume"]) == 2  # not only adding rows
    assert "differs in ['finetune_steps']" in capsys.readouterr().err
    assert main(base + ["--resume"]) == 0
    assert kept.stat().st_mtime_ns == stamp  # the zero-shot rows are read back, not measured again
    got = json.loads((out / "results.json").read_text())
    assert list(got["rows"]) == ROWS and got["config"]["finetune"] == "pose"
    for name, row in reference["rows"].items():
        assert [w["past"] for w in got["rows"][name]["test"]] == pytest.approx([w["past"] for w in row["test"]],
                                                                              abs=1e-6), name
    assert got["best_row"] == reference["best_row"]
    assert got["family"]["exploratory"] and got["family"]["declared"].startswith(
        "after results were seen: yarn+pose, yarn+control joined on --resume")
    assert main(base + ["--finetune", "none", "--resume"]) == 2  # a fine-tuned run does not shrink back
    assert "differs in ['finetune']" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists(),
                    reason="torchrun not installed")
def test_fine_tuning_under_torchrun_with_two_cpu_processes_matches_one(smoke, tmp_path):
    _, reference = smoke
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun if torchrun.exists() else "torchrun"), "--standalone", "--nproc_per_node", "2",
               "-m", "posenc", "pretrained", "tiny", "--preset", "smoke", "--methods", "none",
               "--finetune-batch", "2", "--out", str(tmp_path / "ddp")]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, failure_text(done.stderr)
    single = tmp_path / "single"
    assert main(["pretrained", "tiny", "--preset", "smoke", "--methods", "none", "--finetune-batch", "2",
                 "--out", str(single)]) == 0
    got = json.loads((tmp_path / "ddp" / "results.json").read_text())
    want = json.loads((single / "results.json").read_text())
    for name in ("yarn+pose", "yarn+control"):  # two processes, one global batch: the same model
        assert [w["past"] for w in got["rows"][name]["test"]] == pytest.approx(
            [w["past"] for w in want["rows"][name]["test"]], abs=1e-4), name
    # the measurements were split between the ranks, and rank 0 merged every one of them (the chosen format's two
    # dev in-context files were made earlier, while every format was calibrated; four are the short reader's and
    # four the far in-context haystacks')
    made = [int(n) for n in re.findall(r"rank \d: made (\d+) of 34 measurements", done.stdout)]
    assert sorted(made) == [16, 16], done.stdout[-2000:]
    # kept shares divide by sums of loss gaps; their t intervals over the few documents reach ±25: relative too
    assert got["context_use"]["targets"] == want["context_use"]["targets"] and numbers(got["context_use"]) == pytest.approx(
        numbers(want["context_use"]), rel=1e-5, abs=1e-5)
    assert got["retrieval_format"] == want["retrieval_format"] and numbers(got["calibration"]) == pytest.approx(
        numbers(want["calibration"]), abs=1e-5)
    assert got["processes"] == 2 and got["best_row"] == want["best_row"]
    for part in (lambda r: r["rows"]["none"], lambda r: r["in_context"], lambda r: r["control"]):
        assert numbers(part(got)) == pytest.approx(numbers(part(want)), abs=1e-5)


def numbers(record) -> list:
    """Every number in a JSON record, in a fixed order (strings and names left out)."""
    if isinstance(record, dict):
        return [n for key in sorted(record) for n in numbers(record[key])]
    if isinstance(record, list):
        return [n for item in record for n in numbers(item)]
    return [float(record)] if isinstance(record, (int, float)) and record is not None else []


def test_a_run_pinned_before_a_field_existed_resumes_when_the_field_keeps_its_default(tmp_path):
    from posenc import storage
    from posenc.experiments.pretrained.pins import pin as _pin

    config = PretrainedConfig.from_preset("smoke", methods=("none", "string"))
    older = {k: v for k, v in config.to_dict().items() if k not in ("string_shift", "string_local")}
    storage.write_json(tmp_path / "config.json", {"hf": {**older, "methods": ["none"]}})
    _pin(tmp_path, config, resume=True)  # adds the string row; the new fields are at their defaults
    storage.write_json(tmp_path / "config.json", {"hf": {**older, "methods": ["none"]}})
    with pytest.raises(ValueError, match=r"differs in \['string_local'\]"):
        _pin(tmp_path, PretrainedConfig.from_preset("smoke", methods=("none", "string"), string_local=8), resume=True)


def test_a_run_pinned_before_wordings_were_calibrated_resumes_only_in_its_own_wording(tmp_path):
    """Its finished files hold keys worded "The secret word for ...": auto could choose another wording for the
    rows still to measure, so resuming it asks for that wording by name."""
    from posenc import storage
    from posenc.experiments.pretrained.pins import pin as _pin

    config = PretrainedConfig.from_preset("smoke")
    older = {k: v for k, v in config.to_dict().items() if k != "retrieval_format"}
    storage.write_json(tmp_path / "config.json", {"hf": older})
    with pytest.raises(ValueError, match=r"differs in \['retrieval_format'\]"):
        _pin(tmp_path, config, resume=True)
    _pin(tmp_path, PretrainedConfig.from_preset("smoke", retrieval_format="secret-word"), resume=True)


class _Searched(Exception):
    """Raised once the LongRoPE search has run: what follows it is not this test's."""


def test_the_longrope_search_scores_its_candidates_on_dev_text_only(tmp_path, monkeypatch):
    """Pins the wrong version that searches LongRoPE's factors on a test document (the rows are then reported on
    the text they were tuned to). The flags test checks only the row's rope type; here every text the search's
    objective scores is recorded and must be a dev window, as ``long_documents`` makes the dev split, and no test
    window (nor a test haystack, keys planted, which is no dev window either). The run stops after the search."""
    from posenc.experiments.pretrained import stages

    config = PretrainedConfig.from_preset("smoke", methods="none,longrope", finetune="none", retrieval_format="remember",
                                          search_population=4, search_generations=1)
    searching, scored = [], []
    real_search, real_losses = stages.search, stages.position_losses

    def recording_losses(model, text, chunk, *args, **kwargs):
        if searching:
            scored.append(torch.as_tensor(text).clone())
        return real_losses(model, text, chunk, *args, **kwargs)

    def search_then_stop(*args, **kwargs):
        searching.append(True)
        real_search(*args, **kwargs)
        raise _Searched

    monkeypatch.setattr(stages, "position_losses", recording_losses)
    monkeypatch.setattr(stages, "search", search_then_stop)
    with pytest.raises(_Searched):
        stages.run(config, tmp_path / "run", device="cpu", log=lambda *a, **k: None)
    dev = [w["ids"] for w in long_documents(config, ByteTokens(), "dev", config.dev_documents, config.to)]
    test = [w["ids"] for w in long_documents(config, ByteTokens(), "test", config.documents, config.to)]
    assert len(scored) >= 4  # every seed candidate of the first generation was scored
    for text in scored:
        assert any(torch.equal(text, window) for window in dev), "the search scored a text that is no dev window"
        assert not any(torch.equal(text, window) for window in test), "the search scored a test window"


def test_a_resumed_run_keeps_its_corpus_and_lists_every_commit_that_measured(tmp_path):
    """#54 item 5: a run's files may be measured over several commits (a resume) but never over two corpora (the
    2× run once read another Python's stdlib): the pin holds the corpus's fingerprint and the commits in order."""
    from posenc import storage
    from posenc.experiments.pretrained.pins import pin as _pin

    config = PretrainedConfig.from_preset("smoke")
    stdlib = {"source": "python3.11.7 stdlib", "sha256": "6542f7510a0b9f4f"}
    assert _pin(tmp_path, config, resume=False, corpus=stdlib, commit="a1") == ["a1"]
    assert _pin(tmp_path, config, resume=True, corpus=stdlib, commit="b2") == ["a1", "b2"]
    assert _pin(tmp_path, config, resume=True, corpus=stdlib, commit="a1") == ["b2", "a1"]
    assert storage.read_json(tmp_path / "config.json")["corpus"] == stdlib
    other = {"source": "python3.12.3 stdlib", "sha256": "0123456789abcdef"}
    with pytest.raises(ValueError, match=r"^--resume: .* was measured on another corpus \(python3.11.7 stdlib, "
                                         r"sha256 6542f7510a0b, not python3.12.3 stdlib, sha256 0123456789ab\)"):
        _pin(tmp_path, config, resume=True, corpus=other, commit="c3")
    assert storage.read_json(tmp_path / "config.json")["commits"] == ["b2", "a1"]  # the refused run wrote nothing
    storage.write_json(tmp_path / "config.json", {"hf": config.to_dict()})  # pinned before corpora were
    assert _pin(tmp_path, config, resume=True, corpus=other, commit="c3") == ["c3"]
    assert storage.read_json(tmp_path / "config.json")["corpus"] == other
