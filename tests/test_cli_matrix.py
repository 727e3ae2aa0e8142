"""Every flag in every command's ``--help`` runs end to end at smoke size, several per run: ``extrapolate``,
``task`` (copy, recall), ``extend``, ``pretrained``, ``verify``, ``plot``, ``bench`` and ``report``. A new flag with no run here fails
``test_every_flag_of_every_command_has_a_run``. Each run checks that its flags reached the results it wrote."""

import json
from pathlib import Path

import pytest

from posenc.cli import build_parser, main

TEXT = Path(__file__).resolve().parents[1] / "src" / "posenc"  # a folder of text: the package's own sources
SMALL = ["--preset", "smoke", "--steps", "4", "--batch-size", "4", "--lr", "2e-3", "--dim", "16", "--layers", "1",
         "--heads", "2", "--device", "cpu"]

# name -> argv (OUT stands for the run's folder, RUN for the extrapolate run that extend and plot read)
RUNS = {
    "extrapolate": ["extrapolate", *SMALL, "--encodings", "rope,alibi", "--text", str(TEXT), "--train-length", "16",
                    "--eval-factors", "1,2", "--eval-stride", "8", "--eval-windows", "2", "--seeds", "2", "--seed", "3",
                    "--lrs", "1e-3,3e-3", "--lr-widenings", "0", "--compare", "alibi:rope@2", "--out", "RUN"],
    "extrapolate --resume": ["extrapolate", *SMALL, "--encodings", "rope,alibi", "--text", str(TEXT),
                             "--train-length", "16", "--eval-factors", "1,2", "--eval-stride", "8", "--eval-windows",
                             "2", "--seeds", "2", "--seed", "3", "--lrs", "1e-3,3e-3", "--lr-widenings", "0",
                             "--out", "RUN", "--resume"],
    "extrapolate --compile": ["extrapolate", *SMALL, "--encodings", "rope", "--train-length", "16", "--eval-factors",
                              "1", "--eval-windows", "1", "--compile", "--out", "OUT"],
    "extrapolate --lr-sweep-seeds": ["extrapolate", *SMALL, "--encodings", "rope", "--train-length", "16",
                                     "--eval-factors", "1", "--eval-windows", "1", "--seeds", "2", "--lrs",
                                     "1e-3,3e-3", "--lr-widenings", "0", "--lr-sweep-seeds", "1", "--warmup", "3",
                                     "--out", "OUT"],
    "task copy": ["task", "copy", *SMALL, "--encodings", "alibi,rope+randomized",
                                "--train-length", "8", "--eval-factors", "1,2", "--seeds", "2", "--seed", "1",
                                "--lrs", "1e-3,3e-3", "--lr-widenings", "0", "--lr-sweep-seeds", "1", "--out", "OUT"],
    "task recall": ["task", "recall", *SMALL, "--encodings", "rope", "--train-length",
                                  "8", "--eval-factors", "1,2", "--warmup", "3", "--out", "OUT"],
    "extend": ["extend", "--preset", "smoke", "--run", "RUN", "--factor", "2", "--methods", "pi,longrope",
               "--finetune-steps", "2", "--finetune-warmup", "1", "--finetune-batch", "2", "--finetune-lrs", "1e-3,3e-3", "--finetune-widenings",
               "0", "--seeds", "1", "--search-population", "4", "--search-generations", "1", "--search-windows", "1",
               "--sweep-windows", "2", "--curve-windows", "2", "--eval-stride", "16", "--device", "cpu", "--out", "OUT"],
    "extend --only-seeds": ["extend", "--preset", "smoke", "--run", "RUN", "--factor", "2", "--methods", "pi",
                            "--finetune-steps", "1", "--finetune-lrs", "1e-3", "--seeds", "2", "--only-seeds", "4",
                            "--out", "OUT"],
    "extend --from-scratch": ["extend", "--preset", "smoke", "--from-scratch", "--text", str(TEXT), "--methods", "ntk",
                              "--finetune-steps", "1", "--out", "OUT"],
    "pretrained": ["pretrained", "tiny", "--preset", "smoke", "--to", "1024", "--methods", "none,yarn",
                    "--corpus", "stdlib", "--documents", "2", "--dev-documents", "2", "--keys-per-band", "1",
                    "--retrieval-format", "remember", "--retrieval-tasks", "multi-value,variable-tracking",
                    "--task-questions", "1", "--task-size", "2", "--control-stride", "256", "--finetune", "pose", "--finetune-method", "ntk", "--finetune-window",
                    "64", "--pose-chunks", "3", "--finetune-lr", "1e-3", "--finetune-steps", "2", "--finetune-batch",
                    "1", "--lora", "2", "--export", "OUT/exported", "--device", "cpu", "--out", "OUT"],
    "pretrained self-extend": ["pretrained", "tiny", "--preset", "smoke", "--methods",
                                "self-extend,longrope,string,dca", "--finetune", "none", "--documents", "2",
                                "--draw", "seeded",
                                "--dev-documents", "2", "--self-extend-window", "64", "--self-extend-group", "4",
                                "--string-shift", "600", "--string-local", "64", "--search-population", "4",
                                "--search-generations", "1", "--text", str(TEXT), "--out", "OUT"],
    "verify": ["verify", "--device", "cpu", "--dtype", "float64", "--json", "OUT/verify.json"],
    "plot": ["plot", "--out", "OUT", "--ckpt", "RUN"],
    "bench": ["bench", "--device", "cpu", "--dtype", "float32", "--tables", "attention,training,rope,memory",
              "--encodings", "alibi,t5", "--lengths", "16", "--train-shapes", "8x2", "--rope-shape", "1,2,16,8",
              "--rounds", "2", "--backend", "eager", "--markdown", "OUT/bench.md", "--json", "OUT/bench.json"],
    "bench --compile": ["bench", "--tables", "training", "--encodings", "none", "--train-shapes", "8x2", "--rounds",
                        "2", "--compile", "--dtype", "bfloat16", "--json", "OUT/bench.json"],
    "bench --tables long": ["bench", "--tables", "long", "--encodings", "fox", "--long-shapes", "1x2x16x8", "--rounds",
                            "2", "--long-timeout", "60", "--long-json", "OUT/long.json"],
    "report": ["report", "--check", str(Path(__file__).resolve().parents[1] / "README.md")],
}
RESUMED = ("extend", "pretrained self-extend", "task recall")  # run again with --resume: every stage read back, the same results


