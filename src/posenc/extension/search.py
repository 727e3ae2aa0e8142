"""LongRoPE's evolutionary search over per-frequency rescale factors (Ding et al. 2024,
arXiv:2402.13753, §3.2 and Algorithm 1), independent of any model.

A candidate is F rescale factors λ (frequency i turns at θ_i / λ_i; i = 0 is the
fastest pair) and n̂, the number of initial positions left un-interpolated. Every
candidate obeys the paper's constraints: 1 <= λ_0 <= λ_1 <= ... <= λ_{F-1} <= max_factor
(low frequencies are interpolated at least as much as high ones), λ on a 0.01 grid,
n̂ from a fixed set.

Algorithm: generation 0 is the seed candidates (PI, NTK and YaRN's equivalent factors)
plus mutations of them. Each later generation is the top-k candidates seen so far
(elitism: the best loss never rises), mutations of them and crossovers between them.
Mutation redraws each λ_i with probability p between its neighbours, so a mutant is
monotone by construction; crossover takes each λ_i from either parent, retried until
monotone (the paper rejects violators), falling back to a running maximum. Seeds enter
exactly as given (off the grid, so a seed's loss is its method's loss).

The objective maps a list of candidates to their losses, so a caller can score
several candidates in one batched forward pass. Randomness for generation g comes
from ``Random(seed, g)`` alone and every loss is kept in the log, so a search that is
killed and resumed from its log proposes exactly the candidates an uninterrupted one
would: the log is written atomically after every generation.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from .. import checks, storage

GRID = 0.01  # the paper's step for λ
N_HAT_CHOICES = (0, 1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 64, 128, 256)  # the paper's search space for n̂


@dataclass(frozen=True)
class Candidate:
    factors: tuple[float, ...]  # λ_i, fastest frequency first
    n_hat: int = 0

    def to_dict(self) -> dict:
        return {"factors": list(self.factors), "n_hat": self.n_hat}

    @classmethod
    def from_dict(cls, values: dict) -> "Candidate":
        return cls(tuple(float(f) for f in values["factors"]), int(values["n_hat"]))


Objective = Callable[[list[Candidate]], list[float]]


@dataclass(frozen=True)
class SearchConfig:
    population: int = 16
    generations: int = 8
    parents: int = 4  # k: the elite kept and bred each generation
    mutation_probability: float = 0.3
    max_factor: float = 10.0  # the paper: 1.25 × the extension factor
    n_hat_choices: tuple[int, ...] = (0,)
    seed: int = 0

    def __post_init__(self):
        checks.positive_int("search population", self.population, minimum=4)
        checks.positive_int("search generations", self.generations)
        checks.positive_int("search parents", self.parents, minimum=2)
        if self.parents >= self.population:
            raise ValueError(f"search parents ({self.parents}) must be fewer than the population ({self.population})")
        if not 0 < self.mutation_probability <= 1:
            raise ValueError(f"mutation_probability must be in (0, 1], got {self.mutation_probability}")
        checks.positive_float("max_factor", self.max_factor, minimum=1.0, inclusive=True)
        if not self.n_hat_choices or any(not isinstance(n, int) or n < 0 for n in self.n_hat_choices):
            raise ValueError(f"n_hat_choices must be integers >= 0, got {self.n_hat_choices}")

    def to_dict(self) -> dict:
        return {**asdict(self), "n_hat_choices": list(self.n_hat_choices)}


def is_monotone(factors: tuple[float, ...], max_factor: float) -> bool:
    return all(1.0 <= a <= b for a, b in zip(factors, factors[1:])) and 1.0 <= factors[0] and factors[-1] <= max_factor


def constrain(factors, max_factor: float) -> tuple[float, ...]:
    """Onto the grid, within [1, max_factor], made monotone by a running maximum."""
    clipped = [min(max(round(float(f) / GRID) * GRID, 1.0), max_factor) for f in factors]
    running, out = 1.0, []
    for f in clipped:
        running = max(running, f)
        out.append(round(running, 2))
    return tuple(out)


def mutate(parent: Candidate, config: SearchConfig, rng: random.Random) -> Candidate:
    """Redraw each λ_i with probability p uniformly on the grid between its (new) neighbours."""
    factors = list(parent.factors)
    for i in range(len(factors)):
        if rng.random() < config.mutation_probability:
            low = factors[i - 1] if i > 0 else 1.0
            high = factors[i + 1] if i + 1 < len(factors) else config.max_factor
            steps = int(round((high - low) / GRID))
            factors[i] = round(low + GRID * rng.randint(0, steps), 2)
    n_hat = parent.n_hat
    if len(config.n_hat_choices) > 1 and rng.random() < config.mutation_probability:
        n_hat = rng.choice(config.n_hat_choices)
    return Candidate(constrain(factors, config.max_factor), n_hat)


def crossover(a: Candidate, b: Candidate, config: SearchConfig, rng: random.Random, tries: int = 20) -> Candidate:
    """Each λ_i (and n̂) from either parent; retried until monotone, else made monotone."""
    for _ in range(tries):
        factors = tuple(x if rng.random() < 0.5 else y for x, y in zip(a.factors, b.factors))
        if is_monotone(factors, config.max_factor):
            break
    n_hat = a.n_hat if rng.random() < 0.5 else b.n_hat
    return Candidate(constrain(factors, config.max_factor), n_hat)


def _generation_rng(config: SearchConfig, generation: int) -> random.Random:
    return random.Random(config.seed * 1_000_003 + generation)


def _propose(generation: int, seeds: list[Candidate], elite: list[Candidate], config: SearchConfig,
             seen: dict) -> list[Candidate]:
    """The distinct candidates of one generation: the parents first, then their mutants and crossovers."""
    rng = _generation_rng(config, generation)
    if generation == 0:
        parents = list(dict.fromkeys(s if is_monotone(s.factors, config.max_factor)
                                     else Candidate(constrain(s.factors, config.max_factor), s.n_hat) for s in seeds))
        crossovers = 0  # the paper initialises by mutating the seeds
    else:
        parents = list(elite)
        crossovers = (config.population - len(parents)) // 2
    chosen = parents[: config.population]
    mutants = config.population - len(chosen) - crossovers
    attempts = 0
    while len(chosen) < config.population and attempts < 50 * config.population:
        attempts += 1
        if mutants > 0 or len(parents) < 2:
            child = mutate(rng.choice(parents), config, rng)
        else:
            child = crossover(*rng.sample(parents, 2), config, rng)
        if child not in chosen and child not in seen:
            chosen.append(child)
            mutants -= 1
    return chosen


def search(objective: Objective, seeds: list[Candidate], config: SearchConfig, log_path: str | Path, *,
           context: dict | None = None, label: str = "longrope search", log=print) -> dict:
    """Run (or resume from ``log_path``) the search; returns the finished log.

    Args:
        objective: candidates -> losses (lower is better), one loss per candidate.
        seeds: the starting candidates (e.g. PI, NTK, YaRN's factors), all of one length F.
        context: what the objective measures (model, windows, target length); a resumed
            log must have been written with the same context and config.
    Returns:
        {"config", "context", "generations": [{"generation", "candidates": [{factors, n_hat, loss}],
         "best", "best_loss", "new_evaluations", "candidates_per_s"}], "best": {factors, n_hat, loss}}
    """
    if not seeds or len({len(s.factors) for s in seeds}) != 1:
        raise ValueError("search needs seed candidates, all with the same number of factors")
    log_path = Path(log_path)
    state = {"config": config.to_dict(), "context": context or {}, "generations": [], "best": None}
    seen: dict[Candidate, float] = {}
    if log_path.exists():
        state = read_log(log_path, config, context or {})
        for generation in state["generations"]:
            for entry in generation["candidates"]:
                seen[Candidate.from_dict(entry)] = entry["loss"]
    bar = tqdm(total=config.generations, initial=len(state["generations"]), desc=label, mininterval=1.0,
               dynamic_ncols=True)
    for generation in range(len(state["generations"]), config.generations):
        elite = sorted(seen, key=seen.get)[: config.parents]
        candidates = _propose(generation, seeds, elite, config, seen)
        new = [c for c in candidates if c not in seen]
        began = time.perf_counter()
        for candidate, loss in zip(new, objective(new) if new else []):
            seen[candidate] = float(loss)
        wall = time.perf_counter() - began
        best = min(seen, key=seen.get)
        state["generations"].append({
            "generation": generation,
            "candidates": [{**c.to_dict(), "loss": seen[c]} for c in candidates],
            "best": best.to_dict(), "best_loss": seen[best],
            "new_evaluations": len(new), "wall_time_s": wall, "candidates_per_s": len(new) / max(wall, 1e-9),
        })
        state["best"] = {**best.to_dict(), "loss": seen[best]}
        storage.write_json(log_path, state)  # after every generation: a killed search resumes here
        bar.update(1)
        bar.set_postfix(best=f"{seen[best]:.4f}", cand_s=f"{len(new) / max(wall, 1e-9):.1f}")
        log(f"  generation {generation}: best loss {seen[best]:.4f}, {len(new)} new candidates "
            f"at {len(new) / max(wall, 1e-9):.2f}/s")
    bar.close()
    return state


def read_log(path: Path, config: SearchConfig, context: dict) -> dict:
    """A search log to resume; ValueError naming the file when it is damaged or from another search."""
    try:
        state = storage.read_json(path)
        for generation in state["generations"]:
            for entry in generation["candidates"]:
                Candidate.from_dict(entry), float(entry["loss"])
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"search log {path} is damaged or truncated ({type(error).__name__}: {error}); delete it "
                         "and run again with --resume: the search restarts") from None
    if state.get("config") != config.to_dict() or state.get("context") != context:
        raise ValueError(f"search log {path} was written by a search with another config or objective; delete it "
                         "or use another --out")
    return state


def best_loss_per_generation(state: dict) -> list[float]:
    return [generation["best_loss"] for generation in state["generations"]]
