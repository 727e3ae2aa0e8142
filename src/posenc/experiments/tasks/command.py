"""``posenc task``'s command line (formerly ``posenc extrapolate --task copy|recall``): the task, and a flag per
``TaskConfig`` field that ``HELP`` describes, its type read from the field.

``posenc extrapolate --task copy ...`` still works: ``cli`` rewrites it to ``posenc task copy ...`` with a one-line
notice (and drops ``--task lm``, which is ``extrapolate`` itself)."""

from __future__ import annotations

import argparse

from ...lm.tasks import TASKS
from ..arguments import add_config_flags, add_run_folder, check_widenings, given
from ..tiny_lm import FLAGS, HELP as TRAINING_HELP
from .config import PRESETS, TaskConfig, task_rows

#: config field -> its flag's help; a field not named here is set by the presets alone
HELP = {
    "encodings": "rows, comma-separated: encoding names or layouts, each optionally +randomized (trained at "
                 "randomized positions), or 'all' (default: {rows})",
    "train_length": "training sequence length in tokens",
    "eval_factors": "evaluation lengths as multiples of --train-length (default 1,2,4,8)",
    "batch_size": "sequences per step",
    **TRAINING_HELP,
    "seeds": "repeat with this many seeds (default 1)",
    "device": "auto (CUDA when present), cpu or cuda",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", choices=sorted(TASKS), help="copy: repeat the sequence; recall: the value of an asked key")
    p.add_argument("--preset", default="default", choices=sorted(PRESETS), help="model/training size (default: "
                                                                                "default)")
    add_config_flags(p, TaskConfig, {**HELP, "encodings": HELP["encodings"].format(rows=", ".join(task_rows()))},
                     FLAGS)
    add_run_folder(p, "{task}-%Y%m%d-%H%M%S", "<task>-<timestamp>")


def config_of(args: argparse.Namespace) -> TaskConfig:
    """The task's preset with the flags given (``--encodings all``, or ``default`` as ``extrapolate --task`` took
    it: every row, the default)."""
    check_widenings(args)
    overrides = given(args, HELP)
    if overrides.get("encodings") in ("all", "default"):
        del overrides["encodings"]
    return TaskConfig.from_preset(args.task, args.preset, **overrides)

