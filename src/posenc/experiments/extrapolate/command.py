"""``posenc extrapolate``'s command line: its flags, and the config overrides they give."""

from __future__ import annotations

import argparse

from ..arguments import add_run_folder, check_widenings, comma_ints, comma_positive_floats
from .config import PRESETS
from .rows import DEFAULT_ROWS, all_rows

#: flags that override the preset's config field of the same name
OVERRIDES = ("encodings", "train_length", "eval_factors", "eval_stride", "eval_windows", "steps", "batch_size", "lr",
             "lrs", "lr_widenings", "lr_sweep_seeds", "dim", "num_layers", "num_heads", "seeds", "seed", "device",
             "text", "compile", "compare")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="default", choices=sorted(PRESETS), help="model/training size (default: default)")
    p.add_argument("--encodings", default="default",
                   help=f"'all', 'default' ({', '.join(DEFAULT_ROWS)}) or a comma list of: {', '.join(all_rows())}")
    p.add_argument("--text", help="a text file or folder to use instead of the embedded stdlib corpus")
    add_run_folder(p, "%Y%m%d-%H%M%S", "<timestamp>")
    p.add_argument("--train-length", type=int, help="training window length in bytes")
    p.add_argument("--eval-factors", type=comma_ints, help="eval lengths as multiples of the train length (default 1,2,4,8)")
    p.add_argument("--eval-stride", type=int, help="sliding-window evaluation with this stride (default: non-overlapping)")
    p.add_argument("--eval-windows", type=int, help="number of longest-length windows in the eval span")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--batch-size", type=int, help="global batch size (split across DDP processes)")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--lrs", type=comma_positive_floats,
                   help="peak learning rates to choose from, per trained encoding and seed, by "
                        "the loss on dev windows (sequences) at the training length (default: --lr alone)")
    p.add_argument("--lr-widenings", type=int,
                   help="with --lrs: rates a row may add, a grid step at a time, past the grid's edge while its "
                        "best rate sits there (default 2)")
    p.add_argument("--lr-sweep-seeds", type=int, help="with --lrs: only the first K seeds sweep the grid; later seeds "
                   "train once, at the rate with the lowest mean dev loss over those K (default: every seed sweeps)")
    p.add_argument("--dim", type=int, help="model width")
    p.add_argument("--layers", dest="num_layers", type=int, help="transformer blocks")
    p.add_argument("--heads", dest="num_heads", type=int, help="attention heads")
    p.add_argument("--seeds", type=int, help="repeat with this many seeds and report mean ± std (default 1)")
    p.add_argument("--seed", type=int, help="first seed (default 0)")
    p.add_argument("--compare", help="the family of comparisons the run's verdicts will read, declared before it runs: "
                   "ROW:ROW@FACTOR (row a minus row b at that multiple of --train-length) or ROW:ROW (at every "
                   "one), comma-separated; paired over seeds (needs --seeds >= 2) and corrected together")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="auto: CUDA (bf16 autocast) when present")
    p.add_argument("--compile", action="store_true", default=None,
                   help="train under torch.compile(fullgraph=True); pays on a GPU, not on the 2-core CPU "
                        "(see benchmarks/history.md)")


def overrides(args: argparse.Namespace) -> dict:
    """The config fields the command line gives (None: the preset's)."""
    check_widenings(args)
    return {name: getattr(args, name) for name in OVERRIDES}
