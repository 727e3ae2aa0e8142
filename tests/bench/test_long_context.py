"""The long-context table: each contender in its own process, SDPA without positions as the floor, and every way
a child can fail ending as an error row. CPU, tiny shapes; FlexAttention has no backward pass on CPU, so its rows
are error rows here (on CUDA they are timed, compiled)."""

import json
import warnings

import pytest
import torch
import torch.nn.functional as F

from posenc import attention, build
from posenc.bench import long_context
from posenc.bench.long_context import (BASELINE, FLEX, _contender, _flex, _short, bench_long_context, measure,
                                      outcome, run_child, timed_encodings)
from posenc.cli import main
from posenc.lm.runtime import cpu_model

KEYS = ["encoding", "B", "H", "T", "Dh", "ms", "x_sdpa_nope", "peak_gib", "device", "commit", "dtype", "torch"]
NO_FLEX_BACKWARD = "NotImplementedError: FlexAttention does not support backward on CPU"


def _error_keys(keys: list[str]) -> list[str]:
    return [("error" if key == "ms" else key) for key in keys]


def test_long_table_times_each_contender_in_its_own_process_against_sdpa():
    seen = []
    rows = bench_long_context("cpu", "float32", shapes=((1, 2, 64, 16),), encodings=("none", "alibi", "t5"), calls=2,
                              on_row=lambda rows: seen.append(len(rows)))
    assert [r["encoding"] for r in rows] == [BASELINE, *FLEX, "none", "alibi", "t5"]
    assert seen == [1, 2, 3, 4, 5, 6]  # called after every row, so the command can write its files each time
    timed, failed = rows[:1] + rows[3:], rows[1:3]
    for row in timed:
        assert list(row) == KEYS and row["ms"] > 0 and row["peak_gib"] is None  # CPU: no peak-memory counter
        assert row["x_sdpa_nope"] == pytest.approx(row["ms"] / rows[0]["ms"])
        assert (row["B"], row["H"], row["T"], row["Dh"]) == (1, 2, 64, 16) and row["device"] == cpu_model()
    assert rows[0]["x_sdpa_nope"] == 1.0
    for row in failed:  # a child that raised: its error, the rest of the table goes on
        assert list(row) == _error_keys(KEYS) and row["error"].startswith(NO_FLEX_BACKWARD)
        assert row["x_sdpa_nope"] is None and row["peak_gib"] is None


def test_each_shapes_ratios_divide_by_its_own_sdpa_and_rows_carry_the_childs_numbers(monkeypatch, capsys):
    """With the children stood in for: a row's ms and peak memory are its child's, its ratio divides by SDPA's ms
    at its own shape, none where SDPA failed there (not the shape before's), and the timeout reaches every child."""
    asked = []

    def child(name, shape, device, dtype, calls, timeout):
        asked.append((name, shape[0], calls, timeout))
        if name == "t5" or (name == BASELINE and shape[0] == 3):
            return {"error": "out of memory: asked for 16 GiB"}
        return {"ms": (2.0 if name == BASELINE else 3.0) * shape[0], "peak_gib": 0.25 * shape[0]}

    monkeypatch.setattr(long_context, "run_child", child)
    rows = bench_long_context("cpu", "float32", shapes=((1, 2, 64, 16), (2, 2, 64, 16), (3, 2, 64, 16)),
                              encodings=("alibi", "t5"), calls=3, timeout=9.0)
    names = [BASELINE, *FLEX, "alibi", "t5"]
    assert asked == [(name, batch, 3, 9.0) for batch in (1, 2, 3) for name in names]
    table = {(row["encoding"], row["B"]): row for row in rows}
    for batch in (1, 2):
        assert table[BASELINE, batch]["x_sdpa_nope"] == 1.0 and table["alibi", batch]["x_sdpa_nope"] == 1.5
        assert table["alibi", batch]["ms"] == 3.0 * batch and table["alibi", batch]["peak_gib"] == 0.25 * batch
    assert table["t5", 1]["error"] == "out of memory: asked for 16 GiB" and table["t5", 1]["x_sdpa_nope"] is None
    assert table["alibi", 3]["ms"] == 9.0 and table["alibi", 3]["x_sdpa_nope"] is None  # SDPA failed at B = 3
    printed = capsys.readouterr().err.splitlines()
    assert len(printed) == len(rows) and printed[4].startswith("long 1x2x64x16 t5: error: out of memory: asked")
    assert printed[3].startswith("long 1x2x64x16 alibi: 3.00 ms (")


