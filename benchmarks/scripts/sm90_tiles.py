"""Which GPU tile sizes keep each of posenc's Triton programs in its registers, found without a GPU: every candidate
setting of a kernel's size rule is recorded under the interpreter and compiled for sm_90 as ``make gpu-compile``
compiles (``tests/kernels/triton_targets``), and each program's registers, spilled bytes and shared memory printed.
A static guide for settings no GPU has timed; it says nothing of speed beyond what spills cost.

    TRITON_INTERPRET=1 python3 benchmarks/scripts/sm90_tiles.py record DIR [--float32] [--widths W,...] [FAMILY...]
    PYTHONPATH=.triton-3.6.0 python3 benchmarks/scripts/sm90_tiles.py table DIR

``record`` writes DIR/<dtype>-<width>-<family>-<setting>.json per candidate and width (bfloat16, or float32, at
head width 64, or each of ``--widths``, parsed as ``triton_targets`` parses it);
``table`` compiles them all (the GPU's Triton on PYTHONPATH, as ``make gpu-compile`` installs it) and prints one
Markdown row per program and setting. FAMILY: tiles, sticks, lookups, counts (all when none is named).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.kernels
from tests.kernels import triton_targets  # noqa: E402

#: per family, the settings tried, each recorded as named: what its size rule returns on a GPU (tiles_triton._blocks:
#: ``tiles_triton.Tiles``, forward BLOCK_M, BLOCK_N and warps, backward BLOCK and warps, stages;
#: sticks_triton._blocks: BLOCK_M, BLOCK_N, warps), or what replaces the rule's answer (lookups' and counts' ``_sizes``)
CANDIDATES = {
    "tiles": [(128, 64, 4, 64, 4, 3), (128, 64, 8, 64, 8, 3), (64, 64, 4, 64, 4, 3), (64, 64, 4, 32, 4, 3),
              (64, 32, 4, 32, 4, 3), (32, 32, 4, 32, 4, 3), (64, 64, 8, 64, 8, 3), (64, 32, 8, 32, 8, 3),
              (32, 32, 8, 32, 8, 3), (64, 32, 8, 32, 8, 2), (64, 32, 8, 16, 8, 3), (32, 32, 4, 16, 4, 3),
              # what the rule picks past width 64 (two stages) and past 128 (a backward of 32)
              (128, 64, 8, 64, 8, 2), (64, 64, 8, 64, 8, 2), (128, 64, 8, 32, 8, 2), (64, 64, 8, 32, 8, 2)],
    "sticks": [(64, 64, 8), (64, 64, 4), (64, 32, 4), (32, 32, 4), (32, 64, 4), (64, 32, 8)],
    "lookups": [dict(BLOCK=64, num_warps=8, num_stages=2), dict(BLOCK=64, num_warps=4, num_stages=2),
                dict(BLOCK=32, num_warps=4, num_stages=2), dict(BLOCK=32, num_warps=8, num_stages=2),
                dict(BLOCK=32, num_warps=4, num_stages=3), dict(BLOCK=16, num_warps=4, num_stages=2)],
    "counts": [dict(BLOCK=64, num_warps=8, num_stages=1), dict(BLOCK=64, num_warps=4, num_stages=1),
               dict(BLOCK=32, num_warps=4, num_stages=1), dict(BLOCK=32, num_warps=8, num_stages=1),
               dict(BLOCK=16, num_warps=4, num_stages=1), dict(BLOCK=32, num_warps=2, num_stages=1)],
}


def label(setting) -> str:
    if isinstance(setting, dict):
        return f"b{setting['BLOCK']}-w{setting['num_warps']}-s{setting['num_stages']}"
    return "x".join(str(n) for n in setting)


def use(family: str, setting) -> None:
    """Makes the family's size rule answer ``setting`` exactly (on top of ``triton_targets.gpu_sizes``): the tiles'
    rule's own adjustments by width (two stages past 64, a backward of 32 past 128) are not applied, so each file
    holds the tiles its name says (three stages past width 64 may not fit: the table shows it)."""
    from posenc.kernels import counts_triton, lookups_triton, sticks_triton, tiles_triton

    if family == "sticks":
        sticks_triton._blocks = lambda *_: setting
        return
    if family == "tiles":
        tiles_triton._blocks = lambda *_: tiles_triton.Tiles(*setting)
        return
    module = lookups_triton if family == "lookups" else counts_triton
    rule = getattr(module, "_gpu_rule", module._sizes)
    module._gpu_rule = rule
    module._sizes = lambda *args: {**rule(*args), **setting}


def record(folder: Path, float32: bool, widths: tuple[int, ...], families: list[str]) -> None:
    """Each candidate's launches at each of ``widths``, also where the kernel refuses one now (its ``WIDEST``), to
    find a setting that fits there."""
    dtype = torch.float32 if float32 else torch.bfloat16
    folder.mkdir(parents=True, exist_ok=True)
    triton_targets.gpu_sizes()
    for family in families:
        importlib.import_module(f"posenc.kernels.{family}_triton").WIDEST = (max(widths),) * 2
        for width in widths:
            for setting in CANDIDATES[family]:
                use(family, setting)
                with triton_targets.recording() as launches:
                    torch.manual_seed(0)
                    triton_targets.ENTRIES[family](width, dtype)
                path = folder / f"{str(dtype).split('.')[-1]}-{width}-{family}-{label(setting)}.json"
                path.write_text(json.dumps(list(launches.values())))
                print(path, len(launches), flush=True)


def table(folder: Path) -> str:
    """Each launches file compiled, a row per program (``triton_targets.row``) after the file's name."""
    header = [f"| file {line}" if line.startswith("| program") else f"| --- {line}" for line in triton_targets.HEADER]
    lines = list(header)
    for path in sorted(folder.glob("*.json")):
        for result in triton_targets.compile_all(str(path)):
            lines.append(f"| {path.stem} {triton_targets.row(result)}")
            print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def main(arguments: list[str]) -> int:
    """0 when done; 2, with one line on stderr, for a wrong command or family, a ``record`` outside the
    interpreter or a ``table`` of a folder with no launches."""
    if len(arguments) < 2 or arguments[0] not in ("record", "table"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    folder = Path(arguments[1])
    if arguments[0] == "table":
        if not any(folder.glob("*.json")):
            print(f"{folder}: no launches files; run `record` first", file=sys.stderr)
            return 2
        print(table(folder))
        return 0
    widths, rest = triton_targets.widths_argument(arguments[2:])
    if widths is None:
        return 2
    families = [a for a in rest if not a.startswith("--")] or list(CANDIDATES)
    unknown = sorted(set(families) - set(CANDIDATES))
    if unknown:
        print(f"unknown family {', '.join(unknown)}: choose from {', '.join(CANDIDATES)}", file=sys.stderr)
        return 2
    if not triton_targets.interpreted():
        print(triton_targets.NOT_INTERPRETED, file=sys.stderr)
        return 2
    record(folder, "--float32" in arguments, widths or (64,), families)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
