"""``posenc extend --hf``: measure and extend a pretrained Hugging Face RoPE model past its context.

For the unscaled model and each method (factor = ``--to`` / the model's original context):
  - loss by position: mean next-token loss per position bin, and mean loss at each length, on
    the text (default: the embedded stdlib corpus's test split, in the model's tokens);
  - passkey retrieval: accuracy per (length, depth) of greedy answers;
  - optionally a LongRoPE search (``search.search``, the tiny-model code) whose objective is the
    model's loss at ``--to`` on windows of the dev split (the measured window is test).
Each (method, length) measurement is a file under ``measurements/``, written atomically, so a
killed run resumed with ``--resume`` loses no finished measurement. Outputs: results.json,
results.md, loss_by_position.png, passkey.png, rope_parameters.json (the best method at ``--to``).

Loss is computed from the final hidden states in chunks of positions, never from the logits
of a whole window (49,152 vocab × 16k tokens would be 3 GB of float32). A scaling with fixed
frequencies gives the same loss at position p in a window of any length >= p + 1 (causal
attention), so one window of ``--to`` tokens serves every length; ``dynamic`` (and ``longrope``
past its switch) change frequencies with the window length and run one window per length.
"""

from __future__ import annotations

import platform
import resource
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ... import __version__, hf, storage
from ...extension import passkey
from ...extension.longrope import default_max_factor, longrope_parameters, seed_candidates
from ...extension.search import Candidate, SearchConfig, search
from ...lm.runtime import Runtime
from . import report
from .config import PretrainedConfig
from .measure import binned, load_model, method_parameters, position_losses, read_text_tokens

# Scalings whose frequencies change with the window's length: one forward per measured length.
LENGTH_DEPENDENT = ("dynamic", "longrope")


def run(config: PretrainedConfig, out: Path, *, resume: bool = False, export: Path | None = None,
        device: str = "auto", log=print) -> dict:
    """Measure every method (resumable per method and length); with ``export``, also write the model
    with the best method's rope_parameters there as a folder ``from_pretrained`` loads.

    ``device``: auto (CUDA when present), cpu or cuda. The model runs in float32 on either.
    """
    out = Path(out)
    runtime = Runtime.detect(device)
    if export is not None:
        if Path(export).resolve() == out.resolve():
            raise ValueError(f"--export {export} is the run directory; name another folder")
        if all(m == "none" for m in config.methods):
            raise ValueError("--export writes the best scaled method's model; --methods has none besides 'none'")
        hf.check_export_folder(Path(export))
    began = time.perf_counter()
    model, tokens = load_model(config)
    model.to(runtime.device)
    load_s = time.perf_counter() - began
    original = hf.original_context(model)
    factor = config.to / original
    theta = (model.config.rope_parameters or {}).get("rope_theta", 10000.0)
    needs_factor = [m for m in config.methods if m not in ("none", "longrope")]
    if needs_factor and factor <= 1:
        raise ValueError(f"--to {config.to} is not above the model's context ({original}); methods {needs_factor} "
                         f"need a factor > 1: pass --to > {original}")
    text = read_text_tokens(config, tokens)
    if text.shape[0] < config.to + 1:
        raise ValueError(f"not enough text: its test split has {text.shape[0]:,} tokens in this model's tokenizer; "
                         f"--to {config.to} needs {config.to + 1:,}; pass a longer --text or a smaller --to")
    dev = read_text_tokens(config, tokens, "dev") if "longrope" in config.methods else None
    if dev is not None and dev.shape[0] < config.search_windows * (config.to + 1):
        raise ValueError(f"not enough text: its dev split has {dev.shape[0]:,} tokens in this model's tokenizer; "
                         f"the LongRoPE search needs {config.search_windows * (config.to + 1):,}; pass a longer "
                         "--text or a smaller --to")
    own = dict(model.config.rope_parameters or {"rope_type": "default", "rope_theta": theta})
    parameters = {m: method_parameters(m, factor, original, theta, own) for m in config.methods if m != "longrope"}
    for params in parameters.values():  # every dict is checked against this model before the long work
        hf.full_rope_parameters(model, params)
    for length in config.passkey_lengths:  # ... and every passkey length against the fixed text's size
        passkey.make_prompt(tokens.encode, length, 0.5, "12345")
    _pin(out, config, resume)
    log(f"model: {config.model} ({model.config.model_type}, context {original}, rope_theta {theta:g}); "
        f"to {config.to} (factor {factor:g}); text: {text.shape[0]:,} tokens")
    window = text[: config.to + 1]
    stages = {"load model": load_s}
    if "longrope" in config.methods:
        started = time.perf_counter()
        parameters["longrope"] = _search(model, dev, config, factor, original, theta, out, log)
        stages["longrope search"] = time.perf_counter() - started
    measured = {}
    for method, params in parameters.items():
        started = time.perf_counter()
        hf.apply_scaling(model, params)
        losses = _loss_by_position(model, window, method, config, out, log)
        keys = _passkey(model, tokens, method, config, out, log)
        measured[method] = {"rope_parameters": hf.full_rope_parameters(model, params), "loss": losses,
                            "passkey": keys}
        stages[f"measure {method}"] = time.perf_counter() - started
    results = {**_collect(config, model, original, factor, text, measured, stages), "device": runtime.label}
    report.write_all(results, out)
    log(report.terminal_table(results))
    log(f"\nwrote {out / 'results.json'}, results.md, loss_by_position.png, passkey.png, rope_parameters.json")
    if export is not None:
        _export(model, tokens, results, Path(export), log)
    return results


