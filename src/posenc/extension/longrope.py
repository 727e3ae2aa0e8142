"""LongRoPE around the search: the seeds' factors, a RoPE that scores many candidates in
one batch, the objective on a posenc LM, and the export to ``rope_parameters``.

Per-frequency factors λ_i relate to inverse frequencies by θ'_i = θ_i / λ_i, so any
frequency scaling has an equivalent λ: PI is λ_i = s, NTK rises from 1 to s, YaRN ramps
between them. The export is transformers' ``longrope`` dict: ``long_factor`` = λ (used
past ``original_max_position_embeddings``), ``short_factor`` = 1 (plain RoPE inside it),
and transformers' default attention factor sqrt(1 + ln s / ln L), which the search's
objective applies too, so the searched candidate with n̂ = 0 *is* the exported config.
n̂ (positions below it keep the original frequencies) has no field in that format.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..encodings.rotary import RoPE
from ..encodings.scaling import rope_frequencies
from .methods import method_scaling
from .search import Candidate, Objective

SEED_METHODS = ("pi", "ntk", "yarn")  # the paper's initial population


def plain_frequencies(head_dim: int, base: float) -> Tensor:
    return rope_frequencies(head_dim, {"rope_theta": base})[0]


def method_factors(method: str, head_dim: int, factor: float, original: int, base: float = 10000.0
                   ) -> tuple[float, ...]:
    """λ_i = θ_i / θ'_i of a method's frequencies (F = head_dim/2 values, fastest first)."""
    scaled, _ = rope_frequencies(head_dim, method_scaling(method, factor, original, base=base))
    ratios = (plain_frequencies(head_dim, base).double() / scaled.double()).tolist()
    factors, running = [], 1.0
    for ratio in ratios:  # float32 rounding aside (1e-6), every method's ratios are >= 1 and rising
        running = max(running, round(ratio, 6))
        factors.append(running)
    return tuple(factors)


def longrope_parameters(factors, *, factor: float, original: int, base: float = 10000.0) -> dict:
    """transformers' ``longrope`` rope_parameters for searched long factors λ (short factors 1)."""
    return {"rope_type": "longrope", "rope_theta": float(base), "factor": float(factor),
            "original_max_position_embeddings": int(original),
            "short_factor": [1.0] * len(factors), "long_factor": [float(f) for f in factors]}


class CandidateRoPE(RoPE):
    """RoPE with its own candidate (λ, n̂) per batch row: many candidates, one forward.

    Row r rotates position p by p·θ_i when p < n̂_r, else by p·θ_i/λ_{r,i}, with the
    inverse frequencies formed in float32 exactly as transformers' longrope forms them
    (1 / (λ · base^(2i/d))), angles in float64, cos/sin times the longrope attention factor.
    Set the rows with ``use`` before each forward.
    """

    def __init__(self, head_dim: int, *, factor: float, original: int, base: float = 10000.0):
        super().__init__(head_dim, base=base)
        self.attention_factor = rope_frequencies(
            head_dim, longrope_parameters([1.0] * (head_dim // 2), factor=factor, original=original, base=base),
            seq_len=original + 1)[1]
        self.row_factors: Tensor | None = None  # (R, F) float32
        self.row_n_hat: Tensor | None = None  # (R,) int64

    def use(self, candidates: list[Candidate]) -> None:
        self.row_factors = torch.tensor([c.factors for c in candidates], dtype=torch.float32)
        self.row_n_hat = torch.tensor([c.n_hat for c in candidates], dtype=torch.int64)

    def _cos_sin(self, at, dtype):
        if self.row_factors is None:
            raise ValueError("CandidateRoPE.use(candidates) must be called before a forward pass")
        if at.k_pos is not at.q_pos:
            raise ValueError("CandidateRoPE scores whole windows: queries and keys must share positions")
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
        wavelength_scale = self.scaling["rope_theta"] ** exponents  # (F,) float32
        plain, scaled = 1.0 / wavelength_scale, 1.0 / (self.row_factors * wavelength_scale)  # (F,), (R, F)
        positions = at.q_pos.to("cpu")  # (1 or R, T)
        keep = positions[..., None] < self.row_n_hat[:, None, None]  # (R, T, 1)
        inv_freq = torch.where(keep, plain.double(), scaled[:, None, :].double())  # (R, T, F)
        angles = (positions.double()[..., None] * inv_freq).unsqueeze(1).to(at.q_pos.device)  # (R, 1, T, F)
        cos = (angles.cos() * self.attention_factor).to(dtype)
        sin = (angles.sin() * self.attention_factor).to(dtype)
        return cos, sin, cos, sin


@torch.no_grad()
def lm_objective(model, windows: Tensor, *, factor: float, original: int, batch_rows: int = 16) -> Objective:
    """Mean next-token loss (nats) of each candidate on ``windows``, for a posenc LanguageModel.

    The model's RoPE is swapped for a CandidateRoPE (same head width and base), so one
    forward scores up to ``batch_rows`` (candidate, window) pairs and the model is never rebuilt.
    windows: (N, T + 1) int64 tokens.
    """
    encoding = model.encoding
    if not isinstance(encoding, RoPE):
        raise ValueError(f"the LongRoPE search needs a RoPE model, got {type(encoding).__name__}")
    model.encoding = CandidateRoPE(encoding.head_dim, factor=factor, original=original,
                                   base=encoding.scaling["rope_theta"])
    model.eval()
    device = next(model.parameters()).device
    inputs, targets = windows[:, :-1].to(device), windows[:, 1:].to(device)

    def objective(candidates: list[Candidate]) -> list[float]:
        pairs = [(c, w) for c in range(len(candidates)) for w in range(windows.shape[0])]
        totals = torch.zeros(len(candidates), dtype=torch.float64)
        for start in range(0, len(pairs), batch_rows):
            chunk = pairs[start : start + batch_rows]
            model.encoding.use([candidates[c] for c, _ in chunk])
            rows = torch.tensor([w for _, w in chunk])
            logits = model(inputs[rows])  # (r, T, V)
            loss = F.cross_entropy(logits.float().transpose(1, 2), targets[rows], reduction="none").mean(1)
            totals.index_add_(0, torch.tensor([c for c, _ in chunk]), loss.double().cpu())
        return (totals / windows.shape[0]).tolist()

    return objective


def seed_candidates(head_dim: int, factor: float, original: int, base: float = 10000.0) -> list[Candidate]:
    """PI, NTK and YaRN's factors as candidates with n̂ = 0: the search's starting points."""
    return [Candidate(method_factors(m, head_dim, factor, original, base)) for m in SEED_METHODS]


def default_max_factor(factor: float) -> float:
    """The paper's upper bound on any λ_i: 1.25 × the extension factor."""
    return math.floor(1.25 * factor * 100) / 100
