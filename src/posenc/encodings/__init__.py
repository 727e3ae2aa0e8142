"""Every positional encoding, built by name.

``build(name, **kwargs)`` is the one factory; ``registry.REGISTRY`` declares every encoding once (class, door,
paper, description, traits) and ``ENCODINGS`` maps its names to classes; ``register`` adds one defined elsewhere.
``build_for_model`` fills in the sizes a model knows (dim, head_dim, num_heads,
max_positions) for whichever of them the encoding's constructor takes, so callers
never branch on the encoding's name.
"""

from __future__ import annotations

import inspect

from .absolute import Learned, Sinusoidal, sinusoidal_table
from .alibi import ALiBi, alibi_slopes
from .base import NoPE, PositionalEncoding
from .cope import CoPE
from .fire import FIRE
from .forgetting import ForgettingGates
from .kerple import Kerple
from .multiaxis import AxialRoPE, MRoPE
from .sandwich import Sandwich
from .stick_breaking import StickBreaking
from .xpos import XPos
from .relative import Shaw, T5RelativeBias, TransformerXL, t5_bucket
from .rotary import RoPE, apply_rope, rope_angles
from .registry import ENCODINGS, ENTRIES, REGISTRY, Entry, register, unregister
from .scaling import SCALINGS, layer_scalings, rope_frequencies
from .temperature import QueryTemperature


def _encoding_class(name: str) -> type[PositionalEncoding]:
    if name not in ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}; valid names: {', '.join(ENCODINGS)}")
    return ENCODINGS[name]


def build(name: str, **kwargs) -> PositionalEncoding:
    """Build the encoding registered as ``name`` (see ENCODINGS) with its own kwargs; any encoding also takes
    ``temperature`` (a dict, ``temperature.QueryTemperature``): its queries scaled by their position."""
    temperature = kwargs.pop("temperature", None)
    temperature = None if temperature is None else QueryTemperature.from_dict(temperature)
    cls = _encoding_class(name)
    accepted = inspect.signature(cls.__init__).parameters
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        valid = [p for p in accepted if p != "self"]
        raise ValueError(f"encoding {name!r} got unknown kwargs {unknown}; it takes {valid}")
    try:
        encoding = cls(**kwargs)
    except TypeError as error:  # a missing required argument
        raise ValueError(f"encoding {name!r}: {error}") from None
    if temperature is not None:
        encoding.temperature = temperature
    return encoding


def build_for_model(name: str, *, sizes: dict, **kwargs) -> PositionalEncoding:
    """Like build(), with ``sizes`` (e.g. dim, head_dim, num_heads, max_positions)
    passed to the constructor where it takes them; explicit kwargs win."""
    accepted = inspect.signature(_encoding_class(name).__init__).parameters
    filled = {key: value for key, value in sizes.items() if key in accepted}
    return build(name, **{**filled, **kwargs})


__all__ = [
    "ENCODINGS", "ENTRIES", "REGISTRY", "SCALINGS", "ALiBi", "AxialRoPE", "CoPE", "FIRE", "Kerple", "Entry", "ForgettingGates", "Learned", "MRoPE", "NoPE", "PositionalEncoding", "QueryTemperature", "RoPE",
    "Sandwich", "Shaw", "Sinusoidal", "StickBreaking", "T5RelativeBias", "TransformerXL", "XPos", "alibi_slopes", "apply_rope", "build",
    "build_for_model", "layer_scalings", "register", "unregister", "rope_angles", "rope_frequencies", "sinusoidal_table", "t5_bucket",
]
