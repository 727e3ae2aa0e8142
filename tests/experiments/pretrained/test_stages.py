"""``posenc pretrained``'s stages one at a time, with the work they hand on stood in for: what the LongRoPE search,
the fine-tuning and the export are given from the flags; STRING's shift; which targets each loss averages and what
the control and the short reader read and file; and, in one small run, which documents are read at all. The
end-to-end tests (``test_pretrained.py``) run the stages at the smoke preset's sizes, where a dropped flag often
equals its default (batch 1, LoRA 0, no tokenizer) and a wrong mean can equal the right one."""

from types import SimpleNamespace

import pytest
import torch

from posenc import hf, storage
from posenc.experiments.pretrained import PretrainedConfig, stages
from posenc.experiments.pretrained.measure import tiny_llama
from posenc.experiments.pretrained.share import Share
from posenc.extension import retrieval
from posenc.extension.adapt import AdaptConfig
from posenc.extension.longrope import default_max_factor, longrope_parameters, seed_candidates
from posenc.extension.search import SearchConfig
from posenc.extension.shifted import smallest_shift

THETA = 500_000.0  # not the tiny model's 10,000 nor any default: a dropped base shows
RUNTIME = SimpleNamespace(rank=1, world_size=2)


@pytest.mark.parametrize("population, parents", [(13, 3), (4, 2)])
def test_the_search_is_configured_from_the_flags_and_returns_its_best_factors_at_this_base(tmp_path, monkeypatch,
                                                                                        population, parents):
    """population // 4 parents, at least 2; the factor's bound; no n-hat; the run's seed; the log beside the run,
    naming the model and length; the seeds PI, NTK and YaRN give at this base. Each candidate is scored as the
    mean dev loss with its factors applied at this base."""
    config = PretrainedConfig.from_preset("smoke", methods="none,longrope", search_population=population,
                                          search_generations=3, seed=7)
    model = SimpleNamespace(config=SimpleNamespace(head_dim=16))
    applied, handed, logs = [], {}, []
    monkeypatch.setattr(hf, "apply_scaling", lambda m, params: applied.append(params))
    monkeypatch.setattr(stages, "position_losses", lambda m, text, chunk: torch.tensor([2.0, 4.0]) + text.sum())

    def search(objective, seeds, search_config, log_path, *, context, log):
        handed.update(objective=objective, seeds=seeds, config=search_config, path=log_path, context=context, log=log)
        return {"best": {"factors": [1.25] * 8}}

    monkeypatch.setattr(stages, "search", search)
    found = stages._search(model, torch.zeros(5), config, 1.5, 1024, THETA, tmp_path, logs.append)
    assert found == longrope_parameters([1.25] * 8, factor=1.5, original=1024, base=THETA)
    assert handed["config"] == SearchConfig(population=population, generations=3, parents=parents,
                                            max_factor=default_max_factor(1.5), n_hat_choices=(0,), seed=7)
    assert handed["seeds"] == seed_candidates(16, 1.5, 1024, THETA)
    assert (handed["path"], handed["context"], handed["log"]) == (tmp_path / "search_log.json",
                                                                  {"model": "tiny", "to": 1024}, logs.append)
    candidates = handed["seeds"][:2]
    assert handed["objective"](candidates) == [3.0, 3.0]
    assert applied == [longrope_parameters(c.factors, factor=1.5, original=1024, base=THETA) for c in candidates]


@pytest.fixture
def tuning(monkeypatch, tmp_path):
    """``_finetune`` with ``adapt`` and the text stood in for: returns what adapt was handed."""
    handed = {}

    def adapt(model, text, adapt_config, folder, *, points, measure, rank, world_size, label):
        handed.update(model=model, text=text, config=adapt_config, folder=folder, points=points, measure=measure,
                      rank=rank, world_size=world_size, label=label)
        return model, {"curve": {}}

    monkeypatch.setattr(stages, "adapt", adapt)
    monkeypatch.setattr(stages, "read_text_tokens", lambda config, tokens, split, limit: (split, limit))
    model = tiny_llama()

    def finetune(config, mode="pose", name="yarn+pose"):
        pristine = {n: p.detach().clone() for n, p in model.named_parameters()}
        record = stages._finetune(model, None, name, mode, {"rope_type": "yarn", "factor": 2.0,
                                                             "original_max_position_embeddings": 64},
                                  pristine, config, 64, torch.arange(10), RUNTIME, tmp_path,
                                  lambda line: handed.setdefault("log", []).append(line))
        return record, handed

    return finetune


