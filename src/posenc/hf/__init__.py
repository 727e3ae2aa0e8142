"""Bridge to Hugging Face ``transformers`` RoPE models: load, rescale, export (extra ``posenc[hf]``).

The whole bridge lives in ``loading`` for now (it was ``hf.py``); this package re-exports its public names
(``hf.load``, ``hf.SUPPORTED``), so a test that patches one patches ``hf.loading``, the module that reads it.
``hf`` imports the library (``checks``, ``storage``, ``kernels``, ``encodings``), never ``figures``,
``experiments`` or the CLI, which use it.
"""

from __future__ import annotations

from .loading import (FAMILY_ROPE_TYPES, GEMMA3_PARTS, GEMMA3_SHA256, GLOBAL_LAYERS, INSTALL_GEMMA3, INSTALL_SMOLLM2,
                      INTERLEAVED, NEEDS_ORIGINAL, OTHER_SCHEMES, ROPE_ONLY_ON, SMOLLM2_FILE, SMOLLM2_PACKAGE,
                      SMOLLM2_SHA256, SUPPORTED, apply_scaling, check_export_folder, check_supported, export,
                      full_rope_parameters, gemma3_path, head_dim, layer_encoding, layer_mask, layer_positions,
                      layer_types, load, model_provenance, model_rope_parameters, original_context, rope_encoding,
                      smollm2_path)

__all__ = ["FAMILY_ROPE_TYPES", "GEMMA3_PARTS", "GEMMA3_SHA256", "GLOBAL_LAYERS", "INSTALL_GEMMA3",
           "INSTALL_SMOLLM2", "INTERLEAVED", "NEEDS_ORIGINAL", "OTHER_SCHEMES", "ROPE_ONLY_ON", "SMOLLM2_FILE",
           "SMOLLM2_PACKAGE", "SMOLLM2_SHA256", "SUPPORTED", "apply_scaling", "check_export_folder",
           "check_supported", "export", "full_rope_parameters", "gemma3_path", "head_dim", "layer_encoding",
           "layer_mask", "layer_positions", "layer_types", "load", "model_provenance", "model_rope_parameters",
           "original_context", "rope_encoding", "smollm2_path"]
