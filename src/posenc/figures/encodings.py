"""The pictures the seeds describe, computed from posenc itself (``posenc plot``).

Each function returns a titled, labelled matplotlib Figure (object-oriented API).
"""

from __future__ import annotations

import math

import torch
from matplotlib.figure import Figure

from .. import alibi_slopes, rope_frequencies, sinusoidal_table, t5_bucket
from ..encodings.scaling import yarn_ramp_bounds

# Seed 004's "position similarity" table (cosine similarity to position 0), which it
# prints without saying which d it used; posenc computes the real values for d=512.
SEED_004_SIMILARITY = {5: 0.92, 10: 0.71, 20: 0.38, 40: 0.12}
SEED_POSITIONS = (0, 5, 10, 20, 40)


def sinusoidal_heatmap(positions: int = 64, dim: int = 128) -> Figure:
    """Positions × dimensions of the sinusoidal table: fast stripes on the left, slow on the right."""
    table = sinusoidal_table(torch.arange(positions), dim)
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    ax = figure.add_subplot()
    image = ax.imshow(table.numpy(), aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    figure.colorbar(image, ax=ax, label="PE value")
    ax.set_xlabel(f"dimension (pairs 2i, 2i+1 = sin, cos at wavelength 2π·10000^(2i/{dim}))")
    ax.set_ylabel("position")
    ax.set_title(f"Sinusoidal encoding, d={dim}: high frequencies left, low frequencies right")
    return figure


def cosine_similarity_matrix(positions: int = 51, dim: int = 512) -> torch.Tensor:
    """(P, P) cosine similarity between sinusoidal encodings of positions 0..P-1."""
    table = sinusoidal_table(torch.arange(positions), dim)
    unit = table / table.norm(dim=-1, keepdim=True)
    return unit @ unit.t()


def similarity_figure(positions: int = 51, dim: int = 512) -> Figure:
    """Cosine similarity between encodings, with seed 004's printed numbers beside the real ones."""
    sim = cosine_similarity_matrix(positions, dim)
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1.1, 1]})
    image = left.imshow(sim.numpy(), cmap="viridis", vmin=sim.min().item(), vmax=1, origin="lower")
    figure.colorbar(image, ax=left, label="cosine similarity")
    for p in SEED_POSITIONS:
        left.axhline(p, color="white", linewidth=0.5, alpha=0.6)
        left.axvline(p, color="white", linewidth=0.5, alpha=0.6)
    left.set_xticks(SEED_POSITIONS)
    left.set_yticks(SEED_POSITIONS)
    left.set_xlabel("position")
    left.set_ylabel("position")
    left.set_title(f"Sinusoidal PE similarity, d={dim} (seed positions marked)")
    offsets = sorted(SEED_004_SIMILARITY)
    computed = [sim[0, p].item() for p in offsets]
    width = 0.38
    xs = range(len(offsets))
    right.bar([x - width / 2 for x in xs], [SEED_004_SIMILARITY[p] for p in offsets], width, label="seed 004 (printed)")
    right.bar([x + width / 2 for x in xs], computed, width, label=f"computed, d={dim}")
    for x, value in zip(xs, computed):
        right.text(x + width / 2, value + 0.01, f"{value:.2f}", ha="center", fontsize=8)
    right.set_xticks(list(xs), [f"0 vs {p}" for p in offsets])
    right.set_ylim(0, 1.05)
    right.set_xlabel("pair of positions")
    right.set_ylabel("cosine similarity")
    right.set_title("Similarity to position 0: the seed's table vs the formula")
    right.legend(fontsize=8)
    return figure


def rope_decay_curve(offsets: torch.Tensor, base: float, head_dim: int, constant: bool, samples: int = 512) -> torch.Tensor:
    """q·R(offset)k as a function of offset, normalized by its value at 0.

    constant=True uses q = k = ones (the RoFormer long-term-decay picture); otherwise
    the mean |score| over random unit-variance q, k (which shows no decay).
    """
    inv_freq = rope_frequencies(head_dim, {"rope_theta": base})[0].double()
    angles = offsets.double()[:, None] * inv_freq  # (N, F)
    if constant:
        scores = 2 * angles.cos().sum(-1)  # Σ over pairs of (1,1)·R(θ)(1,1) = 2cos θ
    else:
        generator = torch.Generator().manual_seed(0)
        q = torch.randn(samples, 2, inv_freq.shape[0], generator=generator, dtype=torch.float64)
        k = torch.randn(samples, 2, inv_freq.shape[0], generator=generator, dtype=torch.float64)
        dot = (q * k).sum(1)  # (S, F): q1k1 + q2k2
        cross = q[:, 0] * k[:, 1] - q[:, 1] * k[:, 0]  # (S, F)
        scores = (dot[:, None] * angles.cos() - cross[:, None] * angles.sin()).sum(-1).abs().mean(0)
    return scores / scores[0]


def rope_decay_figure(head_dim: int = 128, bases=(100.0, 10000.0, 500000.0), max_offset: int = 4096) -> Figure:
    offsets = torch.arange(max_offset + 1)
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    for ax, constant in zip(figure.subplots(1, 2), (True, False)):
        for base in bases:
            ax.plot(offsets.numpy(), rope_decay_curve(offsets, base, head_dim, constant).numpy(),
                    label=f"base {base:g}", linewidth=0.9)
        ax.set_xscale("symlog", linthresh=16)
        ax.set_xlabel("offset i − j")
        ax.set_ylabel("score / score at offset 0")
        ax.set_title("constant q = k = 1: long-term decay" if constant else "random q, k: mean |q·R k|")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    figure.suptitle(f"RoPE relative scores vs offset (head_dim={head_dim})")
    return figure


