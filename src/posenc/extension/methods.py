"""Context-extension methods by name, as Hugging Face ``rope_parameters`` dicts.

``pi`` is position interpolation (``linear``), ``ntk`` static NTK-aware scaling,
``dynamic`` dynamic NTK, ``yarn`` YaRN, ``llama3`` Llama 3.1's band-wise rule, and
``longrope`` searched per-frequency factors (which need the factors; see longrope.py).
Each takes ``factor`` = target length / original (training) length.
"""

from __future__ import annotations

from .. import checks

ROPE_TYPES = {"pi": "linear", "ntk": "ntk", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3",
              "longrope": "longrope"}
METHODS = tuple(ROPE_TYPES)


def method_scaling(method: str, factor: float, original: int, *, base: float = 10000.0) -> dict:
    """The rope_parameters dict of ``method`` stretching a model trained at ``original`` tokens by ``factor``."""
    checks.choice("method", method, [m for m in METHODS if m != "longrope"])
    scaling = {"rope_type": ROPE_TYPES[method], "rope_theta": float(base), "factor": float(factor)}
    if method in ("dynamic", "yarn", "llama3"):
        scaling["original_max_position_embeddings"] = int(original)
    if method == "llama3":  # Llama 3.1's published bands
        scaling.update(low_freq_factor=1.0, high_freq_factor=4.0)
    return scaling


def parse_methods(spec: str | tuple[str, ...] | list[str], valid: tuple[str, ...] = METHODS) -> tuple[str, ...]:
    """'pi,ntk,yarn' -> ('pi', 'ntk', 'yarn'); an unknown name raises, listing the valid ones."""
    names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec)
    names = [n for n in names if n]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise ValueError(f"--methods: unknown methods {unknown}; valid: {', '.join(valid)}")
    return tuple(dict.fromkeys(names))
