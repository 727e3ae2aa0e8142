"""Each experiment command's line (``experiments/<name>/command.py``) read by the real parser, without running
anything: where a new run goes, what reaches the config, and the refusals of flags the run would ignore, each
message whole. ``tests/test_cli_matrix.py`` runs the flags end to end."""

import re
import time
from pathlib import Path

import pytest

from posenc.cli import build_parser
from posenc.experiments.arguments import run_folder
from posenc.experiments.extend import command as extend
from posenc.experiments.pretrained import command as pretrained
from posenc.experiments.pretrained.config import HF_PRESETS
from posenc.experiments.tasks import command as task
from posenc.experiments.tasks.config import PRESETS as TASK_PRESETS



def _parsed(*argv: str):
    """argv read by a parser built now (one built at import would miss what a test changes in the commands)."""
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("argv, folder, shown", [
    (["extrapolate"], r"\d{8}-\d{6}", "<timestamp>"),
    (["task", "recall"], r"recall-\d{8}-\d{6}", "<task>-<timestamp>"),
    (["extend"], r"extend-\d{8}-\d{6}", "extend-<timestamp>"),
    (["pretrained"], r"extend-hf-\d{8}-\d{6}", "extend-hf-<timestamp>"),
], ids=["extrapolate", "task", "extend", "pretrained"])
def test_a_new_run_without_out_gets_a_dated_folder_under_runs_as_the_help_says(argv, folder, shown):
    before = time.strftime("%Y%m%d-%H%M")
    path = run_folder(_parsed(*argv))
    assert path.parent == Path("runs") and re.fullmatch(folder, path.name), path
    assert before in path.name or time.strftime("%Y%m%d-%H%M") in path.name  # today's date, this minute
    out = next(a for a in build_parser()._subparsers._group_actions[0].choices[argv[0]]._actions if a.dest == "out")
    assert out.help == f"run directory (default: runs/{shown})"


def test_a_task_run_reads_its_task_and_preset_and_all_or_default_mean_the_presets_rows():
    config = task.config_of(_parsed("task", "recall", "--preset", "smoke", "--steps", "3"))
    assert (config.task, config.preset, config.steps) == ("recall", "smoke", 3)
    preset_rows = task.config_of(_parsed("task", "copy", "--preset", "smoke")).encodings
    for spec in ("all", "default"):
        assert task.config_of(_parsed("task", "copy", "--preset", "smoke", "--encodings", spec)).encodings == \
            preset_rows
    assert task.config_of(_parsed("task", "copy", "--encodings", "alibi,rope")).encodings == "alibi,rope"
    assert TASK_PRESETS["smoke"] != TASK_PRESETS["default"]
    with pytest.raises(ValueError, match=r"^--lr-widenings widens a grid of --lrs; give --lrs too$"):
        task.config_of(_parsed("task", "copy", "--lr-widenings", "1"))


def test_extend_refuses_text_beside_a_run_and_takes_either_alone():
    with pytest.raises(ValueError) as refusal:
        extend.config_of(_parsed("extend", "--run", "runs/r", "--text", "t.txt"))
    assert str(refusal.value) == "--text trains new base models; with --run the run's own corpus is used"
    for argv in (["--run", "runs/r"], ["--text", "t.txt"], []):
        assert extend.config_of(_parsed("extend", "--preset", "smoke", "--factor", "4", *argv)).factor == 4


def test_a_pretrained_run_reads_its_model_or_the_presets():
    assert pretrained.config_of(_parsed("pretrained", "tiny", "--preset", "quick")).model == "tiny"
    assert pretrained.config_of(_parsed("pretrained", "--preset", "quick")).model == HF_PRESETS["quick"]["model"]
    with pytest.raises(SystemExit):  # an argument error, listing the presets
        _parsed("pretrained", "--preset", "huge")


FINE_TUNING = {"--finetune-method": "ntk", "--finetune-window": "32", "--pose-chunks": "3", "--finetune-lr": "1e-4",
               "--lora": "4", "--finetune-steps": "2", "--finetune-batch": "2"}


@pytest.mark.parametrize("flag", FINE_TUNING)
def test_each_fine_tuning_flag_without_fine_tuning_is_refused_by_name(flag):
    with pytest.raises(ValueError) as refusal:
        pretrained.config_of(_parsed("pretrained", "tiny", "--preset", "smoke", "--finetune", "none", flag,
                                     FINE_TUNING[flag]))
    assert str(refusal.value) == f"{flag} apply to fine-tuning: add --finetune pose (or full)"


def test_every_ignored_flag_is_named_in_one_refusal():
    argv = ["pretrained", "tiny", "--preset", "smoke", "--finetune", "none", "--lora", "4", "--finetune-lr", "1e-4"]
    with pytest.raises(ValueError) as refusal:
        pretrained.config_of(_parsed(*argv))
    assert str(refusal.value) == "--finetune-lr, --lora apply to fine-tuning: add --finetune pose (or full)"
    with pytest.raises(ValueError) as refusal:
        pretrained.config_of(_parsed("pretrained", "tiny", "--preset", "smoke", "--finetune", "full",
                                     "--finetune-window", "32", "--pose-chunks", "3"))
    assert str(refusal.value) == ("--finetune-window, --pose-chunks apply to --finetune pose; --finetune full trains "
                                  "on windows of --to")


