"""Hand-made wrong versions of ``posenc pretrained``'s stages: each is one plausible bug, and each must fail the suite.

mutmut cannot reach ``experiments/pretrained/stages.py`` in useful time (every one of its mutants would run the
smoke pipeline), so these stand for the bugs a reviewer asks about: a number computed on the wrong split, pairs
broken between a row and the control, the control reading less than the context, a span of targets one off, keys
planted where they should not be, a row measured on the wrong weights or attention. ``make hand-mutants`` applies
each to a copy of ``src/`` and runs ``tests/experiments/pretrained/test_pretrained.py`` against it (stopping at the
first failure); it prints each mutant's fate and exits 1 if any survived. About 10 minutes on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

STAGES = "posenc/experiments/pretrained/stages.py"
SWAPS = "posenc/experiments/pretrained/swaps.py"
TESTS = ["tests/experiments/pretrained/test_pretrained.py"]

# (what goes wrong, file under src/, the text, its wrong version)
MUTANTS = [
    ("dev rows scored on the test documents", STAGES,
     'for i, w in enumerate(dev)] if name in choosing else []}', 'for i, w in enumerate(test)] if name in choosing else []}'),
    ("the fine-tune curve read on a test document", STAGES,
     'original, dev[0]["ids"], runtime, out, log)', 'original, test[0]["ids"], runtime, out, log)'),
    ("the control read in the other order: pairs broken", STAGES,
     'for i, haystack in enumerate(haystacks)]}', 'for i, haystack in enumerate(haystacks[::-1])]}'),
    ("past the context starts one target late", STAGES,
     '"past": losses[original - 1 :].nanmean().item()', '"past": losses[original:].nanmean().item()'),
    ("the control sees half the context", STAGES,
     'sliding_losses(model, ids, original, config.control_stride', 'sliding_losses(model, ids, original // 2, '
                                                                   'config.control_stride'),
    ("the control's needle mask one target off", STAGES,
     'scored = haystack.scored()[original - 1 :]', 'scored = haystack.scored()[original:]'),
    ("the in-context keys planted across the whole context", STAGES, '    half = original // 2\n', '    half = original\n'),
    ("the first tokens skip the first target", STAGES,
     '"first": losses[: config.first_tokens]', '"first": losses[1 : config.first_tokens]'),
    ("needle tokens scored as text", STAGES, '    losses = losses.masked_fill(~scored, float("nan"))\n', ''),
    ("every test document gets the first one's keys", STAGES,
     'config.to, config, i, wording) for i, w in enumerate(test)', 'config.to, config, 0, wording) for i, w in '
                                                                   'enumerate(test)'),
    ("each row starts from the last row's weights", STAGES,
     '        started = time.perf_counter()\n        _restore(model, pristine)\n        if row["finetune"]:',
     '        started = time.perf_counter()\n        if row["finetune"]:'),
    ("Self-Extend's group ignored (ReRoPE measured instead)", SWAPS,
     'use_self_extend(model, s.window, s.group)', 'use_self_extend(model, s.window, None)'),
    ("the short reader reads the whole context", STAGES,
     'sliding_losses(model, ids, short, short // 2, 0, config.chunk)',
     'sliding_losses(model, ids, original, short // 2, 0, config.chunk)'),
    ("the long reader inside the context reads its last quarter only", STAGES,
     'inside = position_losses(model, ids[:original], config.chunk, label="long reader, inside the context")',
     'inside = sliding_losses(model, ids[:original], original // 4, original // 4, 0, config.chunk)'),
    ("the far in-context keys planted in half the context", STAGES,
     '    far = keys.far_length(original)', '    far = original // 2'),
]


def apply(source: Path, mutant: tuple) -> None:
    """Write ``mutant`` into the copy of src/ at ``source``; its text must occur exactly once."""
    _, path, text, wrong = mutant[:4]
    original = (source / path).read_text()
    if original.count(text) != 1:
        raise ValueError(f"{path}: the mutant's text occurs {original.count(text)} times, not once: {text!r}")
    (source / path).write_text(original.replace(text, wrong))


def run(mutants: list[tuple], tests_of: Callable[[tuple], list[str]]) -> int:
    """Applies each of ``mutants`` (what goes wrong, file under src/, text, wrong version, ...) to a fresh copy of
    src/ and runs ``tests_of(mutant)`` against it, stopping at the first failure; prints each one's fate and
    returns 1 if any survived."""
    root = Path(__file__).resolve().parents[1]
    survived = []
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "src"
        for mutant in mutants:
            shutil.rmtree(source, ignore_errors=True)
            shutil.copytree(root / "src", source, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
            apply(source, mutant)
            began = time.perf_counter()
            env = {**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": "1"}
            outcome = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "0",
                                      *tests_of(mutant)], cwd=root, env=env, capture_output=True, text=True)
            fate = "killed" if outcome.returncode else "SURVIVED"
            print(f"{fate:8} {time.perf_counter() - began:5.0f} s  {mutant[0]}  {_why(outcome.stdout)}", flush=True)
            if not outcome.returncode:
                survived.append(mutant[0])
    print(f"{len(mutants) - len(survived)} of {len(mutants)} killed" + (f"; survived: {survived}" if survived else ""))
    return 1 if survived else 0


def _why(report: str) -> str:
    """The first failed test and the last error line pytest printed for it (for a child process's check, what the
    child raised, or how it died), so a wrong number reads apart from a crash."""
    lines = report.splitlines()
    failed = next((line for line in lines if line.startswith(("FAILED", "ERROR"))), "").split(" - ")[0]
    errors = [line[1:].strip() for line in lines if line.startswith("E ") and not line[1:].strip().startswith(
        ("assert ", "+", "where", "and "))]
    return f"{failed[:100]}  {errors[-1][:160] if errors else ''}"


def main() -> int:
    return run(MUTANTS, lambda mutant: TESTS)


if __name__ == "__main__":
    sys.exit(main())
