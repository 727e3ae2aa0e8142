"""LongRoPE's search as a stage of ``posenc extend``: per seed, on the base RoPE model, scored on dev windows.

Writes ``search_log-seed<k>.json`` (resumable, one entry per generation) and ``longrope-seed<k>.json`` (the
summary). ``rope_parameters.json`` is the export of the seed whose factors score best on dev with n̂ = 0 (the
form transformers can hold, and the one every ``longrope`` row runs).
"""

from __future__ import annotations

from pathlib import Path

from ... import storage
from ...extension.longrope import (default_max_factor, lm_objective, longrope_parameters, method_factors,
                                   SEED_METHODS, plain_frequencies, seed_candidates)
from ...extension.search import N_HAT_CHOICES, Candidate, SearchConfig, best_loss_per_generation, search
from ...lm.model import LanguageModel
from ...lm.runtime import Runtime
from .plan import Plan


def summary_path(p: Plan, seed: int) -> Path:
    return p.out / f"longrope-seed{seed}.json"


def search_seed(p: Plan, seed: int, runtime: Runtime, log) -> None:
    """LongRoPE's search on seed ``seed``'s RoPE checkpoint; writes its log and summary (skipped when done)."""
    if summary_path(p, seed).exists():
        return
    base, head_dim = p.base, p.base.dim // p.base.num_heads
    model = LanguageModel(p.model_config("rope"))
    model.load_state_dict(storage.load_weights(p.checkpoint("rope", seed)))
    windows = p.search_windows()
    objective = lm_objective(model.to(runtime.device), windows.tokens, factor=p.config.factor,
                             original=base.train_length)
    search_config = SearchConfig(
        population=p.config.search_population, generations=p.config.search_generations,
        parents=p.config.search_parents, max_factor=default_max_factor(p.config.factor),
        n_hat_choices=tuple(n for n in N_HAT_CHOICES if n < base.train_length), seed=seed)
    context = {"factor": p.config.factor, "target_length": p.target, "search_windows": p.config.search_windows,
               "split": "dev", "corpus_sha256": p.corpus.fingerprint["sha256"], "base": base.training_dict()}
    log(f"LongRoPE search (seed {seed}): population {search_config.population}, {search_config.generations} "
        f"generations, {len(windows.files)} dev windows of {p.target} tokens")
    state = search(objective, seed_candidates(head_dim, p.config.factor, base.train_length), search_config,
                   p.out / f"search_log-seed{seed}.json", context=context, log=log)
    best = Candidate.from_dict(state["best"])
    without_n_hat = objective([Candidate(best.factors, 0)])[0] if best.n_hat else state["best"]["loss"]
    seeds = {m: entry["loss"] for m, entry in zip(SEED_METHODS, state["generations"][0]["candidates"])}
    wall = sum(g["wall_time_s"] for g in state["generations"])
    evaluated = sum(g["new_evaluations"] for g in state["generations"])
    storage.write_json(summary_path(p, seed), {
        "seed": seed, "split": "dev", "windows": len(windows.files),
        "best": state["best"], "loss_best_n_hat": state["best"]["loss"], "loss_n_hat_0": without_n_hat,
        "seed_losses": seeds, "best_loss_per_generation": best_loss_per_generation(state),
        "candidates_evaluated": evaluated, "candidates_per_s": evaluated / max(wall, 1e-9),
        "wall_time_s": wall, "search_log": f"search_log-seed{seed}.json",
        "rope_parameters": longrope_parameters(best.factors, factor=p.config.factor, original=base.train_length),
        "method_factors": {m: list(method_factors(m, head_dim, p.config.factor, base.train_length))
                           for m in SEED_METHODS},
        "inverse_frequencies": plain_frequencies(head_dim, 10000.0).tolist(),
    })
    log(f"LongRoPE (seed {seed}): best dev loss {state['best']['loss']:.4f} nats (n̂ = {best.n_hat}; n̂ = 0: "
        f"{without_n_hat:.4f}); seeds: " + ", ".join(f"{m} {v:.4f}" for m, v in seeds.items()))


def export(p: Plan, summaries: dict[int, dict]) -> dict:
    """Write rope_parameters.json from the seed whose exported (n̂ = 0) factors score best on dev; returns it."""
    seed = min(summaries, key=lambda s: summaries[s]["loss_n_hat_0"])
    chosen = summaries[seed]
    exported = {"rope_parameters": chosen["rope_parameters"], "metadata": {
        "found_by": "posenc extend: LongRoPE evolutionary search (Ding et al. 2024)",
        "chosen": f"seed {seed} of {sorted(summaries)}, lowest dev loss with n_hat = 0",
        "n_hat": 0,
        "n_hat_note": "n_hat (initial positions kept at the original frequencies) has no field in transformers' "
                      f"longrope format; this export, like every longrope row, uses n_hat = 0 (the search's best "
                      f"had n_hat = {chosen['best']['n_hat']})",
        "search_loss_nats": {"best_n_hat": chosen["loss_best_n_hat"], "n_hat_0": chosen["loss_n_hat_0"],
                             "split": "dev"},
        "short_factor_note": "short_factor = 1: plain RoPE up to original_max_position_embeddings",
    }}
    storage.write_json(p.out / "rope_parameters.json", exported)
    return {**chosen, "exported_seed": seed}