@pytest.mark.parametrize("flags, message", [
    (["--pose-chunks", "3"], "--pose-chunks apply to --finetune pose; --finetune full trains on windows of --to"),
    (["--string-local", "64"], "--string-local apply to the string row: add string to --methods"),
    (["--self-extend-group", "4"], "--self-extend-group apply to the self-extend and rerope rows: add one to "
                                   "--methods"),
    (["--string-shift", "300", "--string-local", "64"], "--string-shift, --string-local apply to the string row: "
                                                        "add string to --methods"),
    (["--task-questions", "2"], "--task-questions apply to --retrieval-tasks: name multi-value or "
                                "variable-tracking"),
    (["--task-questions", "2", "--task-size", "3"], "--task-questions, --task-size apply to --retrieval-tasks: "
                                                    "name multi-value or variable-tracking"),
], ids=["pose chunks", "string local", "self-extend group", "both string", "task questions", "both task"])
def test_a_flag_for_rows_or_tasks_the_run_lacks_is_refused_naming_them(flags, message):
    finetune = ["--finetune", "full"] if flags[0] == "--pose-chunks" else []
    with pytest.raises(ValueError) as refusal:
        pretrained.config_of(_parsed("pretrained", "tiny", "--preset", "smoke", "--methods", "none,yarn",
                                     *finetune, *flags))
    assert str(refusal.value) == message


def test_a_swaps_flags_are_taken_where_its_row_runs():
    config = pretrained.config_of(_parsed("pretrained", "tiny", "--preset", "smoke", "--methods", "none,string",
                                          "--string-local", "64", "--string-shift", "300"))
    assert (config.string_local, config.string_shift) == (64, 300)
    config = pretrained.config_of(_parsed("pretrained", "tiny", "--preset", "smoke", "--methods", "rerope",
                                          "--self-extend-window", "16"))
    assert config.self_extend_window == 16


@pytest.mark.parametrize("command", [["extrapolate"], ["task", "copy"]], ids=["extrapolate", "task"])
def test_sweeping_seeds_are_taken_with_a_grid_of_rates(command):
    from posenc.experiments.extrapolate import command as extrapolate

    config_of = {"extrapolate": extrapolate.config_of, "task": task.config_of}[command[0]]
    config = config_of(_parsed(*command, "--preset", "smoke", "--seeds", "3", "--lrs", "1e-3,3e-3",
                               "--lr-sweep-seeds", "2"))
    assert (config.lrs, config.lr_sweep_seeds, config.sweep_seeds) == ((1e-3, 3e-3), 2, range(0, 2))


def test_extends_run_has_a_second_spelling_for_torchrun():
    for flag in ("--run", "--run-dir"):
        assert _parsed("extend", flag, "runs/r").run_dir == Path("runs/r")


def test_the_encodings_help_lists_the_rows():
    from posenc.experiments.extrapolate import DEFAULT_ROWS, all_rows
    from posenc.experiments.tasks.config import task_rows

    def help_of(command: str) -> str:
        subcommand = build_parser()._subparsers._group_actions[0].choices[command]
        return next(a for a in subcommand._actions if a.dest == "encodings").help

    assert help_of("extrapolate") == (f"'all', 'default' ({', '.join(DEFAULT_ROWS)}) or a comma list of: "
                                      f"{', '.join(all_rows())}")
    assert help_of("task").endswith(f"or 'all' (default: {', '.join(task_rows())})")


COMMANDS = {"extrapolate": ["extrapolate"], "task": ["task", "copy"], "extend": ["extend"],
            "pretrained": ["pretrained", "tiny"]}


@pytest.mark.parametrize("name", COMMANDS)
def test_without_a_preset_a_run_takes_the_default(name):
    from posenc.experiments.extrapolate import command as extrapolate

    config_of = {"extrapolate": extrapolate.config_of, "task": task.config_of, "extend": extend.config_of,
                 "pretrained": pretrained.config_of}[name]
    assert config_of(_parsed(*COMMANDS[name])).preset == "default"


@pytest.mark.parametrize("argv", [
    [*command, "--preset", "huge"] for command in COMMANDS.values()] + [
    ["task", "sort"], ["extend", "--device", "tpu"], ["pretrained", "--device", "tpu"]],
    ids=[f"{name} --preset" for name in COMMANDS] + ["task", "extend --device", "pretrained --device"])
def test_a_value_outside_the_choices_is_an_argument_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parsed(*argv)
    assert exit_.value.code == 2 and f"invalid choice: {argv[-1]}" in capsys.readouterr().err.replace("'", "")


@pytest.mark.parametrize("command", [["extend"], ["pretrained"]], ids=["extend", "pretrained"])
def test_each_device_is_a_choice(command):
    for device in ("auto", "cpu", "cuda"):
        assert _parsed(*command, "--device", device).device == device


def test_pretrained_refuses_a_corpus_beside_a_text():
    with pytest.raises(ValueError) as refusal:
        pretrained.config_of(_parsed("pretrained", "tiny", "--corpus", "stdlib", "--text", "t.txt"))
    assert str(refusal.value) == "--corpus and --text both name the documents: pass one"
