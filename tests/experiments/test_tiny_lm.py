"""Both commands that train tiny LMs refuse a bad training field alike, naming its flag (``tiny_lm.check_training``)."""

import pytest

from posenc.experiments.extrapolate.config import ExperimentConfig
from posenc.experiments.tasks.config import TaskConfig


@pytest.mark.parametrize("field, value, message", [
    ("num_layers", 0, r"^--layers must be an integer >= 1, got 0"),
    ("num_heads", 1.5, r"^--heads must be an integer >= 1, got 1.5"),
    ("steps", True, r"^--steps must be an integer >= 1, got True"),
    ("steps", "10", r"^--steps must be an integer >= 1, got '10'"),  # not a TypeError from the warm-up's share
    ("seeds", 0, r"^--seeds must be an integer >= 1, got 0"),
    ("dim", 34, r"^--dim \(34\) must be --heads \(2\) times an even head width, got 17 per head$"),
    ("warmup", -1, r"^--warmup must be an integer >= 0, got -1"),
    ("warmup", 10 ** 6, r"^--warmup \(1000000\) must be at most --steps \(\d+\)$"),
    ("seed", -1, r"^--seed must be an integer >= 0, got -1$"),
    ("seed", 2 ** 63, r"^--seed must be at most 2\^63 - --seeds = 9223372036854775807, got 9223372036854775808$"),
    ("lr", 0.0, r"^--lr must be"),
    ("lrs", (1e-3, 1e-3), r"^--lrs must not repeat a rate, got 0.001, 0.001"),
    ("lr_widenings", -1, r"^--lr-widenings must be an integer >= 0"),
    ("lr_sweep_seeds", 1, r"^--lr-sweep-seeds says which seeds sweep a grid of --lrs; give --lrs too"),
    ("eval_factors", (1, 0), r"^--eval-factors must be integers >= 1, got 1,0"),
    ("device", "tpu", r"^--device must be one of \['auto', 'cpu', 'cuda'\], got 'tpu'"),
])
def test_both_commands_refuse_a_bad_training_field_naming_its_flag(field, value, message):
    for build in (lambda: ExperimentConfig.from_preset("smoke", **{field: value}),
                  lambda: TaskConfig.from_preset("copy", "smoke", **{field: value})):
        with pytest.raises(ValueError, match=message):
            build()


def test_each_command_checks_its_own_counts():
    with pytest.raises(ValueError, match=r"^--eval-windows must be an integer >= 1, got 0"):
        ExperimentConfig.from_preset("smoke", eval_windows=0)
    with pytest.raises(ValueError, match=r"^eval_sequences must be an integer >= 1, got 0"):
        TaskConfig.from_preset("copy", "smoke", eval_sequences=0)


def test_steps_given_alone_keep_the_presets_share_of_warm_up():
    """The default preset warms up for 50 of 600 steps: 10 steps given alone warm up for 1 (not 50, which would
    leave the rate at a fifth of --lr when training ends), 1,200 for 100; a warm-up given is kept as given."""
    assert ExperimentConfig.from_preset("default").warmup == 50
    assert ExperimentConfig.from_preset("default", steps=10).warmup == 1
    assert ExperimentConfig.from_preset("default", steps=1200).warmup == 100
    assert ExperimentConfig.from_preset("default", steps=1200, warmup=7).warmup == 7
    assert ExperimentConfig.from_preset("smoke", steps=8).warmup == 2  # smoke: 5 of 20
    copy = TaskConfig.from_preset("copy", "default")
    assert TaskConfig.from_preset("copy", "default", steps=copy.steps // 2).warmup == copy.warmup // 2
    assert TaskConfig.from_preset("copy", "default", steps=10, warmup=10).warmup == 10
