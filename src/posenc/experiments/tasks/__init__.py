"""``posenc task copy|recall``: length generalisation on synthetic tasks, pass or fail.

Public: ``TaskConfig`` (presets, checked on construction), ``run`` (train every row at one length,
score exact match at each multiple of it, write results.json, results.md and tasks.png).
"""

from .config import PRESETS, TaskConfig, task_rows
from .stages import run

__all__ = ["PRESETS", "TaskConfig", "run", "task_rows"]
