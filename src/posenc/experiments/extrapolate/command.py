"""``posenc extrapolate``'s command line: the preset, the text and the run folder, and a flag per
``ExperimentConfig`` field that ``HELP`` describes, its type read from the field."""

from __future__ import annotations

import argparse

from ..arguments import add_config_flags, add_run_folder, check_widenings, given
from ..tiny_lm import FLAGS, HELP as TRAINING_HELP
from .config import PRESETS, ExperimentConfig
from .rows import DEFAULT_ROWS, all_rows

#: config field -> its flag's help; a field not named here is set by the presets alone
HELP = {
    "encodings": "'all', 'default' ({default}) or a comma list of: {rows}",
    "text": "a text file or folder to use instead of the embedded stdlib corpus",
    "train_length": "training window length in bytes",
    "eval_factors": "eval lengths as multiples of the train length (default 1,2,4,8)",
    "eval_stride": "sliding-window evaluation with this stride (default: non-overlapping)",
    "eval_windows": "number of longest-length windows in the eval span",
    "batch_size": "global batch size (split across DDP processes)",
    **TRAINING_HELP,
    "seeds": "repeat with this many seeds and report mean ± std (default 1)",
    "compare": "the family of comparisons the run's verdicts will read, declared before it runs: ROW:ROW@FACTOR "
               "(row a minus row b at that multiple of --train-length) or ROW:ROW (at every one), comma-separated; "
               "paired over seeds (needs --seeds >= 2) and corrected together",
    "device": "auto (CUDA with bf16 autocast when present), cpu or cuda",
    "compile": "train under torch.compile(fullgraph=True); pays on a GPU, not on the 2-core CPU (see "
               "benchmarks/history.md)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="default", choices=sorted(PRESETS), help="model/training size (default: default)")
    rows = HELP["encodings"].format(default=", ".join(DEFAULT_ROWS), rows=", ".join(all_rows()))
    add_config_flags(p, ExperimentConfig, {**HELP, "encodings": rows}, FLAGS)
    add_run_folder(p, "%Y%m%d-%H%M%S", "<timestamp>")


def config_of(args: argparse.Namespace) -> ExperimentConfig:
    """The preset with the flags given."""
    check_widenings(args)
    return ExperimentConfig.from_preset(args.preset, **given(args, HELP))
