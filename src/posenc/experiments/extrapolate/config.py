"""What ``posenc extrapolate`` runs: its presets and its config, checked on construction.

``TRAINING_FIELDS`` are the fields a checkpoint depends on: a resumed run must keep them,
while rows, seeds, evaluation lengths and protocol may change between ``--resume`` calls.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ... import checks
from ...lm.layouts import LAYOUTS
from ...lm.model import ModelConfig
from ..pinning import WHEN_ABSENT, as_current
from ..presets import preset_values, warmup_share
from ..rate_grid import sweeping_seeds
from ..tiny_lm import check_training
from ..verdicts import expand_family, parse_family
from .rows import Row, parse_rows

PRESETS: dict[str, dict] = {
    # CI and tests: seconds on 2 cores.
    "smoke": dict(dim=32, num_layers=1, num_heads=2, train_length=16, batch_size=8, steps=20, lr=3e-3,
                  warmup=5, eval_windows=4, checkpoint_every=5),
    # make run: the config's own defaults (ExperimentConfig below)
    "default": {},
    # A GPU: a bigger model, longer training and windows.
    "gpu": dict(dim=512, num_layers=8, num_heads=8, train_length=256, batch_size=64, steps=4000, lr=1e-3,
                warmup=200, eval_windows=640),
}


@dataclass(frozen=True)
class ExperimentConfig:
    """What ``posenc extrapolate`` trains and evaluates, checked on construction. Its field defaults are the default
    preset: minutes on a 2-core laptop CPU; 480 test windows of 512 bytes, ~40% of the test split; the rate 4e-3,
    the one every encoding tried chose on dev (--lrs; docs/extrapolate.md)."""

    preset: str = "default"
    encodings: str = "default"
    dim: int = 128
    num_layers: int = 4
    num_heads: int = 4
    train_length: int = 64
    batch_size: int = 32
    steps: int = 600
    lr: float = 4e-3
    lrs: tuple[float, ...] = ()  # a grid: each trained encoding and seed trains at each rate, keeps the best on dev
    lr_widenings: int = 2  # rates the grid may add past its edge while an encoding's best rate sits there
    lr_sweep_seeds: int = 0  # seeds that sweep the grid (0: every seed); later ones inherit (rate_grid.inherit_rate)
    warmup: int = 50
    eval_windows: int = 480  # windows of the longest length, a seeded sample stratified over the test files
    eval_factors: tuple[int, ...] = (1, 2, 4, 8)
    eval_stride: int | None = None
    seeds: int = 1
    seed: int = 0
    device: str = "auto"
    text: str | None = None
    checkpoint_every: int = 100
    compile: bool = False  # torch.compile the training forward pass; speed only, not a training field
    compare: str = ""  # the family of comparisons, declared before the run (verdicts.parse_family): "a:b@8,…"

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> "ExperimentConfig":
        values = preset_values(PRESETS, preset, overrides)
        values.update(warmup_share(cls, PRESETS[preset], overrides))
        if "lrs" in values:
            values["lrs"] = tuple(values["lrs"])
        return cls(preset=preset, **values)

    @classmethod
    def from_dict(cls, values: dict) -> "ExperimentConfig":
        """The inverse of to_dict (e.g. a run directory's config.json, read as the current version reads it)."""
        values = as_current(values, "extrapolate")
        for name in ("eval_factors", "lrs"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)

    def __post_init__(self):
        check_training(self, counts=("eval_windows",))
        if self.eval_stride is not None:
            checks.positive_int("--eval-stride", self.eval_stride)
        if self.window_length > 4 * max(self.eval_lengths):
            raise ValueError(f"eval_factors {self.eval_factors}: evaluation windows must hold a whole number of every "
                             f"eval length, here {self.window_length} bytes; choose factors that divide the largest")
        parse_rows(self.encodings)  # unknown names fail here, before anything runs
        if self.compare:
            self.family  # so does a comparison of rows or lengths the run does not have
            if self.seeds < 2:
                raise ValueError(f"--compare pairs rows over seeds: it needs --seeds >= 2, got {self.seeds}")

    @property
    def sweep_seeds(self) -> range:
        """The seeds that sweep the rate grid (``rate_grid.sweeping_seeds``)."""
        return sweeping_seeds(self.seed, self.seeds, self.lr_sweep_seeds, self.lrs)

    @property
    def family(self) -> list[dict]:
        """The declared comparisons, one per length: [{"a", "b", "factor"}, …] (``verdicts.expand_family``)."""
        names = [row.name for row in parse_rows(self.encodings)]
        return expand_family(parse_family(self.compare), names, self.eval_factors)

    @property
    def eval_lengths(self) -> list[int]:
        return [self.train_length * f for f in sorted(set(self.eval_factors))]

    @property
    def window_length(self) -> int:
        """The length of each evaluation window: the least common multiple of the eval lengths."""
        return math.lcm(*self.eval_lengths)

    def model_config(self, row: Row, kwargs: dict) -> ModelConfig:
        """The model of ``row`` with its encoding's ``kwargs`` (a layout's: its global layers'); local layers span
        a quarter of the training length."""
        if row.layout is None:
            encoding, layers = row.trains, ()
        else:
            layout = LAYOUTS[row.layout]
            encoding, kwargs = layout.global_encoding, {**layout.global_kwargs, **kwargs}
            layers = layout.layers(self.num_layers, max(1, self.train_length // 4))
        return ModelConfig(encoding=encoding, encoding_kwargs=kwargs, dim=self.dim, num_layers=self.num_layers,
                           num_heads=self.num_heads, max_positions=self.train_length, layers=layers)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "eval_factors": list(self.eval_factors), "lrs": list(self.lrs)}

    def training_dict(self) -> dict:
        """The fields a checkpoint depends on: a resumed run must keep them. A field at the value its absence
        means (``pinning.WHEN_ABSENT``) is left out, so the dict equals one written before the field existed (extend
        pins it, and its LongRoPE search logs hold it)."""
        values, absent = self.to_dict(), WHEN_ABSENT["extrapolate"]
        return {name: values[name] for name in TRAINING_FIELDS if name not in absent or values[name] != absent[name]}

    @property
    def dev_windows(self) -> int:
        """Dev windows of the training length that choose a rate: as many bytes as the test windows hold."""
        return self.eval_windows * (self.window_length // self.train_length)

    @property
    def eval_tag(self) -> str:
        """Names evaluation files by protocol, so a resumed run may change how it evaluates."""
        stride = "nonoverlap" if self.eval_stride is None else f"stride{self.eval_stride}"
        return f"{'-'.join(map(str, self.eval_lengths))}x{self.eval_windows}-{stride}"


# Changing any of these changes what a checkpoint is; everything else (rows, seeds,
# eval lengths, protocol, windows, device) may change between --resume calls.
TRAINING_FIELDS = ("dim", "num_layers", "num_heads", "train_length", "batch_size", "steps", "lr", "lrs",
                   "lr_widenings", "lr_sweep_seeds", "warmup", "text", "checkpoint_every")
