"""A Hugging Face model's RoPE parameters: read them, complete them, run the model with others.

``model_rope_parameters`` reads the model's own dict (one per layer type in Gemma 3); ``full_rope_parameters``
completes a scaling dict with the model's rope_theta, partial rotary factor and original context, and checks it;
``apply_scaling`` rebuilds the model's rotary embedding from its config with that dict (weights untouched); and
``rope_encoding`` is posenc's RoPE whose rotations equal the model's own.
"""

from __future__ import annotations

import copy

from .. import checks
from ..encodings.rotary import RoPE
from ..encodings.scaling import SCALINGS, is_per_layer_type, normalize_scaling, rope_frequencies, rotary_dim
from .loading import check_supported

#: families whose rotation pairs adjacent channels (2c, 2c + 1); the others pair c with c + Dh/2
INTERLEAVED = ("cohere2", "llama4_text")
#: model types whose config class accepts only some rope_types (Phi3Config rewrites "yarn" to "longrope"
#: and rejects the rest), so another type would run in memory and break on reload
FAMILY_ROPE_TYPES = {"phi3": ("default", "longrope", "ntk")}
#: the layer type a per-layer-type model rescales by default: its global-attention layers
GLOBAL_LAYERS = "full_attention"
#: the scaling types whose frequencies depend on the model's pretraining context length
NEEDS_ORIGINAL = tuple(name for name, s in SCALINGS.items() if "original_max_position_embeddings" in s.required)


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def layer_types(model) -> tuple[str, ...] | None:
    """The layer types that hold their own RoPE dict (Gemma 3), or None when one dict serves every layer."""
    params = model.config.rope_parameters
    return tuple(k for k, v in params.items() if v is not None) if is_per_layer_type(params) else None


def model_rope_parameters(model, layer_type: str | None = None) -> dict:
    """The model's own rope_parameters dict; for a per-layer-type model, that of ``layer_type``
    (default: its global-attention layers)."""
    types = layer_types(model)
    if types is None:
        if layer_type is not None:
            raise ValueError(f"layer_type={layer_type!r} given, but this {model.config.model_type!r} model uses one "
                             "RoPE for every layer; leave it out")
        return model.config.rope_parameters or {}
    if layer_type is None and GLOBAL_LAYERS not in types:
        raise ValueError(f"this model has one RoPE per layer type ({', '.join(types)}); name one with layer_type=")
    return model.config.rope_parameters[checks.choice("layer_type", layer_type or GLOBAL_LAYERS, types)]


def original_context(model) -> int:
    """The context the model was pretrained for (its scaling's original length, else max_position_embeddings);
    for a per-layer-type model, that of its global-attention layers."""
    params = model_rope_parameters(model)
    return int(params.get("original_max_position_embeddings") or model.config.max_position_embeddings)


def full_rope_parameters(model, rope_parameters: dict, layer_type: str | None = None) -> dict:
    """The model's own rope_theta and partial_rotary_factor (of ``layer_type``, for a per-layer-type model)
    with ``rope_parameters`` on top; the original
    context filled in where a type needs it; posenc's ``ntk`` written as transformers can read it (a
    ``default`` dict with rope_theta raised by s^(d/(d-2)), the same frequencies bit for bit).
    Raises ValueError for a dict posenc or the model cannot use."""
    if not isinstance(rope_parameters, dict):
        raise ValueError(f"rope_parameters must be a dict (a transformers rope_parameters), e.g. {{'rope_type': "
                         f"'yarn', 'factor': 4.0}}, got {type(rope_parameters).__name__}")
    own = model_rope_parameters(model, layer_type)
    model_type = model.config.model_type
    allowed = FAMILY_ROPE_TYPES.get(model_type)
    asked = rope_parameters.get("rope_type", rope_parameters.get("type", "default"))
    if allowed and asked not in allowed:
        raise ValueError(f"a {model_type!r} config holds only rope_type {', '.join(allowed)} (transformers reads "
                         f"anything else back wrongly); got {asked!r}")
    params = {"rope_theta": own.get("rope_theta", 10000.0), **dict(rope_parameters)}
    if "partial_rotary_factor" in own:
        params.setdefault("partial_rotary_factor", own["partial_rotary_factor"])
    if params.get("rope_type", params.get("type")) in NEEDS_ORIGINAL:
        params.setdefault("original_max_position_embeddings", original_context(model))
    params = normalize_scaling(params)
    original, most = params.get("original_max_position_embeddings"), model.config.max_position_embeddings
    if original is not None and most is not None and original > most:  # transformers only warns
        raise ValueError(f"original_max_position_embeddings ({original}) is past this model's "
                         f"max_position_embeddings ({most}): give the context it was pretrained for")
    dim = rotary_dim(head_dim(model.config), params["partial_rotary_factor"], params["rope_type"])
    if params["rope_type"] == "longrope":
        for key in ("short_factor", "long_factor"):
            if len(params[key]) != dim // 2:
                raise ValueError(f"longrope {key} must have head_dim/2 = {dim // 2} entries for this model, "
                                 f"got {len(params[key])}")
    rope_frequencies(head_dim(model.config), params)  # every other check
    if params["rope_type"] == "ntk":  # not a transformers type: the same frequencies as a raised rope_theta
        raised = params["rope_theta"] * params["factor"] ** (dim / (dim - 2))
        params = {"rope_type": "default", "rope_theta": raised, "partial_rotary_factor": params["partial_rotary_factor"]}
    return params


def apply_scaling(model, rope_parameters: dict, layer_types_to_scale: tuple[str, ...] | None = None):
    """Run ``model`` with ``rope_parameters`` from now on (weights untouched); returns the model.

    For a per-layer-type model, the layers of ``layer_types_to_scale`` (default: the global-attention
    layers) take the new dict and the others keep theirs.
    ``dynamic`` reads the original context from ``config.max_position_embeddings`` in
    transformers, so that field is kept at the model's original context.
    """
    check_supported(model)
    config, types = model.config, layer_types(model)
    if types is None:
        if layer_types_to_scale is not None:
            raise ValueError("layer_types_to_scale is for models with one RoPE per layer type; this one has one")
        config.rope_parameters = params = full_rope_parameters(model, rope_parameters)
    else:
        targets = layer_types_to_scale or (GLOBAL_LAYERS,)
        nested = dict(config.rope_parameters)
        for layer_type in targets:
            nested[layer_type] = params = full_rope_parameters(model, rope_parameters, layer_type)
        config.rope_parameters = nested
    if params["rope_type"] == "dynamic":
        config.max_position_embeddings = params["original_max_position_embeddings"]
    old = model.model.rotary_emb
    device = next(old.buffers()).device
    model.model.rotary_emb = type(old)(config=config).to(device)
    return model


def rope_encoding(model, layer_type: str | None = None) -> RoPE:
    """posenc's RoPE (half layout) for the model's head width and its current rope_parameters
    (of ``layer_type`` for a per-layer-type model; default its global-attention layers)."""
    check_supported(model)
    params = normalize_scaling(copy.deepcopy(model_rope_parameters(model, layer_type)))
    known = {k: v for k, v in params.items() if v is not None}
    layout = "interleaved" if model.config.model_type in INTERLEAVED else "half"
    return RoPE(head_dim(model.config), layout=layout, scaling=known)
