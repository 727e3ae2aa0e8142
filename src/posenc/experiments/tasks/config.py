"""What ``posenc task`` runs: presets, rows and the config, checked on construction.

A row is an encoding name or a layout of ``lm.layouts`` (layers that mix schemes; local layers span a quarter of
the training length), optionally with ``+randomized``: the same model trained on randomized positions (a sorted
random subset of [0, longest eval length) per sequence; Ruoss et al. 2023) and tested on plain positions.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ... import checks
from ...encodings import RoPE
from ...encodings.registry import name_of, one_axis
from ...lm.layouts import LAYOUTS
from ...lm.model import ModelConfig
from ...lm.tasks import TASKS, CopyTask, RecallTask
from ..presets import preset_values, warmup_share
from ..rate_grid import sweeping_seeds
from ..tiny_lm import check_training

TEST_SEED = 1_000_003  # test sequences: a generator seeded by this plus the length
DEV_SEED = 2_000_003  # dev sequences, likewise
SPLIT_SEEDS = {"dev": DEV_SEED, "test": TEST_SEED}

RANDOMIZED = "+randomized"


def task_rows() -> tuple[str, ...]:
    """A row per encoding the tiny LM trains, and RoPE trained at randomized positions (the default rows)."""
    return (*one_axis(), name_of(RoPE) + RANDOMIZED)


PRESETS: dict[str, dict] = {
    # tests: seconds
    "smoke": dict(dim=32, num_layers=1, num_heads=2, train_length=8, batch_size=16, steps=20, lr=3e-3, warmup=5,
                  eval_sequences=32),
    # the 2-core CPU: about a minute of training per row (copy; recall below)
    "default": {},  # TaskConfig's own defaults
    # a GPU: a bigger model, more steps
    "gpu": dict(dim=256, num_layers=4, num_heads=8, train_length=64, batch_size=128, steps=5000, lr=1e-3,
                warmup=300, eval_sequences=1024),
}
#: recall learns slowly (an induction circuit over many keys): the default preset trains it on shorter
#: sequences (4 pairs, every one asked) for twice the steps, in the same minute
TASK_PRESETS = {("recall", "default"): dict(train_length=16, steps=4000)}


@dataclass(frozen=True)
class TaskConfig:
    task: str = "copy"
    preset: str = "default"
    encodings: str = field(default_factory=lambda: ",".join(task_rows()))
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 4
    train_length: int = 32
    batch_size: int = 64
    steps: int = 2000
    lr: float = 3e-3
    lrs: tuple[float, ...] = ()  # a grid: each row and seed trains at each rate and keeps the one best on dev
    lr_widenings: int = 2  # rates the grid may add past its edge while a row's best rate sits there
    lr_sweep_seeds: int = 0  # seeds that sweep the grid (0: every seed); later ones inherit (rate_grid.inherit_rate)
    warmup: int = 100
    eval_sequences: int = 256
    eval_factors: tuple[int, ...] = (1, 2, 4, 8)
    seeds: int = 1
    seed: int = 0
    device: str = "auto"
    checkpoint_every: int = 200

    @classmethod
    def from_preset(cls, task: str, preset: str, **overrides) -> "TaskConfig":
        checks.choice("preset", preset, tuple(PRESETS))
        presets = {preset: {**PRESETS[preset], **TASK_PRESETS.get((task, preset), {})}}
        values = preset_values(presets, preset, overrides)
        values.update(warmup_share(cls, presets[preset], overrides))
        if "lrs" in values:
            values["lrs"] = tuple(values["lrs"])
        return cls(task=task, preset=preset, **values)

    def __post_init__(self):
        checks.choice("task", self.task, tuple(TASKS))
        check_training(self, counts=("eval_sequences",))
        for length in self.eval_lengths:
            self.task_spec.check_length(length)
        self.rows  # unknown names fail here

    @property
    def sweep_seeds(self) -> range:
        """The seeds that sweep the rate grid (``rate_grid.sweeping_seeds``)."""
        return sweeping_seeds(self.seed, self.seeds, self.lr_sweep_seeds, self.lrs)

    @property
    def eval_lengths(self) -> list[int]:
        return [self.train_length * f for f in sorted(set(self.eval_factors))]

    @property
    def task_spec(self) -> CopyTask | RecallTask:
        """The task, sized so that its longest evaluation still fits (recall: a distinct key per pair)."""
        if self.task == "recall":
            return RecallTask(keys=max(16, RecallTask().pairs(max(self.eval_lengths))))  # a key per pair at 8×
        return CopyTask()

    @property
    def rows(self) -> list[tuple[str, str, bool]]:
        """(row name, encoding, randomized positions) in the order given."""
        rows = []
        for name in (part.strip() for part in self.encodings.split(",") if part.strip()):
            encoding = name.removesuffix(RANDOMIZED)
            if encoding in one_axis() and encoding in LAYOUTS:
                raise ValueError(f"encoding {encoding!r} has a layout's name (lm.layouts.LAYOUTS); register it as "
                                 "another")
            if encoding not in one_axis() and encoding not in LAYOUTS:
                raise ValueError(f"--encodings: unknown row {name!r}; valid: encodings {', '.join(one_axis())} and "
                                 f"layouts {', '.join(LAYOUTS)}, each optionally with {RANDOMIZED}")
            rows.append((name, encoding, name.endswith(RANDOMIZED)))
        checks.each_once("--encodings", [name for name, _, _ in rows])
        if not rows:
            raise ValueError("--encodings names no row")
        return rows

    def model_config(self, encoding: str, randomized: bool) -> ModelConfig:
        """The model of a row's ``encoding`` (an encoding's name or a layout's)."""
        longest = max(self.eval_lengths)
        kwargs, layers = {}, ()
        if encoding in LAYOUTS:
            layout = LAYOUTS[encoding]
            encoding, kwargs = layout.global_encoding, layout.global_kwargs
            layers = layout.layers(self.num_layers, max(1, self.train_length // 4))
        return ModelConfig(encoding=encoding, encoding_kwargs=kwargs, layers=layers, dim=self.dim,
                           num_layers=self.num_layers, num_heads=self.num_heads, vocab_size=self.task_spec.vocab_size,
                           max_positions=longest if randomized else self.train_length, backend="auto")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "eval_factors": list(self.eval_factors), "lrs": list(self.lrs)}
