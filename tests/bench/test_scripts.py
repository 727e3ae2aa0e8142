"""The CPU benchmark scripts (``benchmarks/scripts/cpu_cope_kernel.py``, ``cope_tile_window.py``, ``sm90_tiles.py``)
as a user runs them: a short run prints what the record quotes, and bad flags get one line and exit 2, not a
traceback."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "scripts"


def run(script: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / script), *arguments], capture_output=True, text=True,
                          timeout=300)


def test_the_window_script_bounds_a_tile_by_its_gates():
    """At 256 tokens: with gates near ½ a tile's counts move by about 32 across its 64 keys and about 32 across its 64
    rows, so its window stays within 66 table rows (two windows of 64 at most); with gates spread it is wider, never
    past the keys' count; rows that lean apart read the most windows."""
    result = run("cope_tile_window.py", "--length", "256")
    assert result.returncode == 0, result.stderr
    found = {name: tuple(float(x) for x in numbers) for name, *numbers in re.findall(
        r"T = 256, ([^:]+): table rows per key tile, median (\d+), 90th percentile \d+, largest (\d+); windows of 64 "
        r"computed per key tile, median \d+, largest (\d+), mean ([\d.]+)", result.stdout)}
    assert set(found) == {"q and k spread 1.0", "q and k spread 0.05", "leaning"}, result.stdout
    near_half, spread, leaning = found["q and k spread 0.05"], found["q and k spread 1.0"], found["leaning"]
    assert 33 <= near_half[0] <= near_half[1] <= 66 and near_half[2] <= 2
    assert near_half[1] <= spread[1] <= 256 + 1
    assert 1 <= spread[3] <= spread[2] <= 5 and leaning[3] > spread[3]


@pytest.mark.parametrize("script, arguments, message", [
    ("cope_tile_window.py", ("--length", "10"), "--length must be an integer >= 64, got 10"),
    ("cpu_cope_kernel.py", ("--rounds", "0"), "--rounds must be an integer >= 2, got 0"),
    ("cpu_cope_kernel.py", ("--spread", "-1"), "--spread must be a finite number > 0.0, got -1.0"),
])
def test_bad_flags_get_one_line(script, arguments, message):
    result = run(script, *arguments)
    assert result.returncode == 2 and message in result.stderr.splitlines()[-1], result.stderr
    assert "Traceback" not in result.stderr


def test_the_tile_sweep_records_each_candidate_at_its_own_sizes(tmp_path):
    """``sm90_tiles.py record --float32 --widths 65`` under the interpreter: one launches file per candidate of CoPE's
    kernel, each launch at that width (which the kernel refuses outside the sweep) and at that candidate's tile and
    warps (a sweep whose override did not reach the kernel would record the default sizes six times); a family or
    width it does not take is one line, exit 2."""
    import json
    import os

    pytest.importorskip("triton", reason="needs triton (the test extra)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, str(SCRIPTS / "sm90_tiles.py"), "record", str(tmp_path), "counts",
                             "--float32", "--widths", "65"], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    files = sorted(tmp_path.glob("float32-65-counts-*.json"))
    assert len(files) == 6, files
    for path in files:
        block, warps, stages = (int(part[1:]) for part in path.stem.split("-")[-3:])
        launches = json.loads(path.read_text())
        assert {launch["name"] for launch in launches} == {"_forward", "_backward"}, path
        assert all(launch["constants"]["BLOCK"] == block and launch["constants"]["HEAD_DIM"] == 65 and launch[
            "options"] == {"num_warps": warps, "num_stages": stages} for launch in launches), (path, launches)
    result = run("sm90_tiles.py", "record", str(tmp_path), "nope")
    assert result.returncode == 2 and result.stderr.strip() == (
        "unknown family nope: choose from tiles, sticks, lookups, counts"), result.stderr
    for width in ("wide", "512", ""):
        result = run("sm90_tiles.py", "record", str(tmp_path), "counts", "--widths", *([width] if width else []))
        assert result.returncode == 2 and result.stderr.strip() == (
            f"--widths must be head widths from 1 to 256, separated by commas, got {width!r}"), result.stderr
    for arguments, message in ((("record", str(tmp_path), "counts"), "set TRITON_INTERPRET=1"),
                               (("table", str(tmp_path / "empty")), "no launches files; run `record` first")):
        result = subprocess.run([sys.executable, str(SCRIPTS / "sm90_tiles.py"), *arguments], capture_output=True,
                                text=True, timeout=300, env={k: v for k, v in env.items() if k != "TRITON_INTERPRET"})
        assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr
