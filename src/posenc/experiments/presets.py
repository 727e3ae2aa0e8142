"""Named presets: a command's defaults, with the flags a user gave on top."""

from __future__ import annotations

import dataclasses

from .. import checks


def preset_values(presets: dict[str, dict], preset: str, overrides: dict) -> dict:
    """``presets[preset]`` updated with every override that is not None (an unset flag).

    An unknown preset raises ValueError listing the known ones.
    """
    checks.choice("preset", preset, tuple(presets))
    return {**presets[preset], **{k: v for k, v in overrides.items() if v is not None}}


def warmup_share(config_class, preset: dict, overrides: dict, steps: str = "steps", warmup: str = "warmup") -> dict:
    """{``warmup``: the preset's share of the steps given} when the steps were given without a warm-up (so fewer
    steps than the preset's still reach the peak rate, and more keep its proportion), else {}. The preset's share:
    its values (``preset``) over the fields' defaults of ``config_class``, a dataclass."""
    given = overrides.get(steps)
    if given is None or overrides.get(warmup) is not None or isinstance(given, bool) or not isinstance(given, int) \
            or given < 0:
        return {}
    chosen = {**{f.name: f.default for f in dataclasses.fields(config_class)}, **preset}
    return {warmup: round(given * chosen[warmup] / chosen[steps])}
