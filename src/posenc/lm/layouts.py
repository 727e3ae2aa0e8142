"""Per-layer positions as data: which encoding each layer uses, and whether it attends in a window or a chunk.

The models released in 2025 mix schemes per layer: every few layers one global layer, the others local. A
``ModelConfig.layers`` entry describes one layer: ``{}`` is a global layer with the model's encoding; a local
layer names its own encoding and kwargs and a ``window`` (keys with 0 <= i − j < window) or a ``chunk`` (keys in
the query's chunk). The model's encoding is the global layers', so the kwargs an evaluation changes (a RoPE
scaling, an attention temperature) reach the global layers only, as ``posenc.hf.apply_scaling`` does for Gemma 3.

The named layouts below put one global layer after every three local ones (layers 3, 7, ...; Llama 4 and Cohere2
have the same ratio, Gemma 3 has one in six), and make the last layer global so that a model of fewer layers still
mixes; the extrapolation rows give the local layers a span of a quarter of the training length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import checks
from ..encodings import NoPE, RoPE
from ..encodings.registry import name_of

LAYER_KEYS = ("encoding", "encoding_kwargs", "window", "chunk")
GLOBAL_EVERY = 4  # layers 3, 7, ... are global


@dataclass(frozen=True)
class Layout:
    name: str
    description: str
    global_encoding: str  # the model's encoding, whose kwargs an evaluation may change
    local_encoding: str
    local_attention: str  # "window" or "chunk"
    global_kwargs: dict = field(default_factory=dict)
    local_kwargs: dict = field(default_factory=dict)

    def layers(self, num_layers: int, span: int) -> tuple[dict, ...]:
        """One ``ModelConfig.layers`` entry per layer: global every ``GLOBAL_EVERY``-th and the last, the others
        local with this ``span`` (a window or a chunk, in tokens)."""
        local = {"encoding": self.local_encoding, "encoding_kwargs": dict(self.local_kwargs),
                 self.local_attention: checks.positive_int("span", span)}
        return tuple({} if (layer + 1) % GLOBAL_EVERY == 0 or layer == num_layers - 1 else dict(local)
                     for layer in range(num_layers))


NOPE, ROPE = name_of(NoPE), name_of(RoPE)  # the two schemes the layouts mix

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (
    Layout("irope", "Llama 4's iRoPE: RoPE in chunks of a quarter of the training length, every fourth layer "
           "global with no positions", global_encoding=NOPE, local_encoding=ROPE, local_attention="chunk"),
    Layout("swa+global", "Gemma 3's layers: RoPE (θ 10k) in a sliding window of a quarter of the training length, "
           "every fourth layer global with RoPE θ 1M", global_encoding=ROPE, local_encoding=ROPE,
           local_attention="window", global_kwargs={"base": 1_000_000.0}),
    Layout("rnope-swa", "Cohere2's layers: RoPE only in a sliding window of a quarter of the training length, every "
           "fourth layer global with no positions", global_encoding=NOPE, local_encoding=ROPE,
           local_attention="window"),
)}


def check_layers(layers: tuple, num_layers: int) -> tuple[dict, ...]:
    """``layers`` as a tuple of validated entries: () (every layer global, the model's encoding) or one per layer."""
    if not isinstance(layers, (tuple, list)) or not all(isinstance(entry, dict) for entry in layers):
        raise ValueError(f"layers must be a list of dicts, one per layer, got {layers!r}")
    if layers and len(layers) != num_layers:
        raise ValueError(f"layers must have one entry per layer ({num_layers}), got {len(layers)}")
    for index, entry in enumerate(layers):
        unknown = sorted(set(entry) - set(LAYER_KEYS))
        if unknown:
            raise ValueError(f"layers[{index}]: unknown keys {unknown}; valid: {', '.join(LAYER_KEYS)}")
        for span in ("window", "chunk"):
            if entry.get(span) is not None:
                checks.positive_int(f"layers[{index}].{span}", entry[span])
        if entry.get("encoding_kwargs") and "encoding" not in entry:
            raise ValueError(f"layers[{index}]: encoding_kwargs without an encoding; a global layer ({{}}) takes "
                             "the model's encoding and encoding_kwargs")
    return tuple(dict(entry) for entry in layers)
