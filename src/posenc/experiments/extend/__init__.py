"""``posenc extend``: stretch a trained RoPE model to N× its training length, zero-shot, fine-tuned and searched.

``config`` (presets, ``ExtendConfig``, the table's rows), ``stages`` (base models, LongRoPE search, fine-tuning,
evaluation; each resumable), ``report`` (tables and files). It imports the library, ``lm/``, ``extension/``,
``figures/`` and the shared ``experiments`` modules, and of the other commands only ``extrapolate``'s public
names (``run`` trains its base models, ``ExperimentConfig`` describes them).
"""

from .config import EXTEND_METHODS, PRESETS, ExtendConfig
from .stages import run

__all__ = ["EXTEND_METHODS", "PRESETS", "ExtendConfig", "run"]
