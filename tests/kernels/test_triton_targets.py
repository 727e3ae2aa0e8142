"""The Triton kernels not yet run on a GPU compile for one (an H100/H200, sm_90) and fit its shared memory, checked
on a CPU: ``tests/kernels/triton_targets.py`` records their launches under the interpreter at the GPU's tile sizes,
then compiles each with Triton's compiler and the ptxas its wheel ships."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (the test extra)")


def run(*arguments, interpreted: bool) -> str:
    env = {**os.environ, "TRITON_DEFAULT_FP_FUSION": "1"}
    env.pop("TRITON_INTERPRET", None)
    if interpreted:
        env["TRITON_INTERPRET"] = "1"
    result = subprocess.run([sys.executable, "-m", "tests.kernels.triton_targets", *arguments], env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_every_kernel_not_yet_run_on_a_gpu_compiles_for_sm90_within_its_shared_memory(tmp_path):
    """Each launch (forward and backward, head widths 64 and 128, bfloat16) compiles to a cubin; its shared memory
    fits the 227 KiB of a block. Caught before any lend: a branch whose values differed in type (CoPE's forward)
    and Shaw's backward at 264 KiB over Triton's default three stages."""
    from posenc.kernels import counts_triton, lookups_triton, sticks_triton
    from tests.kernels.triton_targets import SHARED_BYTES

    launches = tmp_path / "launches.json"
    run("record", str(launches), interpreted=True)
    results = json.loads(run("compile", str(launches), interpreted=False))
    failures = [(r["name"], r["error"]) for r in results if r["error"]]
    assert not failures, failures
    too_big = [(r["name"], r["shared"]) for r in results if r["shared"] > SHARED_BYTES]
    assert not too_big, too_big
    programs = {sticks_triton: ("sticks_triton._forward", "sticks_triton._backward"),
                lookups_triton: ("lookups_jit.forward", "lookups_jit.backward"),
                counts_triton: ("counts_triton._forward", "counts_triton._backward")}
    expected = {name for module, names in programs.items() if not module.CHECKED_ON_GPU for name in names}
    assert expected <= {r["name"] for r in results}
    assert all(0 < r["registers"] <= 255 and r["stack"] >= 0 for r in results), results
    recorded = json.loads(launches.read_text())
    assert all({"Q", "K", "V"} <= set(launch["divisible"]) for launch in recorded), "q, k, v are 16-byte aligned"


def test_the_kernels_not_yet_run_on_a_gpu_compile_at_the_narrowest_and_widest_heads_they_take(tmp_path):
    """Head width 8, held in blocks of 16 (a GPU's ``tl.dot`` takes no narrower operand: the bias tiles of width 8
    failed to compile for sm_90), and 256 in bf16, where stick-breaking's 64 × 64 tiles asked for 320 KiB of
    shared memory (its 32 × 32 fit in 114 KiB with Triton 3.6); Transformer-XL's and CoPE's tiles are not offered
    there."""
    from tests.kernels.triton_targets import SHARED_BYTES, unchecked

    launches = tmp_path / "launches.json"
    run("record", str(launches), "--widths", "8,256", interpreted=True)
    results = json.loads(run("compile", str(launches), interpreted=False))
    assert not [(r["name"], r["error"]) for r in results if r["error"]]
    assert not [(r["name"], r["shared"]) for r in results if r["shared"] > SHARED_BYTES]
    recorded = json.loads(launches.read_text())
    families = {family for family, _ in unchecked()}
    widths = {(launch["module"].rsplit(".", 1)[-1], launch["constants"]["HEAD_DIM"]) for launch in recorded}
    assert {("sticks_triton", 256), ("sticks_triton", 8)} <= widths or "sticks" not in families
    assert ("tiles_jit", 256) in widths or "tiles" not in families
    assert not {("lookups_triton", 256), ("counts_triton", 256)} & widths
    assert all(launch["constants"]["BLOCK_D"] == 16 for launch in recorded if launch["constants"]["HEAD_DIM"] == 8)


def test_launches_are_specialized_as_a_gpus_jit_specializes_them():
    """Compiled without the JIT's specialization, CoPE's kernels passed where the GPU's Triton 3.6 fails on them:
    its pipeliner breaks once k's rows are known to be 16-byte aligned."""
    import torch

    from tests.kernels.triton_targets import specialized

    assert specialized(1) == ("constexpr", None)  # an int of 1 is made a constant
    assert specialized(48) == ("i32", "D") and specialized(40) == ("i32", None)
    assert specialized(2**33) == ("i64", "D")
    aligned = torch.zeros(8)
    assert specialized(aligned) == ("*fp32", "D") and specialized(aligned[1:]) == ("*fp32", None)


def test_the_compile_passes_each_launchs_alignment_marks_and_constants(tmp_path, monkeypatch):
    """What ``compile_all`` hands Triton's compiler: the recorded aligned arguments as tt.divisibility attributes
    and ints of 1 as constants (dropped, Triton 3.6 compiled CoPE's kernels that fail on a GPU)."""
    from types import SimpleNamespace

    import triton

    from tests.kernels import triton_targets

    launches = tmp_path / "launches.json"
    run("record", str(launches), "--all", interpreted=True)  # every kernel, checked on a GPU or not: none compiles
    recorded = json.loads(launches.read_text())
    sources = []
    monkeypatch.setattr(triton, "compile", lambda source, **_: sources.append(source) or SimpleNamespace(
        metadata=SimpleNamespace(shared=0), asm={"cubin": b""}))
    monkeypatch.setattr(triton_targets, "resource_usage", lambda cubin: {"registers": 1, "stack": 0})
    triton_targets.compile_all(str(launches))
    assert len(sources) == len(recorded)
    for source, launch in zip(sources, recorded):
        names = source.fn.arg_names
        marked = {names[index] for (index,), attributes in source.attrs.items()
                  if ["tt.divisibility", 16] in attributes}
        assert marked == set(launch["divisible"]) and {"q", "k"} <= {name.lower() for name in marked}, launch["name"]
        constants = {names[index]: value for (index,), value in source.constants.items()}
        assert constants == launch["constants"], launch["name"]
    assert any(launch["constants"].get("group") == 1 for launch in recorded)  # one head per key/value head


def test_a_wrong_command_or_launches_file_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    """Each is one line and exit 2: no command, a misspelt one, a missing or truncated launches file, and a record
    outside the interpreter (Triton's own error there: "0 active drivers", deep in a traceback)."""
    from tests.kernels.triton_targets import main

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    truncated = tmp_path / "launches.json"
    truncated.write_text('[{"module": "posenc.kernels.tiles_jit", "na')
    for arguments in ([], ["tabel", "x.json"], ["table", str(tmp_path / "missing.json")], ["compile", str(truncated)],
                      ["record", str(tmp_path / "launches.json")], ["record", "x.json", "--widths", "8,wide"],
                      ["record", "x.json", "--widths"], ["record", "x.json", "--widths", "0"],
                      ["record", "x.json", "--widths", "512"], ["record", "--all"]):
        assert main(arguments) == 2, arguments
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "Traceback" not in error, error


def test_the_table_names_each_launchs_tile():
    """The tile a launch ran: which sizes a program's spills belong to (tiles_triton picks them per dtype, width and
    bias kind)."""
    from tests.kernels.triton_targets import tile

    assert tile({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_D": 64}) == "128×64"
    assert tile({"BLOCK": 32, "BLOCK_D": 64}) == "32×32"
    assert tile({"BLOCK_T": 16, "BLOCK_PAIRS": 32}) == "16×32"
    assert tile({"HEAD_DIM": 64}) == ""
