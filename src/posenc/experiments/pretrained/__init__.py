"""``posenc pretrained``: measure, adapt and export a pretrained Hugging Face RoPE model past its context.

``config`` (presets, ``PretrainedConfig``, its rows), ``measure`` (loading the model, long-document windows per
split, loss at every position in chunks, the sliding-context control), ``stages`` (fine-tuning, loss by position,
multi-key retrieval, an optional LongRoPE search, export; resumable per measurement), ``pins`` (what a run
folder pins, and when its family of comparisons was fixed), ``report`` (the results
dict, paired comparisons, tables and files). It imports the library,
``hf``, ``lm/``, ``extension/``, ``figures/`` and the shared ``experiments`` modules; no other command.
"""

from .config import HF_METHODS, HF_PRESETS, PretrainedConfig
from .stages import run

__all__ = ["HF_METHODS", "HF_PRESETS", "PretrainedConfig", "run"]
