"""Every command's pin read as the current version reads it (``experiments.pinning``). Each pin here is written by
hand the old way, without a field that came later. The field reads as what the old run did, so the resume goes
ahead when the new config does the same, and is refused, with the field named, when it does not."""

import dataclasses
import re

import pytest

from posenc import storage
from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.plan import _read_run, pin_config
from posenc.experiments.extrapolate import ExperimentConfig
from posenc.experiments.extrapolate.checkpoints import trained_models
from posenc.experiments.extrapolate.config import TRAINING_FIELDS
from posenc.experiments.extrapolate.rows import parse_rows
from posenc.experiments.extrapolate.stages import prepare_run_dir
from posenc.experiments.pinning import WHEN_ABSENT, open_pin, pin_kind, read_run
from posenc.experiments.pretrained.config import PretrainedConfig, plan_rows
from posenc.experiments.pretrained.pins import declared_family, pin
from posenc.experiments.tasks import TaskConfig
from posenc.experiments.tasks.stages import _prepare
from posenc.lm.model import LanguageModel

GRID = (1e-3, 3e-3)
#: (the field, a config that does what a run from before the field did, a config that does not)
RATE_FIELDS = [("lrs", {}, {"lrs": GRID}),
               ("lr_widenings", {"lrs": GRID}, {"lrs": GRID, "lr_widenings": 0}),
               ("lr_sweep_seeds", {"lrs": GRID, "seeds": 2}, {"lrs": GRID, "seeds": 2, "lr_sweep_seeds": 1})]


def extrapolate_config(**overrides) -> ExperimentConfig:
    return ExperimentConfig.from_preset("smoke", **{"encodings": "rope", "device": "cpu", **overrides})


def task_config(**overrides) -> TaskConfig:
    return TaskConfig.from_preset("copy", "smoke", **{"encodings": "alibi", "device": "cpu", **overrides})


def without(values: dict, field: str) -> dict:
    """``values`` as a pin written before ``field`` existed holds them."""
    assert field in values
    return {k: v for k, v in values.items() if k != field}


#: {a training command's table in WHEN_ABSENT: (how it pins a run, its config, how its refusal ends)}
TRAINERS = {"extrapolate": (prepare_run_dir, extrapolate_config, "; only rows, seeds and evaluation settings"),
            "tasks": (_prepare, task_config, "$")}


@pytest.mark.parametrize("command", TRAINERS)
@pytest.mark.parametrize("field, kept, changed", RATE_FIELDS)
def test_a_run_from_before_a_rate_field_resumes_only_as_it_trained(tmp_path, command, field, kept, changed):
    prepare, make, end = TRAINERS[command]
    old = make(**kept)
    assert old.to_dict()[field] == WHEN_ABSENT[command][field]
    storage.write_json(tmp_path / "config.json", without(old.to_dict(), field))
    prepare(tmp_path, old, resume=True)
    with pytest.raises(ValueError, match=rf"was trained with a different config \(differs in \['{field}'\]\){end}"):
        prepare(tmp_path, make(**changed), resume=True)


@pytest.mark.parametrize("field, kept, changed", RATE_FIELDS)
def test_extend_resumes_on_a_base_from_before_a_rate_field_only_as_it_trained(tmp_path, field, kept, changed):
    """extend pins its base model's training fields: a base pinned before a rate field is the same base model."""
    config, old = ExtendConfig.from_preset("smoke"), extrapolate_config(**kept)
    base = without({name: old.to_dict()[name] for name in TRAINING_FIELDS}, field)
    storage.write_json(tmp_path / "config.json", {"extend": config.to_dict(), "base": base, "run": None})
    pin_config(tmp_path, config, old, None, resume=True)
    with pytest.raises(ValueError, match=r"was run with a different config \(differs in \['base model'\]\)"):
        pin_config(tmp_path, config, extrapolate_config(**changed), None, resume=True)


