"""``posenc extend --hf``: measure a pretrained Hugging Face RoPE model past its context, per scaling.

``config`` (presets, ``PretrainedConfig``), ``measure`` (loading the model and its text, each method's
rope_parameters, loss at every position in chunks), ``stages`` (loss by position, passkey retrieval, an optional
LongRoPE search, export; resumable per measurement), ``report`` (tables and files). It imports the library,
``hf``, ``lm/``, ``extension/``, ``figures/`` and the shared ``experiments`` modules; no other command.
"""

from .config import HF_METHODS, HF_PRESETS, PretrainedConfig
from .stages import run

__all__ = ["HF_METHODS", "HF_PRESETS", "PretrainedConfig", "run"]
