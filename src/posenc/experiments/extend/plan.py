"""What one ``posenc extend`` invocation works on, checked before any training: the base run, the corpus and
the windows each stage reads.

Which split each stage reads: fine-tuning draws its batches from train; the LongRoPE search scores candidates
on dev windows and each row's fine-tuning rate is chosen on dev windows; the table and the fine-tuning curves
are scored on test windows. Nothing is tuned on test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ...lm.data import Corpus, Windows, load_corpus, sample_windows
from ...lm.model import LanguageModel, ModelConfig
from .. import pinning
from ..extrapolate import ExperimentConfig
from .config import RESULT_FIELDS, ExtendConfig, ExtendRow, make_rows


@dataclass
class Plan:
    config: ExtendConfig
    base: ExperimentConfig
    run_dir: Path
    out: Path
    corpus: Corpus
    target: int
    eval_lengths: list[int]
    rows: list[ExtendRow]
    has_alibi: bool

    @property
    def seeds(self) -> list[int]:
        return list(range(self.base.seed, self.base.seed + self.config.seeds))

    def checkpoint(self, encoding: str, seed: int) -> Path:
        return self.run_dir / "checkpoints" / f"{encoding}-seed{seed}" / "model.safetensors"

    @property
    def window_length(self) -> int:
        return math.lcm(*self.eval_lengths)

    @property
    def eval_tag(self) -> str:
        stride = "nonoverlap" if self.config.eval_stride is None else f"stride{self.config.eval_stride}"
        return f"{'-'.join(map(str, self.eval_lengths))}x{self.base.eval_windows}-{stride}"

    def report_windows(self) -> Windows:
        """Test windows every row is scored on, at every length."""
        return sample_windows(self.corpus.test, self.window_length, self.base.eval_windows)

    def curve_windows(self) -> Windows:
        """Test windows of the target length, scored along each fine-tuning curve."""
        return sample_windows(self.corpus.test, self.target, self.config.curve_windows)

    def search_windows(self) -> Windows:
        """Dev windows of the target length scoring each LongRoPE candidate."""
        return sample_windows(self.corpus.dev, self.target, self.config.search_windows)

    def sweep_windows(self) -> Windows:
        """Dev windows of the target length on which each row's fine-tuning rate is chosen."""
        return sample_windows(self.corpus.dev, self.target, self.config.sweep_windows)

    def model_config(self, encoding: str, scaling: dict | None = None, max_positions: int | None = None
                     ) -> ModelConfig:
        return ModelConfig(encoding=encoding, encoding_kwargs={"scaling": scaling} if scaling else {},
                           dim=self.base.dim, num_layers=self.base.num_layers, num_heads=self.base.num_heads,
                           max_positions=max_positions or self.base.train_length)


def plan(config: ExtendConfig, out: Path, *, run: Path | None = None, text: str | None = None,
         device: str | None = None) -> Plan:
    """Check everything that can be checked before any training; raises ValueError with the way out."""
    if run is not None:
        base, has_alibi = _read_run(Path(run), config, device)
        run_dir = Path(run)
    else:
        base = ExperimentConfig.from_preset(config.base, encodings="rope,alibi", text=text, device=device,
                                            seeds=config.seeds)
        run_dir, has_alibi = out / "base", True
    target = config.target_length(base.train_length)
    lengths = sorted(set(base.eval_lengths) | {target})
    if math.lcm(*lengths) > 4 * max(lengths):
        raise ValueError(f"the eval lengths {lengths} share no evaluation window of a sensible size (their least "
                         f"common multiple is {math.lcm(*lengths)}); choose a --factor whose target length is a "
                         "multiple or a divisor of the others")
    corpus = load_corpus(base.text, train_length=base.train_length, window=math.lcm(*lengths),
                         windows=base.eval_windows, shorter="a smaller --factor")  # the windows are the base run's
    for split, need, what in ((corpus.dev, target + 1, "the LongRoPE search and the rate sweep"),
                              (corpus.train, 4 * (target + 1), "fine-tuning")):
        if len(split) < need:
            name = "dev" if split is corpus.dev else "train"
            raise ValueError(f"corpus too small: the {name} split has {len(split):,} tokens, {what} at {target} "
                             f"needs at least {need:,}; use more text or a smaller --factor")
    for encoding in ("rope", "alibi") if has_alibi else ("rope",):  # sizes the encodings reject fail here
        LanguageModel(ModelConfig(encoding=encoding, dim=base.dim, num_layers=base.num_layers,
                                  num_heads=base.num_heads, max_positions=base.train_length))
    return Plan(config, base, run_dir, out, corpus, target, lengths, make_rows(config, has_alibi), has_alibi)


def _read_run(run: Path, config: ExtendConfig, device: str | None) -> tuple[ExperimentConfig, bool]:
    held = pinning.read_run(run, "extrapolate", "--run")
    base = ExperimentConfig.from_dict({**held, **({"device": device} if device else {})})
    folder = run / "checkpoints"
    have = sorted(p.name for p in folder.iterdir() if (p / "model.safetensors").exists()) if folder.exists() else []
    seeds = range(base.seed, base.seed + config.seeds)
    missing = [f"rope-seed{s}" for s in seeds if f"rope-seed{s}" not in have]
    if missing:
        raise ValueError(f"--run {run} has no finished RoPE checkpoint for {', '.join(missing)} (checkpoints/<name>/"
                         f"model.safetensors); it has: {', '.join(have) or 'no finished checkpoints'}. Train one with: "
                         f"posenc extrapolate --resume --out {run} --encodings rope --seeds {config.seeds}")
    return base, all(f"alibi-seed{s}" in have for s in seeds)


def pin_config(out: Path, config: ExtendConfig, base: ExperimentConfig, run: Path | None, resume: bool) -> None:
    """Write config.json, or on --resume refuse a config that would change a finished result."""
    current = {"extend": config.to_dict(), "base": base.training_dict(), "run": str(run) if run else None}
    held = pinning.open_pin(out, resume, kind="extend", start=f"posenc extend --out {out}")
    if held is None:
        pinning.write_pin(out, current)
        return
    changed = pinning.changed_fields(current["extend"], held["extend"], "extend", sorted(RESULT_FIELDS))
    changed += ["base model"] if pinning.changed_fields(current["base"], held["base"], "extrapolate") else []
    changed += ["--run"] if held["run"] != current["run"] else []
    pinning.refuse_changes(out, changed, may_change="--methods, --seeds, --from-scratch and --device")
