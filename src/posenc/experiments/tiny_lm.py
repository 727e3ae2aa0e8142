"""What the two commands that train tiny byte LMs share (``posenc extrapolate``, ``posenc task``): the flags their
training fields go by and their help, and one check of those fields, so a bad value is refused alike by both,
naming its flag."""

from __future__ import annotations

from .. import checks
from .rate_grid import check_grid, sweeping_seeds

#: a training field -> the flag that sets it (a field missing here is set by the presets alone, named as itself)
FLAGS = {"dim": "--dim", "num_layers": "--layers", "num_heads": "--heads", "train_length": "--train-length",
         "batch_size": "--batch-size", "steps": "--steps", "seeds": "--seeds", "eval_windows": "--eval-windows"}
DEVICES = ("auto", "cpu", "cuda")
#: the training fields' help, for both commands' flags (``arguments.add_config_flags``)
HELP = {
    "steps": "training steps",
    "lr": "peak learning rate",
    "warmup": "steps of linear warm-up to the peak rate (default: the preset's share of --steps)",
    "lrs": "peak learning rates to choose from, per row and seed, by the loss on dev data at the training length "
           "(default: --lr alone)",
    "lr_widenings": "with --lrs: rates a row may add, a grid step at a time, past the grid's edge while its best "
                    "rate sits there (default 2)",
    "lr_sweep_seeds": "with --lrs: only the first K seeds sweep the grid; later seeds train once, at the rate with "
                      "the lowest mean dev loss over those K (default: every seed sweeps)",
    "dim": "model width",
    "num_layers": "transformer blocks",
    "num_heads": "attention heads",
    "seed": "first seed (default 0)",
}


def check_training(config, counts: tuple[str, ...] = ()) -> None:
    """A ValueError naming the flag of the first bad training field of ``config`` (an ``ExperimentConfig`` or a
    ``TaskConfig``): the model's sizes, the training's length, batch, steps and seeds, and ``counts`` (the command's
    own) integers >= 1; warm-up >= 0; a rate > 0, a grid of rates without repeats, widenings >= 0, sweeping seeds
    among the seeds; evaluation factors integers >= 1; a known device."""
    for name in ("dim", "num_layers", "num_heads", "train_length", "batch_size", "steps", *counts, "seeds"):
        checks.positive_int(FLAGS.get(name, name), getattr(config, name))
    if config.dim % config.num_heads or (config.dim // config.num_heads) % 2:  # RoPE turns channel pairs
        raise ValueError(f"--dim ({config.dim}) must be --heads ({config.num_heads}) times an even head width, got "
                         f"{config.dim / config.num_heads:g} per head")
    checks.positive_int("--warmup", config.warmup, minimum=0)
    if checks.positive_int("--seed", config.seed, minimum=0) + config.seeds > 2 ** 63:  # torch.manual_seed's range
        raise ValueError(f"--seed must be at most 2^63 - --seeds = {2 ** 63 - config.seeds}, got {config.seed}")
    if config.warmup > config.steps:  # the rate would never reach --lr
        raise ValueError(f"--warmup ({config.warmup}) must be at most --steps ({config.steps})")
    checks.positive_float("--lr", config.lr)
    if config.lrs:
        check_grid("--lrs", config.lrs)
    checks.positive_int("--lr-widenings", config.lr_widenings, minimum=0)
    sweeping_seeds(config.seed, config.seeds, config.lr_sweep_seeds, config.lrs)
    if not config.eval_factors or any(not isinstance(f, int) or f < 1 for f in config.eval_factors):
        raise ValueError(f"--eval-factors must be integers >= 1, got {','.join(map(str, config.eval_factors))}")
    checks.each_once("--eval-factors", config.eval_factors)
    checks.choice("--device", config.device, DEVICES)
