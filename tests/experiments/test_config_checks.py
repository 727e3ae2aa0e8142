"""Every check of the commands' configs (extrapolate, task, extend, pretrained) at its edge: the last value it
takes is taken, the first it refuses fails with the whole message, which names the flag. Built from the smoke
presets without running anything, so each case takes milliseconds; the commands' own tests send a few of these
through the CLI. Also: what ``from_preset`` adds to the preset, ``to_dict``, and the rows and models each config
makes."""

import pytest

from posenc.experiments.extend.config import ExtendConfig, ExtendRow, make_rows
from posenc.experiments.extrapolate.config import ExperimentConfig
from posenc.experiments.extrapolate.rows import parse_rows
from posenc.experiments.pretrained.config import PretrainedConfig, plan_rows
from posenc.experiments.tasks.config import TaskConfig
from posenc.extension.retrieval import LABELS
from posenc.lm.layouts import LAYOUTS

BUILDERS = {  # each command's config from a preset (the smoke one unless named) with the flags given
    "extend": lambda preset="smoke", **o: ExtendConfig.from_preset(preset, **o),
    "extrapolate": lambda preset="smoke", **o: ExperimentConfig.from_preset(preset, **o),
    "task": lambda preset="smoke", **o: TaskConfig.from_preset("copy", preset, **o),
    "pretrained": lambda preset="smoke", **o: PretrainedConfig.from_preset(preset, **o),
}
FOUR = len(LABELS) // 4  # bands that, with four keys each, fill every label a document holds
assert FOUR * 4 == len(LABELS)

