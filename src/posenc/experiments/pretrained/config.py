"""What ``posenc extend --hf`` runs: its presets and its config, checked on construction."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ... import checks
from ...extension.methods import parse_methods
from ..presets import preset_values

HF_METHODS = ("none", "pi", "ntk", "dynamic", "yarn", "llama3", "longrope")

HF_PRESETS: dict[str, dict] = {
    # A tiny random Llama built offline, byte tokens: seconds. Its answers are noise; it tests the plumbing.
    "smoke": dict(model="tiny", to=512, lengths=(64, 128, 256, 512), methods=("none", "pi", "ntk", "dynamic", "yarn"),
                  passkey_lengths=(320, 512), passkey_depths=(0.25, 0.75), passkey_trials=1, bins=8, chunk=64),
    # SmolLM2-135M on the 2-core CPU: 2× its 8k context.
    "default": dict(model="smollm2", to=16384, lengths=(4096, 8192, 12288, 16384),
                    methods=("none", "pi", "ntk", "dynamic", "yarn"), passkey_lengths=(4096, 10240),
                    passkey_depths=(0.2, 0.8), passkey_trials=1, bins=32, chunk=2048),
    # A GPU: 4× the context, the full grid and a LongRoPE search.
    "gpu": dict(model="smollm2", to=32768, lengths=(4096, 8192, 16384, 24576, 32768),
                methods=("none", "pi", "ntk", "dynamic", "yarn", "llama3", "longrope"),
                passkey_lengths=(4096, 8192, 16384, 24576, 32768), passkey_depths=(0.1, 0.3, 0.5, 0.7, 0.9),
                passkey_trials=3, bins=64, chunk=4096, search_population=16, search_generations=8),
}


@dataclass(frozen=True)
class PretrainedConfig:
    preset: str = "default"
    model: str = "smollm2"  # a path, "smollm2", or "tiny" (the smoke model)
    to: int = 16384
    lengths: tuple[int, ...] = (4096, 8192, 12288, 16384)
    methods: tuple[str, ...] = ("none", "pi", "ntk", "dynamic", "yarn")
    passkey_lengths: tuple[int, ...] = (4096, 10240)
    passkey_depths: tuple[float, ...] = (0.2, 0.8)
    passkey_trials: int = 1
    bins: int = 32
    chunk: int = 2048
    search_population: int = 8
    search_generations: int = 4
    search_windows: int = 1
    text: str | None = None
    seed: int = 0

    @classmethod
    def from_preset(cls, preset: str, **overrides) -> "PretrainedConfig":
        values = preset_values(HF_PRESETS, preset, overrides)
        if isinstance(values.get("methods"), str):
            values["methods"] = parse_methods(values["methods"], HF_METHODS)
        return cls(preset=preset, **values)

    def __post_init__(self):
        checks.positive_int("--to", self.to, minimum=2)
        parse_methods(self.methods, HF_METHODS)
        if not self.lengths or any(not isinstance(n, int) or not 2 <= n <= self.to for n in self.lengths):
            raise ValueError(f"lengths must be integers in [2, --to = {self.to}], got {self.lengths}")
        if any(not 0 <= d <= 1 for d in self.passkey_depths):
            raise ValueError(f"passkey depths must be in [0, 1], got {self.passkey_depths}")
        for name in ("passkey_trials", "bins", "chunk", "search_windows"):
            checks.positive_int(name, getattr(self, name))
        checks.positive_int("--search-population", self.search_population, minimum=4)
        checks.positive_int("--search-generations", self.search_generations)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
