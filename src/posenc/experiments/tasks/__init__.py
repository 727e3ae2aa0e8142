"""``posenc task copy|recall``: length generalisation on synthetic tasks, pass or fail.

Public: ``TaskConfig`` (presets, checked on construction), ``run`` (train every row at one length,
score exact match at each multiple of it, write results.json, results.md and tasks.png).
"""

from .config import PRESETS, TASK_ROWS, TaskConfig
from .stages import run

__all__ = ["PRESETS", "TASK_ROWS", "TaskConfig", "run"]