def scaling_examples(head_dim: int = 128, original: int = 4096, factor: float = 8.0) -> dict[str, dict]:
    """Scaling dicts for the comparison figure, all stretching ``original`` by ``factor``."""
    pairs = head_dim // 2
    return {
        "PI (linear)": {"rope_type": "linear", "factor": factor},
        "NTK-aware": {"rope_type": "ntk", "factor": factor},
        f"dynamic NTK @ {int(original * factor)}": {"rope_type": "dynamic", "factor": factor,
                                                   "original_max_position_embeddings": original},
        "YaRN": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original},
        "Llama 3": {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": original},
        "LongRoPE (example factors)": {
            "rope_type": "longrope", "factor": factor, "original_max_position_embeddings": original,
            "short_factor": [1.0] * pairs,
            "long_factor": [1.0 + (factor - 1.0) * (i / (pairs - 1)) ** 2 for i in range(pairs)],
        },
    }


def rope_scalings_figure(head_dim: int = 128, original: int = 4096, factor: float = 8.0) -> Figure:
    """Per-frequency stretch (default / scaled inv_freq) vs wavelength: which frequencies each method moves."""
    default = rope_frequencies(head_dim)[0].double()
    wavelength = 2 * math.pi / default
    figure = Figure(figsize=(8.5, 5), layout="constrained")
    ax = figure.add_subplot()
    for label, scaling in scaling_examples(head_dim, original, factor).items():
        inv_freq, attention_factor = rope_frequencies(head_dim, scaling, seq_len=int(original * factor))
        stretch = default / inv_freq.double()
        note = f" (attn ×{attention_factor:.3f})" if attention_factor != 1.0 else ""
        ax.plot(wavelength.numpy(), stretch.numpy(), marker=".", linewidth=1, label=label + note)
    yarn = {"rope_theta": 10000.0, "original_max_position_embeddings": original}
    low, high = yarn_ramp_bounds(yarn, head_dim)
    for index, text in ((low, "YaRN ramp starts"), (high, "YaRN ramp ends")):
        if index < len(wavelength):
            ax.axvline(wavelength[int(index)].item(), color="grey", linestyle=":", linewidth=0.9)
            ax.text(wavelength[int(index)].item(), 1.05, text, rotation=90, fontsize=7, va="bottom")
    ax.axvline(original, color="black", linestyle="--", linewidth=0.8)
    ax.text(original, 1.0, " training length", fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("wavelength 2π / inv_freq (tokens), log scale")
    ax.set_ylabel("stretch factor: original / scaled inv_freq (log)")
    ax.set_title(f"Which frequencies each RoPE scaling stretches (head_dim={head_dim}, {original} → ×{factor:g})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return figure


def alibi_figure(num_heads: int = 8, keys: int = 64) -> Figure:
    """ALiBi bias vs distance per head, and attention of a content-free query over the keys."""
    slopes = alibi_slopes(num_heads)
    distance = torch.arange(keys, dtype=torch.float64)
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = figure.subplots(1, 2)
    for h, slope in enumerate(slopes.tolist()):
        bias = -slope * distance
        left.plot(distance.numpy(), bias.numpy(), label=f"head {h} (m=1/{1 / slope:g})")
        weights = torch.softmax(bias.flip(0), 0)  # keys 0..T-1 seen from the query at T-1
        right.plot(torch.arange(keys).numpy(), weights.numpy(), label=f"head {h}")
    left.set_xlabel("distance i − j")
    left.set_ylabel("bias −m·(i − j)")
    left.set_title(f"ALiBi biases, {num_heads} heads")
    left.legend(fontsize=7)
    right.set_xlabel(f"key position (query at {keys - 1})")
    right.set_ylabel("attention weight")
    right.set_yscale("log")
    right.set_title("Attention of a uniform query (equal content scores)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    return figure


def t5_buckets_figure(num_buckets: int = 32, max_distance: int = 128, span: int = 200,
                      learned: torch.Tensor | None = None, bidirectional_learned: bool = False) -> Figure:
    """Bucket index vs relative position; with ``learned`` (buckets, H), the learned bias per head too."""
    rel = torch.arange(-span, span + 1)
    figure = Figure(figsize=(11 if learned is not None else 7, 4.2), layout="constrained")
    axes = figure.subplots(1, 2 if learned is not None else 1)
    ax = axes[0] if learned is not None else axes
    for bidirectional in (True, False):
        buckets = t5_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
        ax.step(rel.numpy(), buckets.numpy(), where="mid", label="bidirectional" if bidirectional else "causal")
    ax.set_xlabel("relative position (key − query)")
    ax.set_ylabel("bucket")
    ax.set_title(f"T5 buckets ({num_buckets} buckets, max distance {max_distance})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    if learned is not None:
        buckets = t5_bucket(rel, bidirectional=bidirectional_learned, num_buckets=learned.shape[0],
                            max_distance=max_distance)
        for h in range(learned.shape[1]):
            axes[1].plot(rel.numpy(), learned[buckets, h].numpy(), label=f"head {h}")
        axes[1].set_xlabel("relative position (key − query)")
        axes[1].set_ylabel("learned bias")
        axes[1].set_title("T5 bias learned by the checkpoint, per head")
        axes[1].legend(fontsize=7)
        axes[1].grid(alpha=0.3)
    return figure
