"""The one list of encodings: each declared once, with what the rest of posenc reads about it.

An entry names the class, the door it uses and the paper (docs/guide/api.md's table, which a test holds to this list),
a one-line description (the extrapolation table's row), and the traits the commands branch on: ``symmetric``
(bidirectional scores depend on |i − j| alone, so ``verify`` expects a sentence and its reverse to score alike) and
``axes`` (more than one: positions per axis, outside ``attention()``'s one-dimensional benches and the tiny LM).
What a constructor needs is its signature (``build_for_model`` fills the sizes a model knows); which doors an
encoding opens are its class flags (``PositionalEncoding.doors``). Adding an encoding is its module, its entry here
and its oracle test (docs/guide/api.md's table is generated from this list); bench, verify, ``posenc extrapolate``'s and
``posenc task``'s rows follow, because each reads these lists when it is called. An encoding defined outside posenc
joins them the same way through ``register`` (tests/encodings/test_adding_an_encoding.py adds one that way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .absolute import Learned, Sinusoidal
from .alibi import ALiBi
from .base import NoPE, PositionalEncoding
from .cope import CoPE
from .forgetting import ForgettingGates
from .fire import FIRE
from .kerple import Kerple
from .multiaxis import AxialRoPE, MRoPE
from .relative import Shaw, T5RelativeBias, TransformerXL
from .rotary import RoPE
from .sandwich import Sandwich
from .stick_breaking import StickBreaking
from .xpos import XPos


@dataclass(frozen=True)
class Entry:
    name: str
    cls: type[PositionalEncoding]
    door: str
    paper: str
    description: str
    symmetric: bool = False
    axes: int = 1

    @property
    def in_attention(self) -> bool:
        """Whether the encoding acts inside attention (not only on the input embeddings)."""
        return not self.cls.has_input


#: every encoding, in the order of the tables; ``register`` appends to it
REGISTRY: list[Entry] = [
    Entry("none", NoPE, "—", "NoPE (Kazemnejad et al. 2023, arXiv:2305.19466)", "no positional encoding (NoPE)"),
    Entry("sinusoidal", Sinusoidal, "input", "Vaswani et al. 2017, arXiv:1706.03762",
          "sinusoidal table added to the input"),
    Entry("learned", Learned, "input", "Gehring et al. 2017 / GPT-2 / BERT",
          "learned table added to the input; no rows past the training length"),
    Entry("alibi", ALiBi, "score bias", "Press et al. 2022, arXiv:2108.12409", "ALiBi score bias"),
    Entry("rope", RoPE, "q/k rotation", "Su et al. 2021, arXiv:2104.09864", "RoPE, no scaling"),
    Entry("t5", T5RelativeBias, "score bias", "Raffel et al. 2020, arXiv:1910.10683", "T5 bucketed relative bias"),
    Entry("shaw", Shaw, "content–position (keys and values)", "Shaw et al. 2018, arXiv:1803.02155",
          "Shaw et al. relative keys and values"),
    Entry("transformer_xl", TransformerXL, "content–position", "Dai et al. 2019, arXiv:1901.02860",
          "Transformer-XL relative terms"),
    Entry("kerple", Kerple, "score bias", "Chi et al. 2022, arXiv:2205.09921",
          "Kerple, learned logarithmic kernel of the distance (the paper's better variant)", symmetric=True),
    Entry("sandwich", Sandwich, "score bias (+ channels)", "Chi et al. 2023, arXiv:2212.10356",
          "Sandwich: dot product of sinusoids as a fixed bias", symmetric=True),
    Entry("fire", FIRE, "score bias (reads the query's position)", "Li et al. 2023, arXiv:2310.04418",
          "FIRE: learned MLP of the log distance, normalized by the query's position", symmetric=True),
    Entry("xpos", XPos, "q/k rotation with decay", "Sun et al. 2022, arXiv:2212.10554",
          "xPos: RoPE with a per-channel decay in distance"),
    Entry("cope", CoPE, "content–position (gated counts)", "Golovneva et al. 2024, arXiv:2405.18719",
          "CoPE: positions counted by gates on q·k", symmetric=True),
    Entry("fox", ForgettingGates, "score bias from per-token forget gates", "Lin et al. 2025 (ICLR), arXiv:2503.02130",
          "FoX: each token's forget gates decay the logits of the keys before it"),
    Entry("stick-breaking", StickBreaking, "normalization (replaces the softmax)",
          "Tan et al. 2025 (ICLR), arXiv:2410.17980",
          "stick-breaking attention: each earlier key takes σ(q·k) of what nearer keys left"),
    Entry("mrope", MRoPE, "q/k rotation, 3 axes", "Qwen2-VL, Wang et al. 2024, arXiv:2409.12191",
          "M-RoPE: RoPE over (time, height, width) sections of the head", axes=3),
    Entry("axial_rope", AxialRoPE, "q/k rotation, 2 axes",
          "Qwen2-VL's vision tower; RoPE-Mixed, Heo et al. 2024, arXiv:2403.13298",
          "axial RoPE over (row, column), or RoPE-Mixed's learned directions", axes=2),
]

ENTRIES: dict[str, Entry] = {entry.name: entry for entry in REGISTRY}
ENCODINGS: dict[str, type[PositionalEncoding]] = {entry.name: entry.cls for entry in REGISTRY}
BUILT_IN = frozenset(ENTRIES)
NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")


def register(entry: Entry) -> Entry:
    """Add an encoding defined outside posenc: ``build``, ``attention()``, the tiny LM, bench, verify and the
    commands' rows offer it from this call on. Its name takes lower-case letters, digits, "_" and "-" ("+" joins a
    row's way of reading a checkpoint to its encoding, "rope+yarn")."""
    if not (isinstance(entry.cls, type) and issubclass(entry.cls, PositionalEncoding)):
        raise ValueError(f"register: {entry.name!r}'s cls must be a PositionalEncoding subclass, got {entry.cls!r}")
    if not entry.name or not set(entry.name) <= NAME_CHARACTERS:
        raise ValueError(f"register: name {entry.name!r} must be lower-case letters, digits, '_' or '-'")
    if entry.name in ENTRIES:
        raise ValueError(f"register: an encoding named {entry.name!r} is registered already")
    REGISTRY.append(entry)
    ENTRIES[entry.name], ENCODINGS[entry.name] = entry, entry.cls
    return entry


