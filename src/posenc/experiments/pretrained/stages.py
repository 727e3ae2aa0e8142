"""``posenc pretrained``: measure, adapt and export a pretrained Hugging Face RoPE model past its context.

Rows: the zero-shot methods (each scaling at factor = ``--to`` / the model's context; ``self-extend`` and
``rerope`` through the attention registry) and, with ``--finetune``, the fine-tuned scaling (``pose`` adds its
control: the same tokens and steps at plain ids). For every row, one prefill per test document (its first ``--to``
tokens, with ``bands × keys_per_band`` labelled keys planted at spread depths) gives both the loss by position
(the keys' tokens not scored) and, from its KV cache, the answer to every planted key; the rows that could be
exported are also scored on the dev documents, which choose the export. Beside the rows:
  - the context control: the unscaled model re-reading, so that each target past the context sees between
    ``original − control_stride + 1`` and ``original`` tokens (not one pass under a sliding-window mask: for a
    model of more than one layer that lets information through from further back, and a model trained without
    it loses its first-token attention sink there: docs/pretrained.md);
  - the unscaled model's retrieval inside its context (keys in the first ``original // 2`` tokens): the
    calibration every retrieval number is read against.
Statistics are over documents (``report``, ``experiments.documents``).

Every measurement is a file under ``measurements/`` and every fine-tune a folder under ``finetune/``, written
atomically: a killed run resumed with ``--resume`` loses no finished one. Under ``torchrun`` the processes share
each fine-tune's batches, then split the measurements (``Share``: every rank takes every world_size-th file) and
rank 0 reads them all back into the results, which equal one process's.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import torch

from ... import hf, storage
from ...extension import retrieval
from ...extension.adapt import AdaptConfig, adapt
from ...extension.dual_chunk import default_sizes
from ...extension.longrope import default_max_factor, longrope_parameters, seed_candidates
from ...extension.methods import having
from ...extension.search import Candidate, SearchConfig, search
from ...extension.self_extend import smallest_group, use_attention
from ...extension.shifted import farthest_distance as string_farthest, smallest_shift
from ...lm.runtime import Runtime, provenance
from . import context_use, keys, report, swaps
from .config import PretrainedConfig, plan_rows
from .measure import (TRAIN_BYTES, binned, corpus_of, load_model, long_documents, method_parameters, position_losses,
                      prefill, read_text_tokens, sliding_losses)
from .pins import declared_family, pin
from .share import Share

def run(config: PretrainedConfig, out: Path, *, resume: bool = False, export: Path | None = None,
        device: str = "auto", log=print) -> dict | None:
    """Measure (and fine-tune) every row, resumably; with ``export``, write the best row's model there."""
    out = Path(out)
    runtime = Runtime.detect(device)
    if export is not None:
        if Path(export).resolve() == out.resolve():
            raise ValueError(f"--export {export} is the run directory; name another folder")
        if Path(export).resolve() in out.resolve().parents:  # the export replaces its folder whole: the run too
            raise ValueError(f"--out {out} is inside --export {export}, which the export replaces whole; name a run "
                             f"directory outside it")
        hf.check_export_folder(Path(export), "--export")
    began = time.perf_counter()
    model, tokens = load_model(config)
    model.to(runtime.device)
    original = hf.original_context(model)
    factor = config.to / original
    theta = (model.config.rope_parameters or {}).get("rope_theta", 10000.0)
    _check_against_model(config, original)
    rows = plan_rows(config)
    own = dict(model.config.rope_parameters or {"rope_type": "default", "rope_theta": theta})
    parameters = {name: method_parameters(row["method"], factor, original, theta, own)
                  for name, row in rows.items() if row["method"] != "longrope"}
    for params in parameters.values():  # every dict is checked against this model before the long work
        hf.full_rope_parameters(model, params)
    group = config.self_extend_group or (smallest_group(original, config.to, config.self_extend_window)
                                         if "self-extend" in config.methods else None)  # ReRoPE has no group
    shift = _string_shift(config, original)
    test = long_documents(config, tokens, "test", config.documents, config.to)
    dev = long_documents(config, tokens, "dev", config.dev_documents, config.to)
    formats = list(retrieval.CALIBRATION_ORDER) if config.retrieval_format == "auto" else [config.retrieval_format]
    for wording in formats:  # every format's keys fit, in context and at --to, before the long work
        keys.haystack(tokens, test[0]["ids"][: original // 2], original // 2, config, 0, wording)
        keys.haystack(tokens, test[0]["ids"], config.to, config, 0, wording)
    commits = [provenance()["commit"]]
    if runtime.rank == 0:
        commits = pin(out, config, resume, corpus_of(config.text, config.corpus).fingerprint, commits[0])
    runtime.barrier()
    stages = {"load model and text": time.perf_counter() - began}
    log(f"model: {config.model} ({model.config.model_type}, context {original}, rope_theta {theta:g}); to "
        f"{config.to} (factor {factor:g}); {len(test)} test and {len(dev)} dev documents, {config.to:,} tokens each")
    pristine = {name: p.detach().clone() for name, p in model.named_parameters()}
    started = time.perf_counter()
    calibration = keys.calibrate(model, tokens, dev, formats, config, original, out, runtime)
    wording = keys.best_format(calibration)
    stages["retrieval calibration (unscaled, dev)"] = time.perf_counter() - started
    log(f"retrieval format: {wording} (" + ", ".join(f"{f} {c['found']}/{c['total']}" for f, c in calibration.items())
        + f" found by the unscaled model on dev at {original // 2:,} tokens)")
    haystacks = [keys.haystack(tokens, w["ids"], config.to, config, i, wording) for i, w in enumerate(test)]
    if "longrope" in rows:
        started = time.perf_counter()
        parameters["longrope"] = _search(model, dev[0]["ids"], config, factor, original, theta, out, log)
        stages["longrope search"] = time.perf_counter() - started
    tuned = {}
    for name, row in rows.items():
        if row["finetune"]:
            started = time.perf_counter()
            tuned[name] = _finetune(model, tokens, name, row["finetune"], parameters[name], pristine, config,
                                    original, dev[0]["ids"], runtime, out, log)
            stages[f"fine-tune {name}"] = time.perf_counter() - started
    measuring = dict(model=model, tokens=tokens, rows=rows, parameters=parameters, own=own, pristine=pristine,
                     sizes=swaps.Sizes(original, config.self_extend_window, group, shift, config.string_local),
                     test=test, haystacks=haystacks, dev=dev, config=config,
                     original=original, out=out, wording=wording)
    if runtime.world_size > 1:  # the ranks split the measurements; rank 0 then reads them all back
        share = Share(runtime.rank, runtime.world_size)
        _measure_all(**measuring, share=share, stages=stages)
        log(f"  rank {runtime.rank}: made {share.made} of {share.seen} measurements")
        runtime.barrier()
        if runtime.rank != 0:
            return None
    measured, in_context, control = _measure_all(**measuring, share=Share(), stages={} if runtime.world_size > 1
                                                 else stages, log=log)
    corpus = corpus_of(config.text, config.corpus).fingerprint
    results = report.collect(config, model, original, factor, group, corpus, test, dev, measured, control,
                             in_context, tuned, stages)
    chosen_by = keys.CHOSEN_BY if len(formats) > 1 else "--retrieval-format"
    results["context_use"] = context_use.summarise(out, list(rows), [h.scored() for h in haystacks], original,
                                                   config.control_stride)
    results.update(retrieval_format=wording, calibration={"length": original // 2, "chosen_by": chosen_by,
                                                          "formats": calibration},
                   string_shift=shift, dca=dict(zip(("chunk_size", "local"), default_sizes(original)))
                   if "dca" in rows else None, device=runtime.label, processes=runtime.world_size,
                   peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                   family={**declared_family(out, rows), "comparisons": list(results["comparisons"])},
                   provenance=provenance(), commits=commits, model_file=None if config.model == "tiny" else
                   hf.model_provenance(config.model))
    report.write_all(results, out)
    log(report.terminal_table(results))
    log(f"\nwrote {out / 'results.json'}, results.md, loss_by_position.png, retrieval.png, rope_parameters.json")
    if export is not None and results["best_row"]:
        _export(model, tokens, results, pristine, out, Path(export), log)
    return results


def _measure_all(model, tokens, rows, parameters, own, pristine, sizes, test, haystacks, dev, config,
                 original, out, wording, share, stages, log=None):
    """Every row on every document, the in-context retrieval and the control: this process's ``share`` of them
    measured (the others are None), each a file under measurements/. Returns (measured, in_context, control)."""
    measured = {}
    exportable = [name for name, row in rows.items() if report.exportable(row)]
    choosing = exportable if len(exportable) > 1 else []  # dev documents only where there is a choice
    for name, row in rows.items():
        started = time.perf_counter()
        _restore(model, pristine)
        if row["finetune"]:
            model.load_state_dict(storage.load_weights(out / "finetune" / name / "model.safetensors"), strict=False)
        hf.apply_scaling(model, parameters[name])
        if row["attention"] == "sdpa":
            use_attention(model, "sdpa")
        else:
            swaps.BY_NAME[row["attention"]].install(model, sizes)
        whole = row["method"] in having(lambda m: m.length_dependent)  # no retrieval cache shared across lengths
        measured[name] = {
            "rope_parameters": hf.full_rope_parameters(model, parameters[name]), **row,
            "test": [_document(model, tokens, f"{name}-test{i}", haystack, config, original, out, whole, share)
                     for i, haystack in enumerate(haystacks)],
            "dev": [_document(model, tokens, f"{name}-dev{i}", w["ids"], config, original, out, whole, share)
                    for i, w in enumerate(dev)] if name in choosing else []}
        stages[f"measure {name}"] = time.perf_counter() - started
        if log is not None:
            log(f"  {name}: test loss past the context {_mean(measured[name]['test'], 'past'):.3f}, keys found "
                f"{sum(k['correct'] for d in measured[name]['test'] for k in report.of_task(d['retrieval']))}")
    started = time.perf_counter()
    _restore(model, pristine)
    hf.apply_scaling(model, own)
    use_attention(model, "sdpa")
    half = original // 2
    in_context = {split: [keys.in_context(model, tokens, f"{split}{i}", w["ids"], half, config, out, i, wording,
                                          share) for i, w in enumerate(windows)]
                  for split, windows in (("test", test), ("dev", dev))}
    far = keys.far_length(original)  # the farthest keys inside the context: the far bands' counterpart
    in_context["far_length"] = far
    in_context["test_far"] = [keys.in_context(model, tokens, f"far-test{i}", w["ids"], far, config, out, i, wording,
                                              share) for i, w in enumerate(test)]
    stages["in-context retrieval (unscaled)"] = time.perf_counter() - started
    started = time.perf_counter()
    control = {"test": [_control(model, haystack, f"test{i}", config, original, out, share)
                        for i, haystack in enumerate(haystacks)]}
    stages["context control"] = time.perf_counter() - started
    started = time.perf_counter()
    for i, haystack in enumerate(haystacks):
        _short_reader(model, haystack, f"test{i}", config, original, out, share)
    stages["short reader (context use)"] = time.perf_counter() - started
    return measured, in_context, control


def _string_shift(config: PretrainedConfig, original: int) -> int | None:
    """STRING's shift (None without a string row): --string-shift, checked to keep every distance inside the
    context, or the smallest that does."""
    if "string" not in config.methods:
        return None
    if config.string_shift is None:
        return smallest_shift(original, config.to, config.string_local)
    farthest = string_farthest(config.to, config.string_shift, config.string_local)
    if farthest > original - 1:
        raise ValueError(f"--string-shift {config.string_shift} leaves distances up to {farthest} at --to "
                         f"{config.to}, past the model's context ({original}); pass at least "
                         f"{smallest_shift(original, config.to, config.string_local)}")
    return config.string_shift


def _check_against_model(config: PretrainedConfig, original: int) -> None:
    """Every option that depends on the model's context, checked before any long work."""
    if config.to <= original:
        raise ValueError(f"--to {config.to} is not above the model's context ({original}): pass --to > {original}")
    if config.finetune == "pose" and config.finetune_window > original:
        raise ValueError(f"--finetune-window ({config.finetune_window}) is longer than the model's context "
                         f"({original}): PoSE trains on windows no longer than the context")
    if config.uses_self_extend and config.self_extend_window >= original:
        raise ValueError(f"--self-extend-window ({config.self_extend_window}) must be below the model's context "
                         f"({original})")
    if config.first_tokens > original:
        raise ValueError(f"--first-tokens ({config.first_tokens}) must be at most the model's context ({original})")
    if config.control_stride > original:
        raise ValueError(f"--control-stride ({config.control_stride}) must be at most the model's context "
                         f"({original}): the control re-reads the last {original} tokens every stride")


def _restore(model, pristine: dict) -> None:
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(pristine[name])


def _mean(windows: list[dict], key: str) -> float:
    return sum(w[key] for w in windows) / len(windows)


def _finetune(model, tokens, name, mode, params, pristine, config, original, curve_window, runtime, out, log) -> dict:
    """Fine-tune from the pristine weights with ``params`` applied; the weights land in finetune/<name>/."""
    _restore(model, pristine)
    hf.apply_scaling(model, params)
    use_attention(model, "sdpa")
    window = config.to if mode == "full" else config.finetune_window
    adapt_config = AdaptConfig(mode=mode, target=config.to, window=window, steps=config.finetune_steps,
                               lr=config.finetune_lr, batch=config.finetune_batch, chunks=config.pose_chunks,
                               lora=config.lora, checkpoint_every=max(1, config.finetune_steps // 6), seed=config.seed)
    text = read_text_tokens(config, tokens, "train", limit=TRAIN_BYTES)
    points = tuple(sorted({round(i * config.finetune_steps / (config.curve_points - 1))
                           for i in range(config.curve_points)})) if config.curve_points > 1 else (config.finetune_steps,)

    def past_the_context(trained) -> float:  # the curve: dev loss past the original context
        return position_losses(trained, curve_window, config.chunk, label=f"curve {name}")[original - 1:].mean().item()

    tuned, record = adapt(model, text, adapt_config, out / "finetune" / name, points=points, measure=past_the_context,
                          rank=runtime.rank, world_size=runtime.world_size, label=f"fine-tune {name}")
    log(f"  {name}: fine-tuned {config.finetune_steps} steps; dev loss past the context by step {record['curve']}")
    return record


def _losses_record(losses: torch.Tensor, scored: torch.Tensor, config, original: int) -> dict:
    """Means over the scored targets (a needle's tokens are not text): the first tokens, inside the context, past
    it, the whole window, and per position bin. losses, scored: (T − 1,)."""
    losses = losses.masked_fill(~scored, float("nan"))
    return {"first": losses[: config.first_tokens].nanmean().item(), "inside": losses[: original - 1].nanmean().item(),
            "past": losses[original - 1 :].nanmean().item(), "mean": losses.nanmean().item(),
            "bins": binned(losses, config.bins)}


def _document(model, tokens, key: str, source, config, original: int, out: Path, whole_prompt: bool,
              share: Share) -> dict | None:
    """One row on one document, one prefill: the loss by position and, for a test document (a ``Haystack``), every
    planted key asked from that prefill's KV cache (``whole_prompt``: re-read per key, for the scalings whose
    frequencies follow the length)."""
    def measure() -> dict:
        asking = isinstance(source, retrieval.Haystack)
        ids = torch.tensor(source.ids, dtype=torch.int64) if asking else source
        losses, cache = prefill(model, ids, config.chunk, label=f"loss {key}", keep_cache=asking and not whole_prompt)
        scored = source.scored() if asking else torch.ones(ids.shape[0] - 1, dtype=torch.bool)
        record = _losses_record(losses, scored, config, original)
        if asking:
            context_use.save_losses(out, key, losses)
            record["retrieval"] = retrieval.retrieve(model, source, tokens.encode, tokens.decode, cache=cache,
                                                     whole_prompt=whole_prompt)
        return record

    return share.measured(out / "measurements" / f"doc-{key}.json", measure)


def _control(model, haystack: retrieval.Haystack, key: str, config, original: int, out: Path,
             share: Share) -> dict | None:
    """The unscaled model past its context, re-reading: every target past the context is scored by a fresh read
    of the window that ends at its stride block's end, so it sees between ``original − control_stride + 1`` and
    ``original`` tokens (``sliding_losses``); a needle's tokens are not scored, as in the rows. Filed with the
    losses inside the context (one prefill of the first ``original`` tokens): the long reader of ``context_use``."""
    def measure() -> dict:
        ids = torch.tensor(haystack.ids, dtype=torch.int64)
        losses = sliding_losses(model, ids, original, config.control_stride, original - 1, config.chunk)
        inside = position_losses(model, ids[:original], config.chunk, label="long reader, inside the context")
        context_use.save_losses(out, f"control-{key}", torch.cat([inside, losses]))
        scored = haystack.scored()[original - 1 :]
        return {"past": losses.masked_fill(~scored, float("nan")).nanmean().item()}

    return share.measured(out / "measurements" / f"control-{key}.json", measure)


def _short_reader(model, haystack: retrieval.Haystack, key: str, config, original: int, out: Path,
                  share: Share) -> dict | None:
    """The unscaled model reading only recent text (``context_use``'s short reader): windows of a quarter of
    the context advancing by half that, every target from the window's start on."""
    short = context_use.short_context(original)

    def measure() -> dict:
        ids = torch.tensor(haystack.ids, dtype=torch.int64)
        losses = sliding_losses(model, ids, short, short // 2, 0, config.chunk)
        context_use.save_losses(out, f"short-{key}", losses)
        return {"targets": losses.shape[0]}

    return share.measured(out / "measurements" / f"short-{key}.json", measure)


def _export(model, tokens, results, pristine, out, folder, log) -> None:
    started = time.perf_counter()
    best = results["rows"][results["best_row"]]
    _restore(model, pristine)
    if best["finetune"]:
        model.load_state_dict(storage.load_weights(out / "finetune" / results["best_row"] / "model.safetensors"),
                              strict=False)
    use_attention(model, "sdpa")
    hf.export(model, best["rope_parameters"], folder, getattr(tokens, "tokenizer", None))
    log(f"exported {results['best_row']} (chosen on dev) to {folder} ({time.perf_counter() - started:.0f} s): "
        f"AutoModelForCausalLM.from_pretrained({str(folder)!r})")


def _search(model, text, config, factor, original, theta, out, log) -> dict:
    """LongRoPE factors for this model at --to, scored on a dev window; returns rope_parameters."""
    dim = hf.head_dim(model.config)

    def objective(candidates: list[Candidate]) -> list[float]:
        scores = []
        for candidate in candidates:
            hf.apply_scaling(model, longrope_parameters(candidate.factors, factor=factor, original=original, base=theta))
            scores.append(position_losses(model, text, config.chunk).mean().item())
        return scores

    search_config = SearchConfig(population=config.search_population, generations=config.search_generations,
                                 parents=max(2, config.search_population // 4), max_factor=default_max_factor(factor),
                                 n_hat_choices=(0,), seed=config.seed)
    context = {"model": config.model, "to": config.to}
    state = search(objective, seed_candidates(dim, factor, original, theta), search_config, out / "search_log.json",
                   context=context, log=log)
    return longrope_parameters(state["best"]["factors"], factor=factor, original=original, base=theta)