def test_extend_refuses_a_pin_from_before_a_result_field_with_the_field_named(tmp_path):
    """Its result fields have no shims: a pin without one ran another protocol (one rate, not a grid on dev)."""
    config, base = ExtendConfig.from_preset("smoke"), extrapolate_config()
    assert WHEN_ABSENT["extend"] == {}
    old = {"extend": without(config.to_dict(), "sweep_windows"), "base": base.training_dict(), "run": None}
    storage.write_json(tmp_path / "config.json", old)
    with pytest.raises(ValueError, match=r"differs in \['sweep_windows'\]\); only --methods"):
        pin_config(tmp_path, config, base, None, resume=True)


@pytest.mark.parametrize("field, kept, changed", RATE_FIELDS)
def test_plot_and_extend_read_an_extrapolate_run_from_before_a_rate_field(tmp_path, field, kept, changed):
    """``posenc plot --ckpt`` and ``posenc extend --run`` read the run's pin through ``ExperimentConfig.from_dict``."""
    old = extrapolate_config(**kept)
    storage.write_json(tmp_path / "config.json", without(old.to_dict(), field))
    model = LanguageModel(old.model_config(parse_rows("rope")[0], {}))
    storage.save_weights(tmp_path / "checkpoints" / "rope-seed0" / "model.safetensors", model.state_dict())
    assert ExperimentConfig.from_dict(storage.read_json(tmp_path / "config.json")) == old
    assert list(trained_models(tmp_path)) == ["rope"]
    assert _read_run(tmp_path, ExtendConfig.from_preset("smoke"), "cpu") == (old, False)


@pytest.mark.parametrize("field, kept, changed", [
    ("retrieval_format", {"retrieval_format": "secret-word"}, {}),  # keys planted before wordings were calibrated
    ("string_local", {}, {"string_local": 8}),  # any other field newer than the run: what its default does
])
def test_pretrained_resumes_a_run_from_before_a_config_field_only_as_it_measured(tmp_path, field, kept, changed):
    old = PretrainedConfig.from_preset("smoke", **kept)
    storage.write_json(tmp_path / "config.json", {"hf": without(old.to_dict(), field)})
    pin(tmp_path, old, resume=True)
    storage.write_json(tmp_path / "config.json", {"hf": without(old.to_dict(), field)})
    with pytest.raises(ValueError, match=rf"was run with a different config \(differs in \['{field}'\]\)$"):
        pin(tmp_path, PretrainedConfig.from_preset("smoke", **changed), resume=True)


def test_pretrained_reads_a_pin_from_before_corpora_commits_and_families(tmp_path):
    """No corpus: the resume takes this one's, then holds the run to it; no commits: this one is the first listed;
    no first rows: the family was not declared, and a resume does not declare it after the fact."""
    config = PretrainedConfig.from_preset("smoke", retrieval_format="secret-word")
    storage.write_json(tmp_path / "config.json", {"hf": config.to_dict()})
    not_recorded = {"declared": "not recorded (the run was pinned before families were)", "exploratory": False}
    assert declared_family(tmp_path, {}) == not_recorded
    stdlib = {"source": "python3.11.7 stdlib", "sha256": "6542f7510a0b9f4f"}
    assert pin(tmp_path, config, resume=True, corpus=stdlib, commit="b2") == ["b2"]
    held = storage.read_json(tmp_path / "config.json")
    assert held["corpus"] == stdlib and held["first_rows"] is None
    assert declared_family(tmp_path, {"none": {}}) == not_recorded
    with pytest.raises(ValueError, match=r"was measured on another corpus \(python3.11.7 stdlib"):
        pin(tmp_path, config, resume=True, corpus={"source": "python3.12.3 stdlib", "sha256": "01234567"})


