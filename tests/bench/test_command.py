"""``posenc bench`` with every table stood in for: each flag reaches the table it sets, the files hold what each
table returned, and a 16-bit --dtype trains under autocast. The tables themselves: tests/bench/test_bench.py and
test_long_context.py."""

import json

import pytest
import torch

from posenc.bench import command, report
from posenc.bench.long_context import SHAPES
from posenc.cli import build_parser, main


@pytest.fixture
def tables(monkeypatch):
    """{table: [the arguments of each call]}; each stand-in returns one row naming its call."""
    calls = {}

    def stand_in(table, row):
        def call(*args, **kwargs):
            calls.setdefault(table, []).append((args, kwargs))
            if table == "long":
                kwargs["on_row"]([row])
            return [dict(row, call=len(calls[table]))]
        return call

    timed = {"ratio": 1.0, "ratio_low": 1.0, "ratio_high": 1.0, "ms": 2.0}
    training_row = {"encoding": "none", "length": 8, "batch": 2, "compiled": False, **timed}
    monkeypatch.setattr(command, "bench_attention", stand_in("attention", {"encoding": "none", "backend": "eager",
                                                                           "length": 8, **timed}))
    monkeypatch.setattr(command, "bench_training_step", stand_in("training", training_row))
    monkeypatch.setattr(command, "bench_rope_apply", stand_in("rope", {"contender": "copy_", "shape": [1], **timed}))
    monkeypatch.setattr(command, "bench_score_forms", stand_in("forms", {"encoding": "none", "form": "(causal)",
                                                                         "length": 8, "batch": 2, **timed}))
    monkeypatch.setattr(command, "bench_activation_memory", stand_in("memory", {"encoding": "none", "length": 8,
                                                                                "batch": 2, "mib": 1.0, "ratio": 1.0}))
    monkeypatch.setattr(command, "bench_long_context", stand_in("long", {"encoding": "none", "B": 1, "H": 2, "T": 8,
                                                                         "Dh": 4, "ms": 2.0, "x_sdpa_nope": 1.0,
                                                                         "peak_gib": None}))
    return calls


def test_each_flag_reaches_the_table_it_sets(tables, tmp_path, capsys):
    args = ["bench", "--tables", "attention,training,rope,forms,memory,long", "--encodings", "alibi,fox",
            "--lengths", "8,16", "--train-shapes", "8x2,16x1", "--rope-shape", "1,2,8,4", "--rounds", "3",
            "--backend", "eager", "--compile", "--long-shapes", "1x2x8x4", "--long-timeout", "7.5",
            "--json", str(tmp_path / "b.json"), "--markdown", str(tmp_path / "pages" / "cpu" / "b.md"),
            "--long-json", str(tmp_path / "long.json")]
    assert main(args) == 0
    step = {"backend": "eager", "autocast": None}
    assert tables["attention"] == [(("cpu", torch.float32, (8, 16)), {"rounds": 3, "encodings": ("none", "alibi")})]
    assert tables["training"] == [  # once as written, once compiled; fox is not inside attention(), but trains
        (("cpu", ((8, 2), (16, 1)), ("none", "alibi", "fox")), {"rounds": 3, **step}),
        (("cpu", ((8, 2), (16, 1)), ("none", "alibi", "fox")), {"rounds": 3, "compile": True, **step})]
    assert tables["rope"] == [(("cpu", torch.float32, (1, 2, 8, 4)), {"rounds": 3})]
    assert tables["forms"] == [(("cpu",), {"rounds": 3})]
    assert tables["memory"] == [(("cpu", ((8, 2), (16, 1)), ("none", "alibi", "fox")), step)]
    (long_args, long_kwargs), = tables["long"]
    assert long_args == ("cpu", "float32", ((1, 2, 8, 4),), ("none", "alibi", "fox"))
    assert (long_kwargs["calls"], long_kwargs["timeout"]) == (3, 7.5)
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["dtype"] == "float32" and saved["machine"] and saved["device"] == "cpu"
    assert {name: [row["call"] for row in rows] for name, rows in saved["tables"].items()} == {
        "attention": [1], "training": [1, 2], "rope": [1], "forms": [1], "memory": [1], "long": [1]}
    assert [row["encoding"] for row in json.loads((tmp_path / "long.json").read_text())] == ["none"]
    markdown = (tmp_path / "pages" / "cpu" / "b.md").read_text()  # its folders made
    assert markdown.startswith("Measured on ") and markdown.count("\n### ") == 6
    printed = capsys.readouterr().out.split("\n\n")  # each table printed as it finishes, a blank line after it
    assert [text.splitlines()[0] for text in printed if text] == [report.TABLES[name][0] for name in saved["tables"]]


def test_a_16_bit_dtype_times_the_models_under_autocast(tables):
    assert main(["bench", "--tables", "training,memory", "--dtype", "bfloat16", "--train-shapes", "8x2"]) == 0
    assert tables["training"][0][1]["autocast"] == tables["memory"][0][1]["autocast"] == torch.bfloat16
    assert len(tables["training"]) == 1  # not compiled: no --compile
    assert main(["bench", "--tables", "memory", "--dtype", "float64", "--train-shapes", "8x2"]) == 0
    assert tables["memory"][1][1]["autocast"] is None  # float64 is not autocast's


