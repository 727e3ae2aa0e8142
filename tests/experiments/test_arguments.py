"""The commands' shared parsing: comma lists checked as argparse reads them, and flags generated from a config
dataclass's fields (their type, spelling and default, a switch for a bool, a field type with no reader refused)."""

import argparse
from dataclasses import dataclass

import pytest

from posenc.experiments.arguments import add_config_flags, comma_ints, comma_positive_floats, given


@dataclass(frozen=True)
class Sample:
    steps: int = 3
    group: int | None = None
    rate: float = 0.1
    rates: tuple[float, ...] = (0.1,)
    lengths: tuple[int, ...] = (1, 2)
    methods: tuple[str, ...] = ("a",)
    name: str = "x"
    fast: bool = False
    silent: int = 0  # no help: the presets' alone


HELP = {name: f"the {name}" for name in ("steps", "group", "rate", "rates", "lengths", "methods", "name", "fast")}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_flags(p, Sample, HELP, {"group": "--groups"})
    return p


def test_each_described_field_is_a_flag_read_as_its_type_and_absent_ones_stay_the_presets():
    args = parser().parse_args(["--steps", "4", "--groups", "2", "--rate", "0.5", "--rates", "1e-3,3e-3",
                                "--lengths", "1,2,4", "--methods", "a,b", "--name", "y", "--fast"])
    assert given(args, HELP) == {"steps": 4, "group": 2, "rate": 0.5, "rates": (1e-3, 3e-3), "lengths": (1, 2, 4),
                                 "methods": "a,b", "name": "y", "fast": True}
    assert given(parser().parse_args([]), HELP) == {}  # nothing given: every field the preset's
    assert "--silent" not in parser().format_help() and "the rates" in parser().format_help()


@pytest.mark.parametrize("argv", [["--steps", "x"], ["--rates", "0,1"], ["--lengths", "1,b"], ["--silent", "1"],
                                  ["--fast", "1"]])
def test_a_value_of_the_wrong_type_or_a_field_without_a_flag_is_an_argument_error(argv, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)
    assert "error:" in capsys.readouterr().err


def test_a_field_type_with_no_reader_is_refused_when_the_parser_is_built():
    @dataclass
    class Odd:
        table: dict | None = None

    with pytest.raises(TypeError, match=r"Odd.table: no flag type for 'dict'"):
        add_config_flags(argparse.ArgumentParser(), Odd, {"table": "a table"})


def test_comma_lists_are_read_and_checked():
    assert comma_ints("1,2,4") == (1, 2, 4) and comma_positive_floats("1e-3, 3e-3") == (1e-3, 3e-3)
    assert comma_ints("1,,2, ") == (1, 2)
    for text in ("", "0", "-1e-3", "nan", "inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError) as refusal:
            comma_positive_floats(text)
        assert str(refusal.value) == f"expected comma-separated numbers > 0, got {text!r}"
    with pytest.raises(argparse.ArgumentTypeError) as refusal:
        comma_ints("1.5")
    assert str(refusal.value) == "expected comma-separated integers, got '1.5'"


def test_a_switch_keeps_its_fields_name_under_another_spelling_and_its_help():
    p = argparse.ArgumentParser()
    add_config_flags(p, Sample, {"fast": "run fast"}, {"fast": "--quick"})
    assert given(p.parse_args(["--quick"]), {"fast": ""}) == {"fast": True}
    assert "run fast" in p.format_help()


def test_lr_widenings_need_a_grid_to_widen():
    from posenc.experiments.arguments import check_widenings

    check_widenings(argparse.Namespace(lr_widenings=None, lrs=None))
    check_widenings(argparse.Namespace(lr_widenings=1, lrs=(1e-3, 3e-3)))
    with pytest.raises(ValueError) as refusal:
        check_widenings(argparse.Namespace(lr_widenings=1, lrs=None))
    assert str(refusal.value) == "--lr-widenings widens a grid of --lrs; give --lrs too"


def test_a_new_run_gets_a_dated_folder_named_by_its_arguments_and_resume_needs_out(monkeypatch, tmp_path):
    from posenc.experiments.arguments import add_run_folder, run_folder

    p = argparse.ArgumentParser()
    p.add_argument("task")
    add_run_folder(p, "{task}-%Y%m%d", "<task>-<date>")
    monkeypatch.setattr("time.localtime", lambda *_: (2026, 11, 28, 1, 2, 3, 5, 332, 0))
    monkeypatch.chdir(tmp_path)
    assert str(run_folder(p.parse_args(["copy"]))) == "runs/copy-20261128"
    (tmp_path / "runs" / "copy-20261128").mkdir(parents=True)  # a run started in the same second (or day, here)
    assert str(run_folder(p.parse_args(["copy"]))) == "runs/copy-20261128-2"  # not "--out ... already holds a run"
    (tmp_path / "runs" / "copy-20261128-2").mkdir()
    assert str(run_folder(p.parse_args(["copy"]))) == "runs/copy-20261128-3"
    assert run_folder(p.parse_args(["copy", "--out", str(tmp_path), "--resume"])) == tmp_path
    with pytest.raises(ValueError) as refusal:
        run_folder(p.parse_args(["copy", "--resume"]))
    assert str(refusal.value) == "--resume needs --out: the run directory to continue"
    assert "runs/<task>-<date>" in p.format_help()
    assert "continue the run in --out, skipping finished work" in " ".join(p.format_help().split())  # as wrapped


def test_a_default_preset_restates_none_of_its_configs_defaults():
    """Each command's defaults are written once, as its config's field defaults; a preset lists only what it changes
    (pretrained's default preset fine-tunes, which its config alone does not)."""
    import dataclasses

    from posenc.experiments.extend.config import PRESETS as EXTEND, ExtendConfig
    from posenc.experiments.extrapolate.config import PRESETS as EXTRAPOLATE, ExperimentConfig
    from posenc.experiments.pretrained.config import HF_PRESETS, PretrainedConfig
    from posenc.experiments.tasks.config import PRESETS as TASKS, TaskConfig

    for presets, config in ((EXTRAPOLATE, ExperimentConfig), (TASKS, TaskConfig), (EXTEND, ExtendConfig),
                            (HF_PRESETS, PretrainedConfig)):
        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        restated = {k: v for k, v in presets["default"].items() if defaults.get(k) == v}
        assert not restated, f"{config.__name__}: the default preset restates {restated}"
        built = config.from_preset("copy", "default") if config is TaskConfig else config.from_preset("default")
        assert set(presets["default"]) <= set(defaults) and built == config(**presets["default"])

