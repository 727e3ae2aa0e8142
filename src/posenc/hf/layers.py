"""Per-layer position schemes of Hugging Face models that mix them (SmolLM3, Cohere2, gpt-oss, Llama 4, Gemma 3).

``layer_positions`` reads, per decoder layer, whether it rotates, its sliding window or chunk and its attention
temperature, from the config as the model's code reads it; ``layer_encoding`` and ``layer_mask`` serve posenc's
attention of that layer, which then equals the model's own.
"""

from __future__ import annotations

import torch

from .. import checks
from ..encodings import NoPE
from ..encodings.temperature import QueryTemperature
from ..kernels.local import span_mask
from .loading import check_supported
from .rope import layer_types, rope_encoding

#: families that rotate only the layers of one type (Cohere2: its sliding-window layers; the global ones see no
#: positions); SmolLM3 and Llama 4 name their layers without RoPE in ``config.no_rope_layers`` instead
ROPE_ONLY_ON = {"cohere2": "sliding_attention"}


def layer_positions(model) -> tuple[dict, ...]:
    """What each decoder layer does with positions: ({"layer_type", "rope": bool, "window": keys with
    i − j < window, or None, "chunk": keys in the query's chunk of this many, or None, "temperature": a
    ``QueryTemperature`` dict or None}, ...), one per layer, read from the config as the model's code reads it."""
    check_supported(model)
    config = model.config
    count = config.num_hidden_layers
    types = list(getattr(config, "layer_types", None) or ["full_attention"] * count)
    no_rope = getattr(config, "no_rope_layers", None)  # 1: this layer rotates (SmolLM3, Llama 4)
    only = ROPE_ONLY_ON.get(config.model_type)
    tempered = getattr(config, "attn_temperature_tuning", False)
    described = []
    for layer, layer_type in enumerate(types):
        rope = bool(no_rope[layer]) if no_rope is not None else (only is None or layer_type == only)
        window = getattr(config, "sliding_window", None) if layer_type == "sliding_attention" else None
        if layer_type == "sliding_attention" and not getattr(config, "use_sliding_window", True):
            window = None  # SmolLM3's switch
        chunk = getattr(config, "attention_chunk_size", None) if layer_type == "chunked_attention" else None
        temperature = ({"kind": "llama4", "beta": config.attn_scale, "floor": config.floor_scale}
                       if tempered and not rope else None)
        described.append({"layer_type": layer_type, "rope": rope, "window": window, "chunk": chunk,
                          "temperature": temperature})
    return tuple(described)


def layer_encoding(model, layer: int):
    """posenc's encoding of decoder layer ``layer``: the model's RoPE for that layer's type (its own dict in a
    per-layer-type model), or NoPE where the layer does not rotate, with the layer's attention temperature."""
    described = layer_positions(model)
    checks.positive_int("layer", layer, minimum=0)
    if layer >= len(described):
        raise ValueError(f"layer must be in [0, {len(described) - 1}], got {layer}")
    this, types = described[layer], layer_types(model)
    if not this["rope"]:
        encoding = NoPE()
    else:
        encoding = rope_encoding(model, this["layer_type"] if types and this["layer_type"] in types else None)
    if this["temperature"]:
        encoding.temperature = QueryTemperature.from_dict(this["temperature"])
    return encoding


def layer_mask(description: dict, length: int, device=None):
    """Bool (1, 1, T, T) of the pairs a layer (a ``layer_positions`` entry) lets attend at positions 0..T−1:
    causal, and inside its window or chunk; ready for ``posenc.attention(..., mask=)``."""
    positions = torch.arange(length, device=device)[None]
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return span_mask(positions, positions, description["window"], description["chunk"]) & causal