@pytest.mark.parametrize("kind, start, message", [
    ("extend", "posenc extend --out X", "holds no posenc extend run (no config.json there); start one "
                                        "with: posenc extend --out X"),
    ("task", None, "holds no posenc task run (no config.json there)"),
])
def test_a_pin_needs_resume_and_a_resume_needs_a_pin(tmp_path, kind, start, message):
    assert open_pin(tmp_path, False, kind=kind, start=start) is None
    with pytest.raises(ValueError, match=r"^--resume: .* " + re.escape(message) + "$"):
        open_pin(tmp_path, True, kind=kind, start=start)
    pin = {"extend": {"factor": 2}, "base": {}} if kind == "extend" else {"task": "copy"}
    storage.write_json(tmp_path / "config.json", pin)
    assert open_pin(tmp_path, True, kind=kind, start=start) == pin
    with pytest.raises(ValueError, match=r"^--out .* already holds a run; pass --resume to continue it or choose "):
        open_pin(tmp_path, False, kind=kind, start=start)


@pytest.mark.parametrize("pin, kind", [({"steps": 3}, "extrapolate"), ({"task": "copy", "steps": 3}, "task"),
                                       ({"extend": {}, "base": {}}, "extend"), ({"hf": {}, "corpus": None},
                                                                                "pretrained")])
def test_a_run_of_another_command_is_named_not_read_as_this_ones(tmp_path, pin, kind):
    """extend --run and plot --ckpt on a task run failed on an unexpected keyword 'task', a resume of an extend run
    as extrapolate named fields that differ: each now names the run it found."""
    storage.write_json(tmp_path / "config.json", pin)
    assert pin_kind(pin) == kind and read_run(tmp_path, kind, "--run") == pin
    for other in {"extrapolate", "task", "extend", "pretrained"} - {kind}:
        with pytest.raises(ValueError, match=rf"^--run {re.escape(str(tmp_path))}: a posenc {kind} run, not a "
                                             rf"posenc {other} run$"):
            read_run(tmp_path, other, "--run")
        with pytest.raises(ValueError, match=rf"^--resume --out .*: a posenc {kind} run, not a posenc {other} run$"):
            open_pin(tmp_path, True, kind=other)


def test_a_run_pinned_before_compare_existed_declared_no_comparisons(tmp_path):
    """extrapolate's collect reads --compare through the table: a pin without it declared none, so a resume
    without --compare keeps the family declared and one with it is exploratory."""
    from posenc.experiments.extrapolate.collect import declared
    from posenc.experiments.extrapolate.config import ExperimentConfig

    config = ExperimentConfig.from_preset("smoke")
    pin = {k: v for k, v in config.to_dict().items() if k != "compare"}
    storage.write_json(tmp_path / "config.json", pin)
    assert declared(config, tmp_path)["exploratory"] is False
    later = ExperimentConfig.from_preset("smoke", seeds=2, compare="alibi:rope")
    assert declared(later, tmp_path)["exploratory"] is True


def test_a_pretrained_run_pinned_before_finetune_existed_was_zero_shot_and_may_add_it(tmp_path):
    config = PretrainedConfig.from_preset("smoke", finetune="none")
    pin(tmp_path, config, resume=False)
    held = storage.read_json(tmp_path / "config.json")
    del held["hf"]["finetune"]  # written before --finetune existed: a zero-shot run
    storage.write_json(tmp_path / "config.json", held)
    pin(tmp_path, PretrainedConfig.from_preset("smoke", finetune="pose"), resume=True)  # adds the fine-tuned rows


def test_changed_fields_reads_tuples_as_lists_names_one_sided_fields_and_fills_defaults():
    from posenc.experiments.pinning import changed_fields

    current = {"same": (1, (2, 3)), "item": (1, 2), "value": 5, "only_now": 1}
    held = {"same": [1, [2, 3]], "item": [1, 3], "value": 6, "only_then": 2}
    assert changed_fields(current, held, "extend") == ["item", "only_now", "only_then", "value"]
    assert changed_fields(current, held, "extend", fields=["value", "same"]) == ["value"]
    assert changed_fields({"x": 3}, {}, "extend", defaults={"x": 3}) == []  # the pin's missing field, as default
    assert changed_fields({"x": 3}, {}, "extend", defaults={"x": 4}) == ["x"]


