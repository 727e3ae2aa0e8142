"""``posenc extend``'s command line: the run to extend, and a flag per ``ExtendConfig`` field that ``HELP``
describes, its type read from the field."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..arguments import add_config_flags, add_run_folder, comma_ints, given
from .config import EXTEND_METHODS, PRESETS, ExtendConfig

#: config field -> its flag's help; a field not named here is set by the presets alone
HELP = {
    "factor": "target length / training length (default 8)",
    "methods": f"comma list of: {', '.join(EXTEND_METHODS)} (default pi,ntk,yarn,longrope)",
    "finetune_steps": "fine-tuning steps at the target length (0: zero-shot only)",
    "finetune_warmup": "warm-up steps per fine-tune (default: the preset's share of --finetune-steps, a tenth for "
                       "default)",
    "finetune_batch": "windows per fine-tuning step",
    "finetune_lrs": "fine-tuning peak learning rates to sweep; each row keeps the one best on dev windows "
                    "(default 1e-4,3e-4,1e-3; one rate: no sweep)",
    "finetune_widenings": "rates a row may add, one grid step at a time, past the grid's edge while its best rate "
                          "sits there (default 2; 0: the grid as given)",
    "seeds": "repeat base models, search and fine-tuning with this many seeds (default 1)",
    "search_population": "LongRoPE search: candidates per generation (>= 4)",
    "search_generations": "LongRoPE search: generations",
    "search_windows": "LongRoPE search: dev windows scoring each candidate",
    "sweep_windows": "dev windows of the target length choosing the fine-tuning rate",
    "curve_windows": "test windows of the target length scored along fine-tuning",
    "from_scratch": "also train RoPE at the target length with the pretraining budget (the ceiling)",
    "eval_stride": "sliding-window evaluation with this stride (default: non-overlapping)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="default", choices=sorted(PRESETS), help="sizes (default: default)")
    p.add_argument("--run", "--run-dir", dest="run_dir", type=Path,
                   help="a finished posenc extrapolate run whose RoPE (and ALiBi) checkpoints to use "
                        "(under torchrun spell it --run-dir: torchrun reads --run as its own --run-path)")
    add_config_flags(p, ExtendConfig, HELP)
    p.add_argument("--only-seeds", type=comma_ints,
                   help="with --run: do only these of the --seeds seeds' stages and stop before the tables, so two "
                        "processes can share a run's seeds; then --resume without it writes the tables")
    p.add_argument("--text", help="a text file or folder instead of the embedded stdlib corpus (without --run)")
    add_run_folder(p, "extend-%Y%m%d-%H%M%S", "extend-<timestamp>")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="auto: CUDA when present (bf16 autocast)")


def config_of(args: argparse.Namespace) -> ExtendConfig:
    """The preset with the flags given; flags that span fields are checked here, before any work."""
    if args.run_dir is not None and args.text is not None:
        raise ValueError("--text trains new base models; with --run the run's own corpus is used")
    return ExtendConfig.from_preset(args.preset, **given(args, HELP))