def test_the_long_json_keeps_rows_of_other_shapes_and_replaces_this_runs(tables, tmp_path):
    path = tmp_path / "long.json"
    other = {"encoding": "alibi", "B": 4, "H": 16, "T": 4096, "Dh": 64, "ms": 1.0}
    old = {"encoding": "none", "B": 1, "H": 2, "T": 8, "Dh": 4, "ms": 9.0}
    bare = {"B": 2, "H": 16, "T": 4096, "Dh": 64}  # the shape alone is enough to be a long-table row
    path.write_text(json.dumps([other, bare, old]))
    assert main(["bench", "--tables", "long", "--long-shapes", "1x2x8x4", "--long-json", str(path)]) == 0
    assert [(row.get("encoding"), row["B"], row.get("ms")) for row in json.loads(path.read_text())] == [
        ("alibi", 4, 1.0), (None, 2, None), ("none", 1, 2.0)]


@pytest.mark.parametrize("args, message", [
    (["--tables", "memory", "--rounds", "1"], "--rounds must be an integer >= 2, got 1"),
    (["--tables", "rope", "--rope-shape", "1,2,8"], "--rope-shape must be B,H,T,Dh with an even Dh, got (1, 2, 8)"),
    (["--tables", "rope", "--rope-shape", "1,2,8,5"], "--rope-shape must be B,H,T,Dh with an even Dh, got (1, 2, 8, 5)"),
    (["--tables", "memory", "--long-json", "x.json"], "--long-json writes the long table: add long to --tables"),
    (["--tables", ","], "--tables names no table: pass a comma list of "),  # it once ran nothing and exited 0
    (["--tables", "rope,memory,rope"], "--tables names 'rope' twice; give each once"),
    (["--tables", "memory", "--encodings", "alibi,none,alibi"], "--encodings names 'alibi' twice; give each once"),
])
def test_bad_flags_are_refused_before_any_table(tables, args, message, capsys):
    assert main(["bench", *args]) == 2
    assert message in capsys.readouterr().err and tables == {}


@pytest.mark.parametrize("flag, value, message", [
    ("--lengths", "8,x", "expected comma-separated integers >= 1, got '8,x'"),
    ("--lengths", "1,0", "expected comma-separated integers >= 1, got '1,0'"),
    ("--train-shapes", "8x2x1", "expected LENGTHxBATCH[,LENGTHxBATCH...] with positive integers, got '8x2x1'"),
    ("--train-shapes", "8x0", "expected LENGTHxBATCH[,LENGTHxBATCH...] with positive integers"),
    ("--long-shapes", "1x2x8", "expected BxHxTxDh[,BxHxTxDh...] with positive integers, got '1x2x8'"),
    ("--long-timeout", "0", "expected a number of seconds > 0, got '0'"),
    ("--long-timeout", "soon", "expected a number of seconds > 0, got 'soon'"),
])
def test_bad_values_are_one_argparse_line_naming_the_flag(tables, flag, value, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", flag, value])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and flag in err and message in err


def test_the_smallest_values_are_taken(tables):
    assert main(["bench", "--tables", "attention,long", "--lengths", "1", "--rounds", "2", "--long-shapes",
                 "1x1x1x1", "--long-timeout", "0.5"]) == 0
    assert tables["attention"][0][0][2] == (1,) and tables["long"][0][0][2] == ((1, 1, 1, 1),)
    assert tables["long"][0][1]["timeout"] == 0.5


def test_the_defaults_are_the_ones_the_help_names(capsys):
    args = build_parser().parse_args(["bench"])
    assert (args.tables, args.encodings, args.lengths, args.train_shapes, args.rope_shape, args.rounds) == (
        "attention,training,rope,forms,memory", "all", (256, 1024), ((64, 32), (512, 8)), (4, 16, 2048, 64), 7)
    assert (args.compile, args.backend, args.long_shapes, args.long_timeout, args.long_json, args.markdown) == (
        False, "auto", SHAPES, 120.0, None, None)
    assert SHAPES == ((1, 16, 16384, 64), (4, 16, 4096, 64))  # the issue's two shapes, as --long-shapes' help says
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    usage = capsys.readouterr().out
    for default in ("default 256,1024", "default 64x32,512x8", "default 4,16,2048,64", "default 7", "default auto",
                    "default 1x16x16384x64,4x16x4096x64", "default 120", "all but long"):
        assert default in " ".join(usage.split()), default


def test_an_output_folder_that_cannot_be_made_is_one_line_naming_why(tables, tmp_path, monkeypatch, capsys):
    (tmp_path / "runs").symlink_to(tmp_path / "gone")  # a link to nothing: neither a folder nor makeable
    assert main(["bench", "--tables", "rope", "--json", str(tmp_path / "runs" / "b.json")]) == 2
    assert capsys.readouterr().err == (f"posenc bench: error: --json: cannot write {tmp_path / 'runs' / 'b.json'}: "
                                       f"{tmp_path / 'runs'} is not a folder\n")
    def refused(*args, **kwargs):  # as a folder the user may not write in (the tests run as root: none refuses)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(command.Path, "mkdir", refused)
    assert main(["bench", "--tables", "rope", "--markdown", str(tmp_path / "b.md")]) == 2
    assert capsys.readouterr().err == (f"posenc bench: error: --markdown: cannot write {tmp_path / 'b.md'} "
                                       "(Permission denied)\n")
    assert tables == {}