def test_fine_tuning_is_handed_every_flag_the_rank_and_its_folder(tuning, tmp_path):
    config = PretrainedConfig.from_preset("smoke", finetune_steps=13, finetune_batch=3, pose_chunks=3, lora=4,
                                          finetune_lr=2e-4, finetune_window=40, seed=5, curve_points=3)
    record, handed = tuning(config)
    assert record == {"curve": {}}
    assert handed["config"] == AdaptConfig(mode="pose", target=1024, window=40, steps=13, lr=2e-4, batch=3, chunks=3,
                                           lora=4, checkpoint_every=2, seed=5)
    assert handed["text"] == ("train", stages.TRAIN_BYTES)
    assert (handed["folder"], handed["rank"], handed["world_size"], handed["label"]) == (
        tmp_path / "finetune" / "yarn+pose", 1, 2, "fine-tune yarn+pose")
    assert handed["points"] == (0, 6, 13)  # curve points spread over the steps, rounded
    assert handed["log"] == ["  yarn+pose: fine-tuned 13 steps; dev loss past the context by step {}"]
    assert handed["model"].config.rope_parameters["rope_type"] == "yarn"  # scaled before it trains


def test_full_fine_tuning_trains_at_the_target_and_checkpoints_at_least_every_step(tuning):
    config = PretrainedConfig.from_preset("smoke", finetune="full", finetune_steps=5, curve_points=1)
    _, handed = tuning(config, mode="full", name="yarn+full")
    assert (handed["config"].window, handed["config"].checkpoint_every) == (1024, 1)
    assert handed["points"] == (5,)  # one point: the end
    assert tuning(PretrainedConfig.from_preset("smoke", curve_points=2, finetune_steps=5))[1]["points"] == (0, 5)


def test_the_curve_is_the_dev_loss_past_the_context(tuning, monkeypatch):
    """The mean loss of the curve's window from target ``original − 1`` on (the first past the context)."""
    seen = []

    def losses(model, window, chunk, label):
        seen.append((window.tolist(), chunk, label))
        return torch.arange(70.0)

    monkeypatch.setattr(stages, "position_losses", losses)
    _, handed = tuning(PretrainedConfig.from_preset("smoke"))
    assert handed["measure"](handed["model"]) == torch.arange(63.0, 70.0).mean().item()
    assert seen == [(list(range(10)), 256, "curve yarn+pose")]


def test_the_export_is_the_best_row_on_its_weights_with_the_tokenizer(monkeypatch, tmp_path):
    """A fine-tuned best row is exported on its fine-tuned weights (not the pristine ones), with its rope
    parameters and the run's tokenizer; the log names the row, the folder and how to load it."""
    model = tiny_llama()
    pristine = {n: p.detach().clone() for n, p in model.named_parameters()}
    tuned = {n: p + 1 for n, p in pristine.items()}
    storage.save_weights(tmp_path / "finetune" / "yarn+pose" / "model.safetensors", tuned)
    exported, logs = [], []
    monkeypatch.setattr(hf, "export", lambda m, params, folder, tokenizer: exported.append(
        (m.model.embed_tokens.weight.detach().clone(), params, folder, tokenizer)))
    results = {"best_row": "yarn+pose", "rows": {"yarn+pose": {"finetune": "pose", "rope_parameters": {"factor": 2}}}}
    tokens = SimpleNamespace(tokenizer="the tokenizer")
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()  # whatever the last measurement left
    stages._export(model, tokens, results, pristine, tmp_path, tmp_path / "out", logs.append)
    weights, params, folder, tokenizer = exported[0]
    assert torch.equal(weights, tuned["model.embed_tokens.weight"])
    assert (params, folder, tokenizer) == ({"factor": 2}, tmp_path / "out", "the tokenizer")
    assert logs == [f"exported yarn+pose (chosen on dev) to {tmp_path / 'out'} (0 s): "
                    f"AutoModelForCausalLM.from_pretrained({str(tmp_path / 'out')!r})"]

    results["rows"]["yarn+pose"]["finetune"] = None  # a zero-shot row: the pristine weights
    stages._export(model, SimpleNamespace(), results, pristine, tmp_path, tmp_path / "out", logs.append)
    assert torch.equal(exported[1][0], pristine["model.embed_tokens.weight"]) and exported[1][3] is None