def _export(model, tokens, results: dict, folder: Path, log) -> None:
    started = time.perf_counter()
    hf.export(model, results["best_rope_parameters"], folder, getattr(tokens, "tokenizer", None))
    log(f"exported the model with {results['best_method']}'s rope_parameters to {folder} "
        f"({time.perf_counter() - started:.0f} s): AutoModelForCausalLM.from_pretrained({str(folder)!r})")


def _pin(out: Path, config: PretrainedConfig, resume: bool) -> None:
    pinned = out / "config.json"
    current = {"hf": config.to_dict()}
    if pinned.exists():
        if not resume:
            raise ValueError(f"--out {out} already holds a run; pass --resume to continue it or choose another --out")
        previous = storage.read_json(pinned).get("hf", {})
        changed = sorted(k for k in ("model", "to", "text", "bins", "seed", "search_population", "search_generations",
                                     "search_windows") if previous.get(k) != current["hf"][k])
        if changed:
            raise ValueError(f"--resume: {out} was run with a different config (differs in {changed})")
    elif resume:
        raise ValueError(f"--resume: {out} holds no posenc extend --hf run (no config.json there); start one "
                         f"with: posenc extend --hf {config.model} --out {out}")
    else:
        storage.write_json(pinned, current)


def _loss_by_position(model, window, method, config, out, log) -> dict:
    """{length: {"mean": nats, "bins": {...}}} for every length; one file per (method, length)."""
    folder = out / "measurements"
    results, missing = {}, []
    for length in config.lengths:
        path = folder / f"loss-{method}-{length}.json"
        if path.exists():
            results[length] = storage.read_json(path)
        else:
            missing.append(length)
    one_window = method not in LENGTH_DEPENDENT  # causal + fixed frequencies: prefixes are shorter windows
    runs = [max(config.lengths)] if one_window and missing else missing
    for run_length in runs:
        began = time.perf_counter()
        losses = position_losses(model, window[: run_length + 1], config.chunk, label=f"loss {method}")
        wall = time.perf_counter() - began
        for length in (missing if one_window else [run_length]):
            record = {"method": method, "length": length, "mean": losses[:length].mean().item(),
                      "bins": binned(losses[:length], config.bins) if length == max(config.lengths) else None,
                      "forward_length": run_length, "wall_time_s": wall,
                      "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
            storage.write_json(folder / f"loss-{method}-{length}.json", record)
            results[length] = record
    log(f"  {method}: loss " + ", ".join(f"{n}: {results[n]['mean']:.3f}" for n in config.lengths))
    return {str(n): results[n] for n in config.lengths}


def _passkey(model, tokens, method, config, out, log) -> dict:
    """{length: {"accuracy", "answers": [...]}}; one file per (method, length)."""
    results = {}
    for length in config.passkey_lengths:
        path = out / "measurements" / f"passkey-{method}-{length}.json"
        if path.exists():
            results[str(length)] = storage.read_json(path)
            continue
        answers = []
        keys = passkey.keys(config.seed + length, config.passkey_trials * len(config.passkey_depths))
        cells = [(depth, trial) for depth in config.passkey_depths for trial in range(config.passkey_trials)]
        for (depth, _), key in tqdm(list(zip(cells, keys)), desc=f"passkey {method} @ {length}", dynamic_ncols=True):
            prompt = passkey.make_prompt(tokens.encode, length, depth, key)
            text = passkey.answer(model, prompt, tokens.decode)
            answers.append({"depth": depth, "key": key, "answer": text, "correct": passkey.read_answer(text) == key})
        by_depth = {str(d): sum(a["correct"] for a in answers if a["depth"] == d) / config.passkey_trials
                    for d in config.passkey_depths}
        record = {"method": method, "length": length, "accuracy": by_depth, "answers": answers}
        storage.write_json(path, record)
        results[str(length)] = record
    log(f"  {method}: passkey " + ", ".join(f"{n}: {r['accuracy']}" for n, r in results.items()))
    return results


def _search(model, text, config, factor, original, theta, out, log) -> dict:
    """LongRoPE factors for this model at --to, on windows of the dev split's text; returns rope_parameters."""
    dim = hf.head_dim(model.config)
    windows = [text[i * (config.to + 1) : (i + 1) * (config.to + 1)] for i in range(config.search_windows)]

    def objective(candidates: list[Candidate]) -> list[float]:
        scores = []
        for candidate in candidates:
            hf.apply_scaling(model, longrope_parameters(candidate.factors, factor=factor, original=original, base=theta))
            scores.append(sum(position_losses(model, w, config.chunk).mean().item() for w in windows) / len(windows))
        return scores

    search_config = SearchConfig(population=config.search_population, generations=config.search_generations,
                                 parents=max(2, config.search_population // 4), max_factor=default_max_factor(factor),
                                 n_hat_choices=(0,), seed=config.seed)
    context = {"model": config.model, "to": config.to, "search_windows": config.search_windows}
    state = search(objective, seed_candidates(dim, factor, original, theta), search_config, out / "search_log.json",
                   context=context, log=log)
    return longrope_parameters(state["best"]["factors"], factor=factor, original=original, base=theta)


def _collect(config, model, original, factor, text, measured, stages) -> dict:
    longest = max(config.lengths)  # the best method is the one with the lowest mean loss at the longest length
    scaled = {m: r["loss"][str(longest)]["mean"] for m, r in measured.items() if m != "none"}
    best = min(scaled, key=scaled.get) if scaled else None
    return {
        "config": config.to_dict(), "model_type": model.config.model_type, "original_context": original,
        "factor": factor, "text_tokens": int(text.shape[0]), "methods": measured,
        "best_method": best, "best_at": longest,
        "best_rope_parameters": measured[best]["rope_parameters"] if best else None,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "stages_s": stages, "wall_time_s": sum(stages.values()),
        "versions": {"posenc": __version__, "torch": torch.__version__, "python": platform.python_version()},
    }
