"""``posenc extend``: stretch a trained RoPE model to N× its training length, zero-shot, fine-tuned and searched.

``config`` (presets, ``ExtendConfig``, the table's rows), ``plan`` (what a run reads, checked up front: which
split each stage uses), ``stages`` (the flow, per seed, and evaluation), ``searching`` (the LongRoPE search on dev
and its export), ``tuning`` (fine-tuning with a rate sweep chosen on dev, training from scratch), ``collect``
(intervals, paired comparisons, curves) and ``report`` (tables and files); every stage is resumable. It imports
the library, ``lm/``, ``extension/``, ``figures/`` and the shared ``experiments`` modules, and of the other
commands only ``extrapolate``'s public names (``run`` trains its base models, ``ExperimentConfig`` describes them).
"""

from .config import EXTEND_METHODS, PRESETS, ExtendConfig
from .stages import run

__all__ = ["EXTEND_METHODS", "PRESETS", "ExtendConfig", "run"]
