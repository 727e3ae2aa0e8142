"""Named presets: a command's defaults, with the flags a user gave on top."""

from __future__ import annotations

from .. import checks


def preset_values(presets: dict[str, dict], preset: str, overrides: dict) -> dict:
    """``presets[preset]`` updated with every override that is not None (an unset flag).

    An unknown preset raises ValueError listing the known ones.
    """
    checks.choice("preset", preset, tuple(presets))
    return {**presets[preset], **{k: v for k, v in overrides.items() if v is not None}}
