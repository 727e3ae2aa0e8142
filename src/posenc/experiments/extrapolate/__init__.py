"""``posenc extrapolate``: train a tiny byte LM per encoding at one length, score it at 1×…8× that length.

``config`` (presets, ``ExperimentConfig``), ``rows`` (which checkpoint each table row reads and how its
encoding changes at evaluation), ``stages`` (train, evaluate, collect; resumable), ``report`` (tables and
files), ``checkpoints`` (reading a finished run for ``posenc plot``). It imports the library, ``lm/``,
``extension/`` and ``figures/``, and the shared ``experiments`` modules; no other command. The names below
are its public face: ``posenc extend`` trains its base models through ``run``.
"""

from .checkpoints import attention_window, trained_models
from .config import PRESETS, ExperimentConfig
from .rows import DEFAULT_ROWS, all_rows
from .stages import run

__all__ = ["DEFAULT_ROWS", "PRESETS", "ExperimentConfig", "all_rows", "attention_window", "run", "trained_models"]
