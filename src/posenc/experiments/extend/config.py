"""What ``posenc extend`` runs: its presets, its config (checked on construction) and its rows.

Rows: plain RoPE and each method zero-shot; with fine-tuning steps, each of them fine-tuned,
plain RoPE fine-tuned without scaling being the control (what fine-tuning alone buys); ALiBi
zero-shot and fine-tuned when the base run has ALiBi; optionally RoPE trained from scratch at
the target length on the pretraining plus fine-tuning tokens (the ceiling).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ... import checks
from ...extension.methods import having, parse_methods
from .. import extrapolate
from ..rate_grid import check_grid
from ..presets import preset_values, warmup_share

EXTEND_METHODS = having(lambda m: not m.for_long_originals)  # the tiny LMs' contexts are tens of tokens

PRESETS: dict[str, dict] = {
    # Tests and CI: well under a minute on 2 cores.
    "smoke": dict(base="smoke", finetune_steps=8, finetune_batch=4, finetune_lrs=(3e-4, 2e-3), finetune_widenings=1,
                  finetune_warmup=2,
                  search_population=6, search_generations=2, search_parents=2, search_windows=2, sweep_windows=4,
                  curve_windows=4),
    "default": {},  # ExtendConfig's own defaults
    "gpu": dict(base="gpu", finetune_steps=400, finetune_batch=16, finetune_lrs=(1e-4, 3e-4, 1e-3),
                finetune_warmup=40, search_population=32, search_generations=16, search_parents=8, search_windows=16,
                sweep_windows=128, curve_windows=128, from_scratch=True),
}


@dataclass(frozen=True)
class ExtendConfig:
    """What ``posenc extend`` runs, checked on construction. Its field defaults are the default preset: on the 2-core
    CPU, fine-tuning sees ~13% of the pretraining tokens, at the best of three rates."""

    preset: str = "default"
    factor: float = 8.0
    methods: tuple[str, ...] = ("pi", "ntk", "dynamic", "yarn", "longrope")
    finetune_steps: int = 80
    finetune_batch: int = 4
    finetune_lrs: tuple[float, ...] = (1e-4, 3e-4, 1e-3)  # each fine-tuned row keeps the rate best on dev
    finetune_widenings: int = 2  # rates a row may add past the grid's edge while its best rate sits there
    finetune_warmup: int = 8  # a --finetune-steps given without it keeps the preset's fraction of the steps
    search_population: int = 24
    search_generations: int = 16
    search_parents: int = 6
    search_windows: int = 8  # dev windows of the target length scoring each LongRoPE candidate
    sweep_windows: int = 64  # dev windows of the target length choosing each row's fine-tuning rate
    curve_windows: int = 64  # test windows of the target length scored along the fine-tuning curve
    seeds: int = 1  # base models, LongRoPE search and fine-tuning order, each repeated per seed
    from_scratch: bool = False  # the ceiling: RoPE trained at the target length on pretraining + fine-tuning tokens
    eval_stride: int | None = None
    base: str = "default"  # the extrapolate preset that trains the base models when no --run is given

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> "ExtendConfig":
        values = preset_values(PRESETS, preset, overrides)
        values.update(warmup_share(cls, PRESETS[preset], overrides, "finetune_steps", "finetune_warmup"))
        if isinstance(values.get("methods"), str):
            values["methods"] = parse_methods(values["methods"], EXTEND_METHODS)
        if "finetune_lrs" in values:
            values["finetune_lrs"] = tuple(values["finetune_lrs"])
        return cls(preset=preset, **values)

    def __post_init__(self):
        factor = self.factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor < 1:
            raise ValueError(f"--factor must be a finite number >= 1, got {factor!r}")
        parse_methods(self.methods, EXTEND_METHODS)
        checks.positive_int("--finetune-steps", self.finetune_steps, minimum=0)
        checks.positive_int("--finetune-batch", self.finetune_batch)
        check_grid("--finetune-lrs", self.finetune_lrs)
        checks.positive_int("--finetune-widenings", self.finetune_widenings, minimum=0)
        checks.positive_int("--finetune-warmup", self.finetune_warmup, minimum=0)
        if self.finetune_warmup > self.finetune_steps:
            raise ValueError(f"--finetune-warmup ({self.finetune_warmup}) must be at most --finetune-steps "
                             f"({self.finetune_steps})")
        checks.positive_int("--search-population", self.search_population, minimum=4)
        checks.positive_int("--search-generations", self.search_generations)
        for name in ("--search-windows", "--sweep-windows", "--curve-windows", "--seeds"):
            checks.positive_int(name, getattr(self, name.lstrip("-").replace("-", "_")))
        checks.positive_int("search_parents", self.search_parents, minimum=2)
        if self.search_parents >= self.search_population:
            raise ValueError(f"search_parents ({self.search_parents}) must be below --search-population "
                             f"({self.search_population})")
        if self.eval_stride is not None:
            checks.positive_int("--eval-stride", self.eval_stride)
        checks.choice("base preset", self.base, tuple(extrapolate.PRESETS))

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "methods": list(self.methods), "finetune_lrs": list(self.finetune_lrs)}

    def target_length(self, train_length: int) -> int:
        target = train_length * self.factor
        if abs(target - round(target)) > 1e-9:
            raise ValueError(f"--factor {self.factor} × the training length {train_length} = {target} is not a whole "
                             "number of tokens; choose a factor that gives one")
        return int(round(target))


# Changing any of these changes a result; methods, seeds, --from-scratch and the device may change on --resume.
RESULT_FIELDS = ("factor", "finetune_steps", "finetune_batch", "finetune_lrs", "finetune_widenings", "finetune_warmup",
                 "search_population", "search_generations", "search_parents", "search_windows", "sweep_windows",
                 "curve_windows", "eval_stride")


@dataclass(frozen=True)
class ExtendRow:
    name: str
    trains: str  # "rope" or "alibi": which base checkpoint it starts from
    method: str  # "rope" (no scaling), a method, "alibi", or "scratch"
    stage: str  # "zero-shot", "fine-tuned" or "from scratch"

    @property
    def slug(self) -> str:
        return self.name.replace(" ", "-")


def make_rows(config: ExtendConfig, has_alibi: bool) -> list[ExtendRow]:
    rows = [ExtendRow("rope", "rope", "rope", "zero-shot")]
    rows += [ExtendRow(f"rope+{m}", "rope", m, "zero-shot") for m in config.methods]
    if config.finetune_steps:
        rows.append(ExtendRow("rope fine-tuned", "rope", "rope", "fine-tuned"))  # the control: no scaling
        rows += [ExtendRow(f"rope+{m} fine-tuned", "rope", m, "fine-tuned") for m in config.methods]
    if has_alibi:
        rows.append(ExtendRow("alibi", "alibi", "alibi", "zero-shot"))
        if config.finetune_steps:
            rows.append(ExtendRow("alibi fine-tuned", "alibi", "alibi", "fine-tuned"))
    if config.from_scratch:
        rows.append(ExtendRow("rope trained at target", "rope", "scratch", "from scratch"))
    return rows