# (command, the last overrides taken, the first refused, the refusal's whole message: or its start, ending in …)
EDGES = [
    ("extend", dict(factor=1), dict(factor=0.999), "--factor must be a finite number >= 1, got 0.999"),
    # a list that names a value twice: once silently dropped (and the rows reordered), or one row run twice
    ("extrapolate", dict(encodings="rope,alibi"), dict(encodings="rope,alibi,rope"),
     "--encodings names 'rope' twice; give each once"),
    ("extrapolate", dict(eval_factors=(1, 2)), dict(eval_factors=(1, 2, 2)),
     "--eval-factors names 2 twice; give each once"),
    ("task", dict(encodings="rope,rope+randomized"), dict(encodings="rope,alibi,rope"),
     "--encodings names 'rope' twice; give each once"),
    ("extend", dict(methods="pi,ntk"), dict(methods="pi,ntk,pi"), "--methods names 'pi' twice; give each once"),
    ("pretrained", dict(methods="none,yarn"), dict(methods="yarn,yarn"),
     "--methods names 'yarn' twice; give each once"),
    ("extend", dict(factor=1e300), dict(factor=float("inf")), "--factor must be a finite number >= 1, got inf"),
    ("extend", dict(factor=2), dict(factor=True), "--factor must be a finite number >= 1, got True"),
    ("extend", dict(factor=2.0), dict(factor="8"), "--factor must be a finite number >= 1, got '8'"),
    ("extend", dict(methods=("pi",)), dict(methods=("pi", "rerope")),
     "--methods: unknown methods ['rerope']; valid: pi, ntk, dynamic, yarn, longrope"),
    ("extend", dict(finetune_steps=0), dict(finetune_steps=-1), "--finetune-steps must be an integer >= 0, got -1"),
    ("extend", dict(finetune_batch=1), dict(finetune_batch=0), "--finetune-batch must be an integer >= 1, got 0"),
    ("extend", dict(finetune_lrs=(1e-3, 2e-3)), dict(finetune_lrs=(1e-3, 1e-3)),
     "--finetune-lrs must not repeat a rate, got 0.001, 0.001"),
    ("extend", dict(finetune_widenings=0), dict(finetune_widenings=-1),
     "--finetune-widenings must be an integer >= 0, got -1"),
    ("extend", dict(finetune_warmup=0), dict(finetune_warmup=-1), "--finetune-warmup must be an integer >= 0, got -1"),
    ("extend", dict(finetune_warmup=8), dict(finetune_warmup=9),
     "--finetune-warmup (9) must be at most --finetune-steps (8)"),
    ("extend", dict(search_population=4), dict(search_population=3),
     "--search-population must be an integer >= 4, got 3"),
    ("extend", dict(search_generations=1), dict(search_generations=0),
     "--search-generations must be an integer >= 1, got 0"),
    ("extend", dict(search_windows=1), dict(search_windows=0), "--search-windows must be an integer >= 1, got 0"),
    ("extend", dict(sweep_windows=1), dict(sweep_windows=0), "--sweep-windows must be an integer >= 1, got 0"),
    ("extend", dict(curve_windows=1), dict(curve_windows=0), "--curve-windows must be an integer >= 1, got 0"),
    ("extend", dict(seeds=1), dict(seeds=0), "--seeds must be an integer >= 1, got 0"),
    ("extend", dict(search_parents=2), dict(search_parents=1), "search_parents must be an integer >= 2, got 1"),
    ("extend", dict(search_parents=5), dict(search_parents=6),
     "search_parents (6) must be below --search-population (6)"),
    ("extend", dict(eval_stride=1), dict(eval_stride=0), "--eval-stride must be an integer >= 1, got 0"),
    ("extend", dict(base="gpu"), dict(base="huge"),
     "base preset must be one of ['default', 'gpu', 'smoke'], got 'huge'"),
    ("extrapolate", dict(eval_stride=1), dict(eval_stride=0), "--eval-stride must be an integer >= 1, got 0"),
    # windows of the eval lengths' least common multiple: 4 × the longest is the most a window may hold
    ("extrapolate", dict(eval_factors=(4, 5)), dict(eval_factors=(5, 6)),
     "eval_factors (5, 6): evaluation windows must hold a whole number of every eval length, here 480 bytes; "
     "choose factors that divide the largest"),
    ("extrapolate", dict(compare="rope:alibi@2", seeds=2), dict(compare="rope:alibi@2", seeds=1),
     "--compare pairs rows over seeds: it needs --seeds >= 2, got 1"),
    ("extrapolate", dict(encodings="rope,alibi"), dict(encodings="rope,nope"),
     "--encodings: unknown rows ['nope']; valid: all, default, none, …"),  # then every other row the registry has
    ("task", dict(eval_factors=(1, 2)), dict(eval_factors=(0, 2)), "--eval-factors must be integers >= 1, got 0,2"),
    ("task", dict(encodings="rope+randomized"), dict(encodings=" , "), "--encodings names no row"),
    ("pretrained", dict(to=2, methods=("none",)), dict(to=1, methods=("none",)), "--to must be an integer >= 2, got 1"),
    ("pretrained", dict(methods=("none", "dca")), dict(methods=("none", "foo")),
     "--methods: unknown methods ['foo']; valid: none, pi, ntk, dynamic, yarn, llama3, longrope, self-extend, rerope, "
     "string, dca"),
    ("pretrained", dict(finetune="full"), dict(finetune="lora"),
     "--finetune must be one of ['full', 'none', 'pose'], got 'lora'"),
    ("pretrained", dict(finetune_method="pi"), dict(finetune_method="dynamic"),
     "--finetune-method must be one of ['llama3', 'ntk', 'pi', 'yarn'], got 'dynamic'"),
    ("pretrained", dict(corpus="nope", text="mine.txt"), dict(corpus="nope"),
     "--corpus must be one or more of stdlib, kjv, pydocs, comma-separated, each once; got 'nope'"),
    ("pretrained", dict(documents=2), dict(documents=1), "--documents must be an integer >= 2, got 1"),
    ("pretrained", dict(draw="seeded"), dict(draw="random"),
     "--draw must be one of ['longest', 'seeded'], got 'random'"),
    ("pretrained", dict(dev_documents=1), dict(dev_documents=0), "--dev-documents must be an integer >= 1, got 0"),
    # refused only after the model loaded and the run folder was pinned, which then no resume could change
    ("pretrained", dict(finetune_window=2), dict(finetune_window=1), "--finetune-window must be an integer >= 2, got 1"),
    ("pretrained", dict(bands=FOUR, keys_per_band=4), dict(bands=FOUR + 1, keys_per_band=4),
     f"--keys-per-band (4) x {FOUR + 1} bands is over the {len(LABELS)} labels a document can hold"),
    ("pretrained", dict(retrieval_format="made-up"), dict(retrieval_format="riddle"),
     "--retrieval-format must be one of secret-word, remember, remember-twice, made-up, made-up-twice (or auto), "
     "got 'riddle'"),
    ("pretrained", dict(retrieval_tasks=("multi-value",), task_size=2),
     dict(retrieval_tasks=("multi-value",), task_size=1),
     "--task-size must be an integer >= 2 (a list of one is a multi-key question), got 1"),
    ("pretrained", dict(retrieval_tasks=("multi-value", "variable-tracking")),
     dict(retrieval_tasks=("multi-value", "multi-value")),
     "--retrieval-tasks names a task twice: multi-value,multi-value"),
    # labels: the keys' (bands x keys per band), one per multi-value question, --task-size per chain
    ("pretrained", dict(bands=FOUR - 1, keys_per_band=4, retrieval_tasks=("variable-tracking",), task_questions=2),
     dict(bands=FOUR - 1, keys_per_band=4, retrieval_tasks=("variable-tracking",), task_questions=2, task_size=3),
     f"the keys ({FOUR - 1} bands x --keys-per-band 4) and the tasks' questions need {len(LABELS) + 2} labels, over "
     f"the {len(LABELS)} a document can hold"),
    ("pretrained", dict(bands=2, keys_per_band=6, retrieval_tasks=("multi-value",), task_questions=4),
     dict(bands=2, keys_per_band=6, retrieval_tasks=("multi-value",), task_questions=5),
     f"the keys (2 bands x --keys-per-band 6) and the tasks' questions need 17 labels, over the {len(LABELS)} a "
     "document can hold"),
    ("pretrained", dict(control_stride=1), dict(control_stride=0), "--control-stride must be an integer >= 1, got 0"),
    ("pretrained", dict(first_tokens=1), dict(first_tokens=0), "--first-tokens must be an integer >= 1, got 0"),
    ("pretrained", dict(pose_chunks=1), dict(pose_chunks=0), "--pose-chunks must be an integer >= 1, got 0"),
    ("pretrained", dict(finetune_lr=1e-12), dict(finetune_lr=0), "--finetune-lr must be a finite number > 0.0, got 0"),
    ("pretrained", dict(self_extend_group=2), dict(self_extend_group=1),
     "--self-extend-group must be an integer >= 2, got 1"),
    ("pretrained", dict(self_extend_window=1023), dict(self_extend_window=1024),
     "--self-extend-window (1024) must be below --to (1024)"),
    ("pretrained", dict(methods=("none",), self_extend_window=1024), dict(methods=("none",), self_extend_window=0),
     "--self-extend-window must be an integer >= 1, got 0"),  # no row reads through it: still a count
    ("pretrained", dict(string_shift=1), dict(string_shift=0), "--string-shift must be an integer >= 1, got 0"),
    ("pretrained", dict(string_local=0), dict(string_local=-1), "--string-local must be an integer >= 0, got -1"),
    ("pretrained", dict(methods=("none", "string"), string_shift=200, string_local=199),
     dict(methods=("none", "string"), string_shift=200, string_local=200),
     "--string-local (200) must be below --string-shift (200)"),
    ("pretrained", dict(search_population=4), dict(search_population=3),
     "--search-population must be an integer >= 4, got 3"),
    ("pretrained", dict(search_generations=1), dict(search_generations=0),
     "--search-generations must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("command, taken, refused, message", EDGES,
                         ids=[f"{c}-{'-'.join(r)}" for c, _, r, _ in EDGES])
def test_each_check_takes_its_edge_and_refuses_one_step_past_it_by_name(command, taken, refused, message):
    build = BUILDERS[command]
    build(**taken)
    with pytest.raises(ValueError) as refusal:
        build(**refused)
    if message.endswith("…"):
        assert str(refusal.value).startswith(message.removesuffix("…"))
    else:
        assert str(refusal.value) == message


def test_string_rules_bind_only_a_string_row():
    """--string-local at or past --string-shift is refused only where a STRING row reads them."""
    PretrainedConfig.from_preset("smoke", string_shift=200, string_local=300)


@pytest.mark.parametrize("command", sorted(BUILDERS))
def test_an_unknown_preset_is_named_with_the_known_ones(command):
    known = "['default', 'gpu', 'quick', 'smoke']" if command == "pretrained" else "['default', 'gpu', 'smoke']"
    with pytest.raises(ValueError) as refusal:
        BUILDERS[command](preset="huge")
    assert str(refusal.value) == f"preset must be one of {known}, got 'huge'"


def test_a_task_config_names_an_unknown_task():
    with pytest.raises(ValueError) as refusal:
        TaskConfig.from_preset("sort", "smoke")
    assert str(refusal.value) == "task must be one of ['copy', 'recall'], got 'sort'"


def test_from_preset_records_the_preset_and_reads_lists_and_comma_strings():
    extend = ExtendConfig.from_preset("smoke", methods="pi,yarn", finetune_lrs=[1e-3, 2e-3])
    assert (extend.preset, extend.methods, extend.finetune_lrs) == ("smoke", ("pi", "yarn"), (1e-3, 2e-3))
    assert extend.to_dict()["methods"] == ["pi", "yarn"] and extend.to_dict()["finetune_lrs"] == [1e-3, 2e-3]
    assert ExtendConfig(**{**extend.to_dict(), "methods": ("pi", "yarn"), "finetune_lrs": (1e-3, 2e-3)}) == extend
    extrapolate = ExperimentConfig.from_preset("smoke", lrs=[1e-3, 3e-3])
    assert (extrapolate.preset, extrapolate.lrs, extrapolate.to_dict()["lrs"]) == ("smoke", (1e-3, 3e-3), [1e-3, 3e-3])
    task = TaskConfig.from_preset("recall", "smoke", lrs=[1e-3, 3e-3])
    assert (task.task, task.preset, task.lrs) == ("recall", "smoke", (1e-3, 3e-3))
    assert task.to_dict()["eval_factors"] == [1, 2, 4, 8] and task.to_dict()["lrs"] == [1e-3, 3e-3]
    pretrained = PretrainedConfig.from_preset("smoke", methods="none,dca",
                                              retrieval_tasks="multi-value,,variable-tracking,")
    assert (pretrained.preset, pretrained.methods) == ("smoke", ("none", "dca"))
    assert pretrained.retrieval_tasks == ("multi-value", "variable-tracking")
    assert pretrained.task_counts == {"multi-value": 2, "variable-tracking": 2}


def test_recall_trains_shorter_and_longer_by_default_and_copy_does_not():
    """``TASK_PRESETS``: recall's default preset, not its others, nor copy's."""
    assert (TaskConfig.from_preset("recall", "default").train_length,
            TaskConfig.from_preset("recall", "default").steps) == (16, 4000)
    assert TaskConfig.from_preset("copy", "default").train_length == TaskConfig().train_length == 32
    assert TaskConfig.from_preset("recall", "smoke").train_length == 8
    assert TaskConfig.from_preset("recall", "default", train_length=24).train_length == 24  # a flag still wins


def test_extend_keeps_the_presets_warm_up_fraction_for_fewer_steps_unless_both_are_given():
    assert ExtendConfig.from_preset("smoke", finetune_steps=4).finetune_warmup == 1  # 2 of 8 steps
    assert ExtendConfig.from_preset("smoke", finetune_steps=0).finetune_warmup == 0
    assert ExtendConfig.from_preset("smoke", finetune_steps=40).finetune_warmup == 10
    assert ExtendConfig.from_preset("default", finetune_steps=40).finetune_warmup == 4  # 8 of 80
    assert ExtendConfig.from_preset("smoke", finetune_steps=40, finetune_warmup=3).finetune_warmup == 3
    assert ExtendConfig.from_preset("smoke", finetune_warmup=8).finetune_warmup == 8


def test_extends_target_is_a_whole_number_of_tokens():
    assert ExtendConfig.from_preset("smoke", factor=2.5).target_length(16) == 40
    assert isinstance(ExtendConfig.from_preset("smoke", factor=3.0).target_length(16), int)
    assert ExtendConfig.from_preset("smoke", factor=2.2).target_length(5) == 11  # 11.000000000000002: float rounding
    with pytest.raises(ValueError) as refusal:
        ExtendConfig.from_preset("smoke", factor=2.03).target_length(16)
    assert str(refusal.value) == ("--factor 2.03 × the training length 16 = 32.48 is not a whole number of tokens; "
                                  "choose a factor that gives one")


def test_extends_rows_zero_shot_fine_tuned_alibi_and_the_ceiling():
    every = make_rows(ExtendConfig.from_preset("smoke", methods=("pi", "yarn"), from_scratch=True), has_alibi=True)
    assert every == [
        ExtendRow("rope", "rope", "rope", "zero-shot"), ExtendRow("rope+pi", "rope", "pi", "zero-shot"),
        ExtendRow("rope+yarn", "rope", "yarn", "zero-shot"), ExtendRow("rope fine-tuned", "rope", "rope", "fine-tuned"),
        ExtendRow("rope+pi fine-tuned", "rope", "pi", "fine-tuned"),
        ExtendRow("rope+yarn fine-tuned", "rope", "yarn", "fine-tuned"),
        ExtendRow("alibi", "alibi", "alibi", "zero-shot"),
        ExtendRow("alibi fine-tuned", "alibi", "alibi", "fine-tuned"),
        ExtendRow("rope trained at target", "rope", "scratch", "from scratch")]
    assert [row.slug for row in every][-3:] == ["alibi", "alibi-fine-tuned", "rope-trained-at-target"]
    zero_shot = make_rows(ExtendConfig.from_preset("smoke", methods=("ntk",), finetune_steps=0), has_alibi=True)
    assert zero_shot == [ExtendRow("rope", "rope", "rope", "zero-shot"),
                         ExtendRow("rope+ntk", "rope", "ntk", "zero-shot"),
                         ExtendRow("alibi", "alibi", "alibi", "zero-shot")]
    assert [row.name for row in make_rows(ExtendConfig.from_preset("smoke", methods=("pi",)), has_alibi=False)] == [
        "rope", "rope+pi", "rope fine-tuned", "rope+pi fine-tuned"]


def test_pretrained_rows_swap_attention_or_scale_and_fine_tune_with_the_control():
    config = PretrainedConfig.from_preset("smoke", methods=("none", "yarn", "self-extend"), finetune="pose",
                                          finetune_method="pi")
    assert plan_rows(config) == {
        "none": {"method": "none", "attention": "sdpa", "finetune": None},
        "yarn": {"method": "yarn", "attention": "sdpa", "finetune": None},
        "self-extend": {"method": "none", "attention": "self-extend", "finetune": None},
        "pi+pose": {"method": "pi", "attention": "sdpa", "finetune": "pose"},
        "pi+control": {"method": "pi", "attention": "sdpa", "finetune": "control"}}
    full = plan_rows(PretrainedConfig.from_preset("smoke", methods=("none",), finetune="full"))
    assert list(full) == ["none", "yarn+full"] and full["yarn+full"]["finetune"] == "full"
    assert list(plan_rows(PretrainedConfig.from_preset("smoke", finetune="none"))) == ["none", "yarn", "ntk",
                                                                                      "self-extend"]


def test_a_layout_rows_model_has_its_global_encoding_and_local_layers_of_a_quarter_of_the_length():
    """Extrapolate and task alike: the config's sizes (none of them ModelConfig's defaults), the layout's global
    encoding and kwargs (a row's own on top), local layers spanning train_length // 4 and never under one token."""
    layout = LAYOUTS["swa+global"]
    sizes = dict(dim=48, num_layers=5, num_heads=3)
    extrapolate = ExperimentConfig.from_preset("smoke", train_length=16, **sizes)
    model = extrapolate.model_config(parse_rows("swa+global")[0], {"base": 5e5})
    assert (model.encoding, model.encoding_kwargs) == (layout.global_encoding, {"base": 5e5})  # the row's own wins
    assert (model.dim, model.num_layers, model.num_heads, model.max_positions) == (48, 5, 3, 16)
    assert model.layers == layout.layers(5, 4)
    assert ExperimentConfig.from_preset("smoke", train_length=3, **sizes).model_config(
        parse_rows("swa+global")[0], {}).layers == layout.layers(5, 1)
    plain = extrapolate.model_config(parse_rows("alibi")[0], {})
    assert (plain.encoding, plain.encoding_kwargs, plain.layers) == ("alibi", {}, ())

    task = TaskConfig.from_preset("copy", "smoke", train_length=16, eval_factors=(1, 2), **sizes)
    model = task.model_config("irope", randomized=False)
    assert (model.encoding, model.encoding_kwargs, model.layers) == ("none", {}, LAYOUTS["irope"].layers(5, 4))
    assert (model.dim, model.num_layers, model.num_heads, model.vocab_size, model.max_positions, model.backend) == (
        48, 5, 3, task.task_spec.vocab_size, 16, "auto")
    assert task.model_config("swa+global", randomized=False).encoding_kwargs == layout.global_kwargs == {"base": 1e6}
    assert task.model_config("alibi", randomized=True).encoding == "alibi"
    assert task.model_config("alibi", randomized=True).max_positions == 32  # the longest eval length
    assert TaskConfig.from_preset("copy", "smoke", train_length=2, **sizes).model_config(
        "swa+global", randomized=False).layers == layout.layers(5, 1)