def unregister(name: str) -> Entry:
    """Remove an encoding ``register`` added (posenc's own stay); returns its entry."""
    if name in BUILT_IN or name not in ENTRIES:
        raise ValueError(f"unregister: {name!r} is not an encoding register() added; added: "
                         f"{', '.join(sorted(set(ENTRIES) - BUILT_IN)) or 'none'}")
    entry = ENTRIES.pop(name)
    del ENCODINGS[name]
    REGISTRY.remove(entry)
    return entry


def name_of(cls: type[PositionalEncoding]) -> str:
    """The registered name of an encoding class: how code that is about one scheme names it without spelling it."""
    for entry in REGISTRY:
        if entry.cls is cls:
            return entry.name
    raise ValueError(f"{cls.__name__} is not a registered encoding")


def baseline() -> str:
    """The name of the encoding without positions (NoPE), every bench's and comparison's baseline."""
    return name_of(NoPE)


def having(trait: Callable[[type[PositionalEncoding]], bool]) -> tuple[str, ...]:
    """Names of the one-axis encodings whose class has ``trait`` (e.g. ``lambda cls: cls.has_score_channels``), in
    registry order: how a bench or a check picks its encodings, by what they do rather than by name."""
    return tuple(e.name for e in REGISTRY if e.axes == 1 and trait(e.cls))


def one_axis(*, in_attention: bool | None = None, from_positions: bool = False) -> tuple[str, ...]:
    """Names of the encodings of one-dimensional positions (what the tiny LM trains), in registry order;
    ``in_attention``: only those that act inside attention (True) or only on the input (False);
    ``from_positions``: only those ``attention()`` runs from q, k, v and positions alone (not FoX, whose bias
    needs its tokens' forget gates: the benches and checks that call ``attention()`` directly)."""
    return tuple(e.name for e in REGISTRY if e.axes == 1 and in_attention in (None, e.in_attention)
                 and not (from_positions and e.cls.has_token_gates))


def symmetric() -> tuple[str, ...]:
    return tuple(e.name for e in REGISTRY if e.symmetric)