def test_a_child_past_its_timeout_is_killed_and_is_an_error_row():
    assert run_child(BASELINE, (1, 2, 64, 16), "cpu", "float32", 2, timeout=0.2) == {"error": "timed out after 0.2 s"}


def test_a_child_that_crashed_reports_its_last_stderr_line():
    assert outcome(-11, "", "loading\nFatal Python error: Segmentation fault\n\n") == {
        "error": "exited with code -11: Fatal Python error: Segmentation fault"}
    assert outcome(1, "{not json\n", "") == {"error": "exited with code 1: no output"}
    reported = '{"ms": 1.5, "peak_gib": 0.25}\n{"a stray": "print"}\na stray line\n'
    assert outcome(0, reported, "warnings") == {"ms": 1.5, "peak_gib": 0.25}


def test_an_error_is_one_short_line_and_out_of_memory_says_so():
    assert _short(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB.\nmore")) == (
        "out of memory: CUDA out of memory. Tried to allocate 16.00 GiB.")
    assert _short(ValueError("first\nsecond")) == "ValueError: first"
    assert len(_short(RuntimeError("x" * 1000))) == 160


def test_the_table_times_every_encoding_inside_attention_and_none_on_the_input():
    """The issue's rows, whatever else is registered: learned tables and sinusoids act on the input, not here."""
    timed = set(timed_encodings())
    assert {"none", "rope", "xpos", "alibi", "sandwich", "kerple", "t5", "fox", "fire", "stick-breaking",
            "transformer_xl", "shaw", "cope"} <= timed and not {"learned", "sinusoidal"} & timed


