"""``posenc``'s front door (``cli.py``) with the work behind each command stood in for: what a careless user sees
(exit codes, the one line an error or an interrupt prints, a flag of another command named as such, the old
spellings), and what each command hands its work. ``tests/test_cli_matrix.py`` runs every flag end to end."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from posenc import cli


@pytest.fixture
def recorded(monkeypatch):
    """The calls ``cli.main`` makes to the work it starts, in order, with the commit read stood in for."""
    calls = []
    monkeypatch.setattr("posenc.lm.runtime.provenance", lambda: calls.append("provenance"))
    return calls


def _raising(error: BaseException):
    def run(args):
        raise error
    return run


def test_a_value_error_exits_2_with_one_line_naming_the_command(monkeypatch, recorded, capsys):
    monkeypatch.setattr(cli, "_run_report", _raising(ValueError("--x must be positive, got -1")))
    assert cli.main(["report"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "posenc report: error: --x must be positive, got -1\n" and captured.out == ""


def test_an_interrupt_exits_130_and_says_how_to_continue(monkeypatch, recorded, capsys):
    monkeypatch.setattr(cli, "_run_plot", _raising(KeyboardInterrupt()))
    assert cli.main(["plot"]) == 130
    assert capsys.readouterr().err == "\nposenc plot: interrupted; finished work is saved\n"  # no run folder


def test_an_interrupted_run_names_its_folder_and_how_to_continue(monkeypatch, tmp_path, capsys):
    from posenc.experiments.arguments import run_folder

    def interrupted(args):
        run_folder(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run_task", interrupted)
    assert cli.main(["task", "copy", "--preset", "smoke", "--out", str(tmp_path / "r")]) == 130
    assert capsys.readouterr().err == (f"\nposenc task: interrupted; finished work is saved in {tmp_path / 'r'}: "
                                       f"continue with the same command and --resume --out {tmp_path / 'r'}\n")


def test_other_errors_are_not_swallowed(monkeypatch, recorded):
    monkeypatch.setattr(cli, "_run_plot", _raising(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["plot"])


def test_the_commit_is_read_before_the_work_starts_and_the_works_code_is_returned(monkeypatch, recorded):
    monkeypatch.setattr(cli, "_run_report", lambda args: recorded.append(("report", args.files, args.check)) or 7)
    assert cli.main(["report", "a.md", "--check"]) == 7
    assert recorded == ["provenance", ("report", [Path("a.md")], True)]


@pytest.mark.parametrize("argv, message", [
    (["verify", "--bogus"], "unrecognized arguments: --bogus\n"),
    (["verify", "--resume"], "unrecognized arguments: --resume (--resume: flags of posenc extrapolate and posenc "
                             "task and posenc extend and posenc pretrained)\n"),
    (["verify", "--ckpt=run"], "unrecognized arguments: --ckpt=run (--ckpt: flags of posenc plot)\n"),
    (["verify", "--ckpt=a=b"], "unrecognized arguments: --ckpt=a=b (--ckpt: flags of posenc plot)\n"),
    (["verify", "--ckpt", "run", "--bogus"], "unrecognized arguments: --ckpt run --bogus\n"),  # not all one's
    (["plot", "--to", "2048", "--corpus", "kjv"], "unrecognized arguments: --to 2048 --corpus kjv (--corpus, --to: "
                                                  "flags of posenc pretrained)\n"),
], ids=["no owner", "four owners", "flag=value", "flag=value with =", "not all one's", "two flags"])
def test_an_unknown_flag_exits_2_naming_the_commands_it_belongs_to(argv, message, recorded, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and recorded == []
    assert capsys.readouterr().err.endswith(f"posenc {argv[0]}: error: {message}")


@pytest.mark.parametrize("argv, message", [
    ([], "posenc: error: the following arguments are required: command\n"),
    (["verify", "--device", "tpu"], "posenc verify: error: argument --device: invalid choice: tpu (choose from "
                                    "cpu, cuda)\n"),
    (["bench", "--dtype", "float16"], "posenc bench: error: argument --dtype: invalid choice: float16 (choose "
                                      "from bfloat16, float32, float64)\n"),
], ids=["no command", "device", "dtype"])
def test_no_command_or_a_value_outside_a_flags_choices_exits_2(argv, message, monkeypatch, recorded, capsys):
    monkeypatch.setattr("posenc.bench.command.run", _raising(AssertionError("a value outside --dtype's choices ran")))
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and recorded == []
    assert capsys.readouterr().err.replace("'", "").endswith(message)  # Python 3.12 quotes the choices


def test_without_arguments_main_reads_the_command_line(monkeypatch, recorded):
    monkeypatch.setattr(cli, "_run_report", lambda args: recorded.append(args.files) or 0)
    monkeypatch.setattr("sys.argv", ["posenc", "report", "a.md"])
    assert cli.main() == 0 and recorded == ["provenance", [Path("a.md")]]


@pytest.mark.parametrize("argv, expected, notice", [
    (["extrapolate", "--task", "copy", "--steps", "4"], ["task", "copy", "--steps", "4"],
     "posenc: 'extrapolate --task' is now 'posenc task copy'; running that\n"),
    (["extrapolate", "--task=recall", "--steps", "4"], ["task", "recall", "--steps", "4"],
     "posenc: 'extrapolate --task' is now 'posenc task recall'; running that\n"),
    (["extrapolate", "--task", "lm", "--steps", "4"], ["extrapolate", "--steps", "4"], ""),
    (["extend", "--to", "1024", "--hf", "smollm2"], ["pretrained", "smollm2", "--to", "1024"],
     "posenc: 'extend --hf' is now 'posenc pretrained MODEL'; running that\n"),
    (["extend", "--hf=models/a=b", "--to", "1024"], ["pretrained", "models/a=b", "--to", "1024"],
     "posenc: 'extend --hf' is now 'posenc pretrained MODEL'; running that\n"),
    (["extend", "--hf"], ["extend", "--hf"], ""),  # no value: left for argparse to refuse
    (["extend", "--hfx=1"], ["extend", "--hfx=1"], ""),
    (["pretrained", "--task", "copy"], ["pretrained", "--task", "copy"], ""),
    ([], [], ""),
], ids=["task", "task=", "task lm", "hf", "hf= with =", "hf without value", "hfx", "pretrained --task", "none"])
def test_the_old_spellings_become_the_new_commands_with_one_notice(argv, expected, notice, capsys):
    assert cli._old_spelling(argv) == expected
    assert capsys.readouterr().err == notice


class _Check(SimpleNamespace):
    def to_dict(self) -> dict:
        return dict(vars(self))


def test_verify_prints_its_table_and_a_count_writes_its_rows_and_exits_1_on_a_failure(monkeypatch, recorded,
                                                                                      tmp_path, capsys):
    rows = [_Check(check="a", passed=True), _Check(check="b", passed=False), _Check(check="c", passed=True)]
    asked = []
    monkeypatch.setattr("posenc.verify.run_checks", lambda device, dtype: asked.append((device, dtype)) or rows)
    monkeypatch.setattr("posenc.verify.format_table", lambda checks: f"TABLE of {len(checks)}")
    monkeypatch.setattr("posenc.verify.tolerance_rule", lambda: "THE RULE")
    out = tmp_path / "verify.json"
    assert cli.main(["verify", "--dtype", "float64", "--json", str(out)]) == 1
    assert asked == [("cpu", torch.float64)]
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == ["TABLE of 3", ""]
    assert printed[2].startswith("2 passed, 1 failed (cpu, float64, ") and printed[2].endswith("s). THE RULE")
    assert 0 <= float(printed[2].split(", ")[-1].split("s)")[0]) < 60  # the seconds it took
    assert json.loads(out.read_text()) == {"device": "cpu", "dtype": "float64",
                                           "rows": [{"check": c, "passed": c != "b"} for c in "abc"]}

    rows.pop(1)
    assert cli.main(["verify"]) == 0 and asked[-1] == ("cpu", torch.float32)
    assert "2 passed, 0 failed (cpu, float32, " in capsys.readouterr().out


def test_verify_refuses_a_json_file_it_could_not_write_before_any_check(monkeypatch, recorded, tmp_path, capsys):
    monkeypatch.setattr("posenc.verify.run_checks", _raising(AssertionError("ran")))
    assert cli.main(["verify", "--json", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"posenc verify: error: --json: {tmp_path} is a folder; name a file in it\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
@pytest.mark.parametrize("command", ["verify", "bench"])
def test_cuda_without_a_device_is_refused_before_any_work(command, monkeypatch, recorded, capsys):
    monkeypatch.setattr("posenc.verify.run_checks", _raising(AssertionError("ran")))
    monkeypatch.setattr("posenc.bench.command.run", _raising(AssertionError("ran")))
    assert cli.main([command, "--device", "cuda"]) == 2
    assert capsys.readouterr().err == f"posenc {command}: error: --device cuda: no CUDA device is available here\n"


def test_plot_writes_the_encodings_figures_or_a_runs_and_prints_each_path(monkeypatch, recorded, tmp_path, capsys):
    written = []
    monkeypatch.setattr("posenc.figures.plot.write_figures",
                        lambda out, models, window: written.append((out, models, window)) or [out / "a.png",
                                                                                             out / "b.png"])
    monkeypatch.setattr("posenc.experiments.extrapolate.trained_models", lambda run: {"rope": run})
    monkeypatch.setattr("posenc.experiments.extrapolate.attention_window", lambda run: ("window of", run))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plot", "--out", str(tmp_path)]) == 0
    assert cli.main(["plot", "--ckpt", "runs/x"]) == 0
    run = Path("runs/x")
    assert written == [(tmp_path, None, None), (Path("figures"), {"rope": run}, ("window of", run))]
    assert capsys.readouterr().out.splitlines() == [str(tmp_path / "a.png"), str(tmp_path / "b.png"),
                                                    "figures/a.png", "figures/b.png"]
    assert (tmp_path / "figures").is_dir()  # made before the figures are drawn


def test_plot_refuses_an_out_folder_it_cannot_make_before_drawing(monkeypatch, recorded, tmp_path, capsys):
    monkeypatch.setattr("posenc.figures.plot.write_figures", _raising(AssertionError("drew")))
    (tmp_path / "notes").write_text("a file")
    assert cli.main(["plot", "--out", str(tmp_path / "notes" / "figures")]) == 2
    assert capsys.readouterr().err == (f"posenc plot: error: --out: cannot write {tmp_path / 'notes' / 'figures'}: "
                                       f"{tmp_path / 'notes'} is not a folder\n")


REGION = "<!-- generated by `posenc report`: fake results.json -->\n{}<!-- end generated -->\n"


@pytest.fixture
def a_page(monkeypatch, tmp_path):
    """A Markdown page in tmp_path (the working folder) whose one generated region reads results.json."""
    monkeypatch.setattr("posenc.experiments.published.render", lambda table, results: f"{table}: {results['x']}\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results.json").write_text('{"x": 2}')
    page = tmp_path / "README.md"
    page.write_text("# a page\n" + REGION.format("fake: 1\n"))
    return page


def test_report_check_exits_1_on_a_stale_table_and_changes_nothing_then_report_rewrites_it(a_page, recorded,
                                                                                          capsys):
    assert cli.main(["report", "--check"]) == 1
    assert a_page.read_text() == "# a page\n" + REGION.format("fake: 1\n")
    assert capsys.readouterr().out == f"{a_page}: differs from its results files\n"
    assert cli.main(["report"]) == 0
    assert a_page.read_text() == "# a page\n" + REGION.format("fake: 2\n")
    assert capsys.readouterr().out == f"{a_page}: tables rewritten\n"
    assert cli.main(["report", "--check", str(a_page)]) == 0 and capsys.readouterr().out == ""


def test_report_reads_the_docs_and_the_machines_pages_when_no_file_is_named(a_page, recorded, tmp_path, capsys):
    pages = [tmp_path / "docs" / "guide" / "a.md", tmp_path / "benchmarks" / "epyc" / "README.md"]
    for page in pages:
        page.parent.mkdir(parents=True)
        page.write_text(REGION.format("fake: 1\n").replace("results.json", "../../results.json"))
    assert cli.main(["report", "--check"]) == 1
    assert capsys.readouterr().out.splitlines() == [f"{p}: differs from its results files" for p in [a_page, *pages]]


@pytest.mark.parametrize("argv, message", [
    (["report", "gone.md", "README.md", "also.md"], "no Markdown file gone.md, also.md"),
    (["report"], "no README.md, docs/ or benchmarks/ pages here; name the Markdown files"),
    (["report", "README.md"], "README.md: no generated table (a line '<!-- generated by `posenc report`: TABLE "
                              "RESULTS.json -->')"),
], ids=["missing", "no pages", "no table"])
def test_report_without_its_pages_is_refused_naming_what_is_missing(argv, message, monkeypatch, recorded, tmp_path,
                                                                    capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("# a page\n") if len(argv) > 1 else None
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"posenc report: error: {message}\n"


@pytest.mark.parametrize("command, extra", [("extrapolate", []), ("task", ["copy"])])
def test_a_training_command_hands_its_config_folder_and_resume_to_its_run(command, extra, monkeypatch, recorded,
                                                                         tmp_path):
    module = {"extrapolate": "extrapolate", "task": "tasks"}[command]
    monkeypatch.setattr(f"posenc.experiments.{module}.command.config_of", lambda args: ("config", args.command))
    monkeypatch.setattr(f"posenc.experiments.{module}.run",
                        lambda config, folder, resume: recorded.append((config, folder, resume)))
    assert cli.main([command, *extra, "--out", str(tmp_path), "--resume"]) == 0
    assert recorded == ["provenance", (("config", command), tmp_path, True)]


def test_extend_and_pretrained_hand_on_their_own_options(monkeypatch, recorded, tmp_path):
    monkeypatch.setattr("posenc.experiments.extend.command.config_of", lambda args: f"extend config {args.factor}")
    monkeypatch.setattr("posenc.experiments.pretrained.command.config_of", lambda args: f"pretrained {args.model}")
    monkeypatch.setattr("posenc.experiments.extend.run", lambda *a, **kw: recorded.append(("extend", a, kw)))
    monkeypatch.setattr("posenc.experiments.pretrained.run", lambda *a, **kw: recorded.append(("pretrained", a, kw)))
    assert cli.main(["extend", "--factor", "4", "--run", "runs/r", "--text", "t.txt", "--only-seeds", "2",
                     "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert cli.main(["pretrained", "tiny", "--export", "x", "--out", str(tmp_path), "--resume"]) == 0
    extend, pretrained = recorded[1], recorded[3]
    assert extend == ("extend", ("extend config 4.0", tmp_path), {"run_dir": Path("runs/r"), "text": "t.txt",
                                                             "device": "cpu", "resume": False, "only_seeds": (2,)})
    assert pretrained == ("pretrained", ("pretrained tiny", tmp_path),
                          {"resume": True, "export": Path("x"), "device": "auto"})


def test_bench_hands_its_parsed_flags_to_the_bench(monkeypatch, recorded):
    monkeypatch.setattr("posenc.bench.command.run", lambda args: recorded.append((args.tables, args.dtype)) or 3)
    assert cli.main(["bench", "--tables", "rope", "--dtype", "float64"]) == 3
    assert recorded == ["provenance", ("rope", "float64")]


def test_the_docs_table_of_commands_is_the_parsers():
    """docs/README.md's table is a region ``posenc report`` writes from ``cli.command_rows`` (test_published keeps it
    current): every command, each with the line ``posenc --help`` gives it."""
    header, rows = cli.command_rows()
    helps = {name: sub.description for name, sub in cli._commands(cli.build_parser()).choices.items()}
    assert header == ["command", "what it does"] and [row[0] for row in rows] == [f"`posenc {n}`" for n in helps]
    assert all(len(row[1]) > 20 and len(helps[row[0][8:-1]]) > len(row[1]) for row in rows)
    docs = (Path(__file__).resolve().parents[1] / "docs" / "README.md").read_text()
    assert "<!-- generated by `posenc report`: commands posenc -->" in docs


def test_every_command_says_what_it_does_in_a_sentence_and_every_flag_has_help():
    parser = cli.build_parser()
    assert parser.description == "Positional encodings for transformers."
    for name, command in cli._commands(parser).choices.items():
        description = command.description
        assert description[0].isupper() and description.endswith(".") and not description.isupper(), name
        for action in command._actions:
            assert action.help and not action.help.isupper(), f"posenc {name} {action.dest}: no help"


@pytest.mark.parametrize("command, module", [(["extrapolate"], "extrapolate"), (["task", "copy"], "tasks"),
                                             (["extend"], "extend"), (["pretrained", "tiny"], "pretrained")])
def test_a_run_folder_through_a_file_is_refused_before_any_work(command, module, monkeypatch, recorded, tmp_path,
                                                                 capsys):
    monkeypatch.setattr(f"posenc.experiments.{module}.run", _raising(AssertionError("ran")))
    (tmp_path / "notes").write_text("a file")
    for out in (tmp_path / "notes", tmp_path / "notes" / "run"):
        assert cli.main([*command, "--preset", "smoke", "--out", str(out)]) == 2
        assert capsys.readouterr().err == (f"posenc {command[0]}: error: --out: cannot write {out}: "
                                           f"{tmp_path / 'notes'} is not a folder\n")
    assert (tmp_path / "notes").read_text() == "a file"