def test_a_run_with_one_exportable_row_measures_no_dev_document(tmp_path, monkeypatch):
    """Dev documents choose among rows that could be exported; with one there is no choice to make, and no dev
    measurement is made (each costs a prefill of --to tokens). The unscaled model's keys are planted at half its
    context on every document, and at ``far_length`` on the test documents; each row's line names its loss."""
    from posenc.experiments.pretrained import keys

    config = PretrainedConfig.from_preset("smoke", methods="none,yarn", finetune="none",
                                          retrieval_format="remember")
    planted, logs, in_context = [], [], keys.in_context
    monkeypatch.setattr(keys, "in_context", lambda model, tokens, key, ids, length, *rest: planted.append(
        (key, length)) or in_context(model, tokens, key, ids, length, *rest))
    results = stages.run(config, tmp_path / "run", device="cpu", log=logs.append)
    assert results["best_row"] == "yarn"
    assert [row["dev"] for row in results["rows"].values()] == [[], []]
    assert not list((tmp_path / "run" / "measurements").glob("doc-*-dev*.json"))
    original = results["original_context"]
    assert results["in_context"]["far_length"] == keys.far_length(original) == original - original // 16
    expected = ([(f"test{i}", original // 2) for i in range(config.documents)]
                + [(f"dev{i}", original // 2) for i in range(config.dev_documents)]
                + [(f"far-test{i}", keys.far_length(original)) for i in range(config.documents)])
    assert planted[-len(expected):] == expected  # after the calibration's, on dev
    rows = [line for line in logs if line.startswith("  yarn: test loss past the context ")]
    past = sum(d["past"] for d in results["rows"]["yarn"]["test"]) / config.documents
    assert len(rows) == 1 and rows[0].startswith(f"  yarn: test loss past the context {past:.3f}, keys found ")


def test_strings_shift_is_the_flag_where_every_distance_stays_inside_else_the_smallest_that_does():
    """A STRING row reads distances up to ``--to − 1 − shift + local``: at most the context's last one,
    ``original − 1``. With no --string-shift, the smallest shift that keeps them there; no STRING row, no shift."""
    def config(**overrides):
        return PretrainedConfig.from_preset("smoke", methods="none,string", **overrides)

    assert stages._string_shift(PretrainedConfig.from_preset("smoke"), 512) is None
    assert stages._string_shift(config(), 512) == smallest_shift(512, 1024, 128) == 640  # 1023 − 640 + 128 = 511
    assert stages._string_shift(config(string_shift=640), 512) == 640
    assert stages._string_shift(config(string_local=64), 512) == 576
    assert stages._string_shift(config(string_shift=576, string_local=64), 512) == 576
    for shift, local, farthest, least in [(639, 128, 512, 640), (575, 64, 512, 576), (100, 64, 987, 576)]:
        with pytest.raises(ValueError) as refusal:
            stages._string_shift(config(string_shift=shift, string_local=local), 512)
        assert str(refusal.value) == (f"--string-shift {shift} leaves distances up to {farthest} at --to 1024, past "
                                      f"the model's context (512); pass at least {least}")


def test_a_documents_losses_are_means_over_its_scored_targets_by_span():
    """Target t predicts token t + 1: ``original − 1`` targets lie inside the context, the rest past it. Targets 1 and
    9 are a needle's (not scored). 12 targets, a context of 6, the first 3, three bins."""
    scored = torch.ones(12, dtype=torch.bool)
    scored[[1, 9]] = False
    record = stages._losses_record(torch.arange(12.0), scored, SimpleNamespace(first_tokens=3, bins=3), 6)
    bins = record.pop("bins")
    assert record == pytest.approx({"first": 1.0, "inside": 2.25, "past": 47 / 6, "mean": 5.6})
    assert bins["bin_edges"] == [0, 4, 8, 12] and bins["loss"] == pytest.approx([5 / 3, 5.5, 29 / 3])


@pytest.mark.parametrize("whole_prompt", [False, True])
def test_a_test_document_keeps_its_prefills_cache_for_the_keys_unless_each_is_read_whole(monkeypatch, tmp_path,
                                                                                       whole_prompt):
    """One prefill per document gives the loss and (for a haystack whose row does not follow the length) the cache
    every key is asked from; the needles' targets are not scored and the losses are filed under the key. A dev
    document has no keys: no cache, every target scored."""
    prefilled, asked, filed = [], [], []

    def prefill(model, ids, chunk, label, keep_cache):
        prefilled.append((ids.dtype, ids.tolist(), chunk, label, keep_cache))
        return torch.arange(7.0), "its cache" if keep_cache else None

    monkeypatch.setattr(stages, "prefill", prefill)
    monkeypatch.setattr(retrieval, "retrieve", lambda model, source, encode, decode, cache, whole_prompt: asked.append(
        (source.ids, cache, whole_prompt)) or ["answers"])
    monkeypatch.setattr(stages.context_use, "save_losses",
                        lambda out, key, losses: filed.append((key, losses.tolist())))
    config = SimpleNamespace(chunk=16, first_tokens=2, bins=2)
    haystack = retrieval.Haystack(ids=list(range(10, 18)), needles=(), spans=((2, 4),))
    tokens = SimpleNamespace(encode=None, decode=None)
    record = stages._document(None, tokens, "yarn-test0", haystack, config, 4, tmp_path, whole_prompt, Share())
    assert prefilled == [(torch.int64, list(range(10, 18)), 16, "loss yarn-test0", not whole_prompt)]
    assert asked == [(list(range(10, 18)), None if whole_prompt else "its cache", whole_prompt)]
    assert filed == [("yarn-test0", [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])]
    assert record["retrieval"] == ["answers"] and record["mean"] == pytest.approx((21 - 1 - 2) / 5)  # 1, 2 unscored
    assert storage.read_json(tmp_path / "measurements" / "doc-yarn-test0.json") == record

    dev = stages._document(None, tokens, "yarn-dev0", torch.arange(8), config, 4, tmp_path, whole_prompt, Share())
    assert prefilled[-1][3:] == ("loss yarn-dev0", False) and "retrieval" not in dev
    assert dev["mean"] == 3.0 and len(filed) == len(asked) == 1


@pytest.fixture
def readers(monkeypatch):
    """The control's and the short reader's forwards stood in for: each returns consecutive numbers, one per target
    it scores, and what each was asked and what was filed is recorded."""
    asked, filed = [], []

    def sliding(model, ids, context, stride, start, chunk):
        asked.append(("sliding", ids.dtype, len(ids), context, stride, start, chunk))
        return torch.arange(10.0, 10 + len(ids) - 1 - start)

    def whole(model, ids, chunk, label):
        asked.append(("whole", ids.dtype, len(ids), chunk, label))
        return torch.arange(len(ids) - 1.0)

    monkeypatch.setattr(stages, "sliding_losses", sliding)
    monkeypatch.setattr(stages, "position_losses", whole)
    monkeypatch.setattr(stages.context_use, "save_losses",
                        lambda out, key, losses: filed.append((key, losses.tolist())))
    return asked, filed


def test_the_control_rereads_past_the_context_and_files_the_long_readers_losses(readers, tmp_path):
    """Targets 0 … original − 2 from one read of the first ``original`` tokens, the rest re-read every
    ``control_stride`` tokens; its past-the-context loss skips the needles' targets (4 and 5: tokens 5 and 6)."""
    asked, filed = readers
    haystack = retrieval.Haystack(ids=list(range(10)), needles=(), spans=((5, 7),))
    config = SimpleNamespace(control_stride=2, chunk=16)
    record = stages._control(None, haystack, "test0", config, 4, tmp_path, Share())
    assert asked == [("sliding", torch.int64, 10, 4, 2, 3, 16),
                     ("whole", torch.int64, 4, 16, "long reader, inside the context")]
    assert filed == [("control-test0", [0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0])]
    assert record == {"past": (10 + 13 + 14 + 15) / 4}  # the needles' own (11, 12) would give 11.5
    assert storage.read_json(tmp_path / "measurements" / "control-test0.json") == record


def test_the_short_reader_reads_a_quarter_of_the_context_advancing_by_half_that(readers, tmp_path):
    asked, filed = readers
    haystack = retrieval.Haystack(ids=list(range(40)), needles=(), spans=((6, 8),))
    record = stages._short_reader(None, haystack, "test3", SimpleNamespace(chunk=16), 32, tmp_path, Share())
    assert asked == [("sliding", torch.int64, 40, 8, 4, 0, 16)]  # every target, the needles' too
    assert filed == [("short-test3", [10.0 + i for i in range(39)])]
    assert record == {"targets": 39} == storage.read_json(tmp_path / "measurements" / "short-test3.json")