def test_each_child_times_causal_attention_with_its_encoding():
    """In process, what a child runs: the baseline is causal SDPA, an encoding's row is causal attention() with it
    (ALiBi's slopes and RoPE's frequencies are fixed, so their outputs are known), FoX's row hands over forget gates
    that get a gradient; ``measure`` then reports a time and, on CPU, no peak memory."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 32, 8, requires_grad=True) for _ in range(3))
    attend, leaves = _contender(BASELINE, q)
    torch.testing.assert_close(attend(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert leaves == []
    for name, kwargs in (("alibi", {"num_heads": 4}), ("rope", {"head_dim": 8})):  # built from the shape's sizes
        attend, leaves = _contender(name, q)
        torch.testing.assert_close(attend(q, k, v), attention(q, k, v, build(name, **kwargs), backend="eager"))
    attend, leaves = _contender("fox", q)
    out = attend(q, k, v)
    later = v.detach().clone()
    later[:, :, 20:] += 1.0  # keys after query 19: a causal row does not see them
    torch.testing.assert_close(attend(q, k, later)[:, :, :20], out[:, :, :20])
    out.sum().backward()
    gates = leaves[-1]
    assert gates.shape == (1, 4, 32) and (gates < 0).all() and bool((gates.grad != 0).any())  # log forget gates
    row = measure("alibi", [1, 2, 32, 8], "cpu", "float32", calls=2)
    assert set(row) == {"ms", "peak_gib"} and row["ms"] > 0 and row["peak_gib"] is None


def test_flex_contenders_compute_sdpa_and_posencs_alibi():
    """The recipe's score_mod is ALiBi as posenc defines it (slope · (j − i)), so its row times the same math."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 32, 8) for _ in range(3))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        plain, alibi = (_flex(name, q)(q, k, v) for name in FLEX)
    torch.testing.assert_close(plain, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.testing.assert_close(alibi, attention(q, k, v, build("alibi", num_heads=4), backend="eager"))


def test_bench_cli_long_table_writes_its_rows_and_keeps_other_shapes(tmp_path, capsys):
    long_json = tmp_path / "long.json"
    other = {"encoding": BASELINE, "B": 9, "H": 1, "T": 8, "Dh": 8, "ms": 1.0}
    stale = {**other, "B": 1, "H": 2, "T": 32, "Dh": 8}  # the shape this run times: replaced
    long_json.write_text(json.dumps([other, stale]))
    args = ["bench", "--tables", "long", "--encodings", "none", "--long-shapes", "1x2x32x8", "--rounds", "2",
            "--long-timeout", "60", "--long-json", str(long_json), "--json", str(tmp_path / "b.json"),
            "--markdown", str(tmp_path / "b.md")]
    assert main(args) == 0
    captured = capsys.readouterr()
    rows = json.loads(long_json.read_text())
    assert rows[0] == other and [r["encoding"] for r in rows[1:]] == [BASELINE, *FLEX, "none"]
    assert json.loads((tmp_path / "b.json").read_text())["tables"] == {"long": rows[1:]}
    assert "/ SDPA without positions" in captured.out and "| × SDPA | peak GiB |" in (tmp_path / "b.md").read_text()
    assert captured.err.count("long 1x2x32x8 ") == 4  # a progress line per row


@pytest.mark.parametrize("args, message", [
    (["--tables", "rope", "--long-json", "LONG"], "--long-json writes the long table: add long to --tables"),
    (["--tables", "long", "--long-json", "BENCH"],
     "--long-json BENCH holds something other than long-table rows; name another file"),
    (["--tables", "long", "--long-json", "ROWS_WITHOUT_DH"],
     "--long-json ROWS_WITHOUT_DH holds something other than long-table rows; name another file"),
    (["--tables", "long", "--long-json", "UNDER_A_FILE"], "--long-json: cannot write UNDER_A_FILE: BENCH is not a folder"),
    (["--tables", "rope", "--json", "UNDER_A_FILE"], "--json: cannot write UNDER_A_FILE: BENCH is not a folder"),
    (["--tables", "rope", "--markdown", "UNDER_A_FILE"], "--markdown: cannot write UNDER_A_FILE: BENCH is not a folder"),
    (["--tables", "rope", "--json", "TWO_UNDER_A_FILE"], "--json: cannot write TWO_UNDER_A_FILE: BENCH is not a folder"),
])
def test_bench_cli_long_json_is_refused_before_any_work(args, message, tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"tables": {}}))
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"encoding": "none", "B": 1, "H": 2, "T": 8, "ms": 1.0}]))
    paths = {"LONG": str(tmp_path / "long.json"), "BENCH": str(bench), "ROWS_WITHOUT_DH": str(rows),
             "TWO_UNDER_A_FILE": str(bench / "runs" / "out.json"),  # its folder's folder is a file
             "UNDER_A_FILE": str(bench / "out.json")}  # its folder would be a file: it cannot be made
    assert main(["bench", *[paths.get(a, a) for a in args]]) == 2
    for name, path in paths.items():  # the longer names first: UNDER_A_FILE is in TWO_UNDER_A_FILE
        message = message.replace(name, path)
    assert capsys.readouterr().err == f"posenc bench: error: {message}\n" and not (tmp_path / "long.json").exists()


@pytest.mark.parametrize("flag, value", [("--long-shapes", "1x2x64"), ("--long-shapes", "1x2x0x8"),
                                         ("--long-timeout", "0"), ("--long-timeout", "soon")])
def test_bench_cli_rejects_bad_long_flags(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--tables", "long", flag, value])
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err