def test_a_pretrained_family_is_declared_by_its_first_rows_and_exploratory_once_rows_join(tmp_path):
    """The rows the first invocation planned date the family; a resume that adds rows makes it exploratory and says
    which joined, in the order of the rows; a resume that measures fewer rows keeps it declared."""
    first = PretrainedConfig.from_preset("smoke", methods=("none", "yarn"), finetune="none")
    pin(tmp_path, first, resume=False)
    declared = {"declared": "before the run: extend --hf's fixed comparisons of the rows its first invocation "
                            "planned", "exploratory": False}
    assert declared_family(tmp_path, plan_rows(first)) == declared
    assert declared_family(tmp_path, {"yarn": {}}) == declared
    grown = PretrainedConfig.from_preset("smoke", methods=("none", "ntk", "yarn", "dca"), finetune="none")
    pin(tmp_path, grown, resume=True)
    assert storage.read_json(tmp_path / "config.json")["first_rows"] == ["none", "yarn"]  # kept from the first
    assert declared_family(tmp_path, plan_rows(grown)) == {
        "declared": "after results were seen: ntk, dca joined on --resume a run whose earlier rows had been measured",
        "exploratory": True}
    pin(tmp_path, dataclasses.replace(grown, preset="quick"), resume=True)  # a preset's name: only its rows differ
    with pytest.raises(ValueError, match=rf"^--resume: {tmp_path} was run with a different config \(differs in "
                                         r"\['chunk'\]\)$"):
        pin(tmp_path, dataclasses.replace(grown, chunk=grown.chunk * 2), resume=True)


def test_a_pretrained_resume_names_the_missing_run_and_both_corpora(tmp_path):
    config = PretrainedConfig.from_preset("smoke")
    with pytest.raises(ValueError, match=rf"holds no posenc pretrained run \(no config.json there\); start one with: "
                                         rf"posenc pretrained {config.model} --out {tmp_path}$"):
        pin(tmp_path, config, resume=True)
    pin(tmp_path, config, resume=False, corpus={"files": 3})  # a fingerprint without a source or hash
    with pytest.raises(ValueError, match=r"another corpus \(\?, sha256 \?, not kjv, sha256 0123456789ab\); its "):
        pin(tmp_path, config, resume=True, corpus={"source": "kjv", "sha256": "0123456789abcdef"})


def test_an_extend_resume_may_change_its_rows_not_its_run_or_its_results(tmp_path):
    config, base = ExtendConfig.from_preset("smoke"), extrapolate_config()
    with pytest.raises(ValueError, match=rf"holds no posenc extend run \(no config.json there\); start one with: "
                                         rf"posenc extend --out {tmp_path}$"):
        pin_config(tmp_path, config, base, tmp_path / "a", resume=True)
    pin_config(tmp_path, config, base, tmp_path / "a", resume=False)
    assert storage.read_json(tmp_path / "config.json")["run"] == str(tmp_path / "a")
    pin_config(tmp_path, dataclasses.replace(config, methods=("pi",), seeds=3), base, tmp_path / "a", resume=True)
    refused = rf"^--resume: {tmp_path} was run with a different config \(differs in {{}}\); only --methods, --seeds, "
    for run in (tmp_path / "b", None):
        with pytest.raises(ValueError, match=refused.format(r"\['--run'\]")):
            pin_config(tmp_path, config, base, run, resume=True)
    with pytest.raises(ValueError, match=refused.format(r"\['factor'\]")):
        pin_config(tmp_path, dataclasses.replace(config, factor=config.factor * 2), base, tmp_path / "a", resume=True)