def command_flags() -> dict[str, list[tuple[str, ...]]]:
    """{command: [the option strings of each of its flags]} from the parser itself (help left out)."""
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    return {name: [tuple(a.option_strings) for a in parser._actions if a.option_strings and a.dest != "help"]
            for name, parser in subparsers.choices.items()}


def test_every_flag_of_every_command_has_a_run():
    missing = []
    for command, flags in command_flags().items():
        used = {arg for name, argv in RUNS.items() if argv[0] == command
                for arg in argv + (["--resume"] if name in RESUMED else []) if arg.startswith("--")}
        missing += [f"{command} {options[0]}" for options in flags if not used & set(options)]
    assert not missing, f"flags with no run in tests/test_cli_matrix.py: {missing}"
    assert {argv[1] for argv in RUNS.values() if argv[0] == "task"} == {"copy", "recall"}


@pytest.fixture(scope="module")
def extrapolated(tmp_path_factory):
    run = tmp_path_factory.mktemp("matrix") / "run"
    assert main(_resolved(RUNS["extrapolate"], run, run)) == 0
    return run


def _resolved(argv: list[str], out: Path, run: Path) -> list[str]:
    return [a.replace("OUT", str(out)) if a.startswith("OUT") else str(run) if a == "RUN" else a for a in argv]


@pytest.mark.parametrize("name", [name for name in RUNS if name != "extrapolate"])
def test_each_run_of_the_matrix_succeeds_and_its_flags_reach_the_results(name, extrapolated, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_resolved(RUNS[name], out, extrapolated)) == 0, capsys.readouterr().err[-2000:]
    printed = capsys.readouterr().out
    if name in RESUMED:
        first = _json(out / "results.json")["rows"]
        assert main(_resolved(RUNS[name], out, extrapolated) + ["--resume"]) == 0, capsys.readouterr().err[-2000:]
        assert _json(out / "results.json")["rows"] == first
    check = CHECKS.get(name)
    if check is not None:
        check(out, extrapolated, printed)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _check_resumed(out, run, printed):
    results = _json(run / "results.json")
    assert results["config"]["seeds"] == 2 and results["config"]["seed"] == 3 and results["config"]["eval_stride"] == 8
    assert {row["name"] for row in results["rows"]} == {"rope", "alibi"}
    for row in results["rows"]:  # each seed chose one of the two rates on dev; extend and plot read those weights
        assert [list(sweep["scores"]) for sweep in row["rate_sweeps"]] == [["0.001", "0.003"]] * 2
        assert all(lr in (1e-3, 3e-3) for lr in row["learning_rates"])


def _check_one_seed_of_two(out, run, printed):
    assert not (out / "results.json").exists() and "seeds [4] done" in printed
    assert {path.name.rsplit("-", 1)[1] for path in (out / "evals").rglob("*.json")} == {"seed4.json"}


def _check_compiled(out, run, printed):
    assert _json(out / "results.json")["config"]["compile"] is True


def _check_copy(out, run, printed):
    results = _json(out / "results.json")
    assert results["config"]["task"] == "copy" and results["config"]["seed"] == 1
    assert [row["name"] for row in results["rows"]] == ["alibi", "rope+randomized"]
    for row in results["rows"]:  # each row chose one of the two rates on dev, nothing added past the grid
        assert list(row["rate_sweeps"][0]["scores"]) == ["0.001", "0.003"] and row["learning_rates"][0] in (1e-3, 3e-3)
        assert row["rate_sweeps"][1]["inherited_from"] == [1]  # seed 2 swept nothing: seed 1's rate
        assert row["learning_rates"][1] == row["learning_rates"][0]


