"""Context-extension methods by name, as Hugging Face ``rope_parameters`` dicts.

``pi`` is position interpolation (``linear``), ``ntk`` static NTK-aware scaling,
``dynamic`` dynamic NTK, ``yarn`` YaRN, ``llama3`` Llama 3.1's band-wise rule, and
``longrope`` searched per-frequency factors (which need the factors; see longrope.py).
Each takes ``factor`` = target length / original (training) length.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import checks


@dataclass(frozen=True)
class Method:
    """A RoPE scaling by name, and the traits the commands branch on."""

    name: str
    rope_type: str  # transformers' name for it
    #: the dict names the model's original context (``original_max_position_embeddings``)
    reads_original: bool = False
    #: the frequencies change with the sequence's length, so keys rotated for one length are wrong at another
    length_dependent: bool = False
    #: its per-frequency factors are found by a search (``longrope``), not given by a formula of ``factor``
    searched: bool = False
    #: further fixed parameters of the published rule, (key, value) pairs
    published: tuple[tuple[str, float], ...] = ()
    #: the published parameters are set for models with long original contexts (Llama 3.1's 8k), not tiny ones
    for_long_originals: bool = False

    @property
    def fine_tunable(self) -> bool:
        """A fixed formula of ``factor`` (not searched, not changing with the length): what fine-tuning can adapt to."""
        return not (self.searched or self.length_dependent)


REGISTRY: tuple[Method, ...] = (
    Method("pi", "linear"),
    Method("ntk", "ntk"),
    Method("dynamic", "dynamic", reads_original=True, length_dependent=True),
    Method("yarn", "yarn", reads_original=True),
    Method("llama3", "llama3", reads_original=True, published=(("low_freq_factor", 1.0), ("high_freq_factor", 4.0)),
           for_long_originals=True),
    Method("longrope", "longrope", length_dependent=True, searched=True),
)
BY_NAME = {method.name: method for method in REGISTRY}
METHODS = tuple(BY_NAME)


def having(trait) -> tuple[str, ...]:
    """Names of the methods for which ``trait(method)`` holds, in registry order."""
    return tuple(method.name for method in REGISTRY if trait(method))


def method_scaling(method: str, factor: float, original: int, *, base: float = 10000.0) -> dict:
    """The rope_parameters dict of ``method`` stretching a model trained at ``original`` tokens by ``factor``."""
    checks.choice("method", method, having(lambda m: not m.searched))
    this = BY_NAME[method]
    scaling = {"rope_type": this.rope_type, "rope_theta": float(base), "factor": float(factor)}
    if this.reads_original:
        scaling["original_max_position_embeddings"] = int(original)
    scaling.update(dict(this.published))
    return scaling


def parse_methods(spec: str | tuple[str, ...] | list[str], valid: tuple[str, ...] = METHODS) -> tuple[str, ...]:
    """'pi,ntk,yarn' -> ('pi', 'ntk', 'yarn'); an unknown name raises, listing the valid ones."""
    names = [n.strip() for n in spec.split(",")] if isinstance(spec, str) else list(spec)
    names = [n for n in names if n]
    unknown = [n for n in names if n not in valid]
    if not names:
        raise ValueError(f"--methods names no method: give a comma list of {', '.join(valid)}")
    if unknown:
        raise ValueError(f"--methods: unknown methods {unknown}; valid: {', '.join(valid)}")
    checks.each_once("--methods", names)
    return tuple(names)