def _check_one_seed_sweeps(out, run, printed):
    results = _json(out / "results.json")
    assert results["config"]["lr_sweep_seeds"] == 1 and results["config"]["seeds"] == 2
    assert results["config"]["warmup"] == 3  # --steps 4 alone would keep smoke's share: round(4 × 5 / 20) = 1


def _check_recall(out, run, printed):
    config = _json(out / "results.json")["config"]
    assert config["task"] == "recall" and config["warmup"] == 3


def _check_extend(out, run, printed):
    results = _json(out / "results.json")
    assert results["config"]["factor"] == 2 and results["config"]["finetune_lrs"] == [1e-3, 3e-3]
    assert results["config"]["finetune_warmup"] == 1
    assert all(list(sweep["dev_bits"]) == ["0.001", "0.003"] for sweep in results["sweep"].values())  # no widening
    assert (out / "rope_parameters.json").exists()


def _check_from_scratch(out, run, printed):
    config = _json(out / "results.json")["config"]
    assert config["from_scratch"] is True
    assert config["finetune_warmup"] == 0  # --finetune-steps 1 keeps smoke's fraction: round(1 × 2 / 8)


def _check_hf(out, run, printed):
    results = _json(out / "results.json")
    config = results["config"]
    assert (config["finetune_method"], config["lora"], config["pose_chunks"], config["finetune_window"]) == ("ntk", 2, 3, 64)
    assert list(results["rows"]) == ["none", "yarn", "ntk+pose", "ntk+control"]
    assert len(results["rows"]["none"]["test"]) == 2 and results["control"]["context"] == [257, 512]
    assert results["retrieval_format"] == "remember" and list(results["calibration"]["formats"]) == ["remember"]
    assert (config["retrieval_tasks"], config["task_questions"], config["task_size"]) == (
        ["multi-value", "variable-tracking"], 1, 2)
    for row in results["rows"].values():  # one question of each task in each of 2 documents, beside 4 keys each
        assert row["keys"]["total"] == 8 and [cell["total"] for cell in row["tasks"].values()] == [2, 2]
    assert {"multi-value found: ntk+pose − ntk+control", "variable-tracking found: ntk+pose − ntk+control"} <= set(
        results["comparisons"])
    assert "RULER's multi-value" in (out / "results.md").read_text()
    assert (out / "exported" / "config.json").exists()


def _check_self_extend(out, run, printed):
    results = _json(out / "results.json")
    assert results["self_extend_group"] == 4 and results["rows"]["self-extend"]["attention"] == "self-extend"
    assert results["string_shift"] == 600 and results["config"]["string_local"] == 64
    assert results["rows"]["string"]["attention"] == "string" and "loss past: string − context control" in results["comparisons"]
    assert results["rows"]["dca"]["attention"] == "dca" and results["dca"] == {"chunk_size": 384, "local": 32}
    assert results["corpus"]["source"] != "stdlib"


def _check_verify(out, run, printed):
    verified = _json(out / "verify.json")
    assert verified["dtype"] == "float64" and all(row["passed"] for row in verified["rows"])


def _check_plot(out, run, printed):
    assert any(p.suffix == ".png" for p in out.iterdir())


def _check_bench(out, run, printed):
    tables = _json(out / "bench.json")["tables"]
    assert set(tables) == {"attention", "training", "rope", "memory"}  # forms: tests/bench
    for name in ("attention", "training", "memory"):  # the chosen encodings, and NoPE as the baseline
        assert {row["encoding"] for row in tables[name]} == {"none", "alibi", "t5"}, name
    assert {row["length"] for row in tables["attention"]} == {16} and (out / "bench.md").stat().st_size > 0
    for name in ("training", "memory"):  # --backend eager for all but the baseline
        assert {(row["encoding"], row["backend"]) for row in tables[name]} == {
            ("none", "auto"), ("alibi", "eager"), ("t5", "eager")}, name


def _check_compiled_bench(out, run, printed):
    rows = _json(out / "bench.json")["tables"]["training"]
    assert {row["encoding"] for row in rows} == {"none"} and [row["compiled"] for row in rows] == [False, True]


def _check_long_bench(out, run, printed):
    rows = json.loads((out / "long.json").read_text())  # each row in its own process; flex has no CPU backward
    assert [(row["encoding"], row["T"], "ms" in row) for row in rows] == [
        ("sdpa (no positions)", 16, True), ("flex (no positions)", 16, False), ("flex + alibi score_mod", 16, False),
        ("none", 16, True), ("fox", 16, True)]


CHECKS = {"extrapolate --resume": _check_resumed, "extrapolate --compile": _check_compiled,
          "task copy": _check_copy, "task recall": _check_recall,
          "extrapolate --lr-sweep-seeds": _check_one_seed_sweeps,
          "extend": _check_extend, "extend --from-scratch": _check_from_scratch,
          "extend --only-seeds": _check_one_seed_of_two, "pretrained": _check_hf,
          "pretrained self-extend": _check_self_extend, "verify": _check_verify, "plot": _check_plot,
          "bench": _check_bench, "bench --compile": _check_compiled_bench, "bench --tables long": _check_long_bench}
