"""extend's collector on synthetic per-seed results: each field of results.json computed by hand from the inputs.

No model runs here: the seeds' evaluations, rate selections and curves are made-up numbers whose means, pairs and
intersections a wrong collector would change (a swapped seed, a dropped window, a step kept that one seed lacks).
"""

from pathlib import Path

import pytest
import torch

from posenc.experiments import extrapolate
from posenc.experiments.extend.collect import CONTROL, collect, comparisons
from posenc.experiments.extend.config import ExtendConfig, ExtendRow, make_rows
from posenc.experiments.extend.plan import Plan
from posenc.lm.data import Corpus, Split, Windows
from posenc.lm.runtime import provenance

LENGTHS = ["32", "64", "128"]
FILES = ("a.py", "a.py", "b.py", "c.py")  # four report windows, three files
RATES = {0: {"1e-4": 2.5, "3e-4": 2.0, "1e-3": 2.25},  # seed 0: the preset's grid
         1: {"3e-4": 2.75, "1e-3": 2.5, "3e-3": 3.0}}  # seed 1: widened once, never scored 1e-4


def _split(names: tuple[str, ...], size: int = 400) -> Split:
    return Split(torch.zeros(size * len(names), dtype=torch.uint8), names, tuple(i * size for i in range(len(names))))


def smoke_plan(methods=("pi", "yarn"), has_alibi=True, from_scratch=False, eval_stride=None, seed=0,
               out: Path = Path("out")) -> Plan:
    """The smoke preset's plan at factor 8 (target 128) over made-up splits, its run in ``run/``, its own in ``out``."""
    config = ExtendConfig.from_preset("smoke", methods=methods, seeds=2, from_scratch=from_scratch,
                                      eval_stride=eval_stride)
    base = extrapolate.ExperimentConfig.from_preset("smoke", seed=seed)
    corpus = Corpus(_split(("d.py",)), _split(("d.py",)), _split(("a.py", "b.py", "c.py")), {"sha256": "x"})
    target = 128
    return Plan(config, base, Path("run"), out, corpus, target, [32, 64, 128], make_rows(config, has_alibi), has_alibi)


def _window_bits(row_index: int, seed: int) -> dict:
    """Per-window bits, different per row, seed, length and window."""
    return {n: [row_index + 0.25 * seed + 0.125 * k + 0.5 * w for w in range(len(FILES))]
            for k, n in enumerate(LENGTHS)}


def _selection(seed: int) -> dict:
    lr = 3e-4 if seed == 0 else 1e-3
    steps = ["0", "2", "5", "10"] if seed == 0 else ["0", "2", "10", "20"]  # "5" and "20" in one seed each
    curve = {step: {"window_bits": [int(step) + seed + w % 2 for w in range(4)]} for step in steps}  # 4 windows
    return {"lr": lr, "curves": {f"{lr:g}": curve, "9": {"0": {"window_bits": [99.0] * 4}}},
            "dev_bits": RATES[seed], "dev_windows": 4 + seed, **({"at_edge": True} if seed == 1 else {})}


def _seeds(p: Plan) -> dict:
    seeds = {}
    for seed in reversed(p.seeds):  # inserted in reverse: "first" must follow the plan's seeds, not dict order
        evals = {row.name: {"window_bits": _window_bits(i, seed),
                            "bits_per_byte": {n: 10 * seed + i for n in LENGTHS},
                            "errors": {"128": f"errors of seed {seed}"}, "position_bits": {"seed": seed}}
                 for i, row in enumerate(p.rows)}
        selections = {row.name: _selection(seed) for row in p.rows if row.stage == "fine-tuned"}
        seeds[seed] = {"evals": evals, "selections": selections,
                       "scalings": {"pi": {"seed": seed, "rope_type": "linear"}, "yarn": {"rope_type": "yarn"}}}
    return dict(sorted(seeds.items()))


def _collect(p: Plan, seeds: dict | None = None) -> dict:
    windows = Windows(torch.zeros(len(FILES), 129, dtype=torch.int64), FILES, tuple(range(len(FILES))))
    return collect(p, _Runtime(), seeds or _seeds(p), windows, {"factors": [1.0]}, {"search": 1.5, "sweep": 2.0})


class _Runtime:
    label = "cpu (test)"


def _mean(values) -> float:
    return sum(values) / len(values)


def test_each_cell_is_the_mean_over_seeds_and_windows_with_its_seeds_spread():
    p = smoke_plan()
    result = _collect(p)
    for i, row in enumerate(result["rows"]):
        for k, n in enumerate(LENGTHS):
            per_seed = [_mean(_window_bits(i, s)[n]) for s in (0, 1)]  # i + 0.25 s + 0.125 k + 0.75
            assert row["bits_per_byte"][n] == pytest.approx(_mean(per_seed)), (row["name"], n)
            assert row["bits_per_byte"][n] == pytest.approx(i + 0.125 + 0.125 * k + 0.75)
            low, high = row["interval"][n]
            assert low < row["bits_per_byte"][n] < high
            assert row["bits_per_byte_std"][n] == pytest.approx(torch.tensor(per_seed).std().item())
            assert row["window_bits"][n] == pytest.approx([i + 0.125 + 0.125 * k + 0.5 * w for w in range(4)])
            assert row["change_from_1x"][n]["mean"] == pytest.approx(0.125 * k)
        assert row["change_from_1x"]["32"]["low"] == row["change_from_1x"]["32"]["high"] == 0
        assert row["per_seed"] == [{n: i for n in LENGTHS}, {n: 10 + i for n in LENGTHS}]
        assert row["errors"] == {"128": "errors of seed 0"} and row["position_bits"] == {"seed": 0}


def test_the_first_seed_is_the_plans_first_not_the_lowest_number():
    p = smoke_plan(seed=1)  # seeds 1 and 2
    seeds = {s: value for s, value in zip((1, 2), _seeds(smoke_plan()).values())}
    assert _collect(p, seeds)["rows"][0]["errors"] == {"128": "errors of seed 0"}  # what seed 1 carries here
    assert _collect(p, dict(reversed(seeds.items())))["rows"][0]["errors"] == {"128": "errors of seed 0"}


def test_a_length_a_seed_could_not_score_leaves_its_cells_empty():
    p = smoke_plan()
    seeds = _seeds(p)
    seeds[1]["evals"]["rope"]["window_bits"]["128"] = None
    rope = _collect(p, seeds)["rows"][0]
    assert rope["bits_per_byte"]["128"] is None and rope["interval"]["128"] is None
    assert rope["bits_per_byte_std"]["128"] is None and rope["change_from_1x"]["128"] is None
    assert rope["window_bits"]["128"] is None and rope["bits_per_byte"]["64"] is not None


def test_row_fields_scaling_tokens_and_rates_by_stage():
    p = smoke_plan()
    result = _collect(p)
    by_name = {row["name"]: row for row in result["rows"]}
    finetune_tokens = p.config.finetune_steps * p.config.finetune_batch * 128
    assert result["finetune_tokens"] == finetune_tokens == 8 * 4 * 128
    assert result["pretraining_tokens"] == p.base.steps * p.base.batch_size * p.base.train_length
    for name, row in by_name.items():
        tuned = name.endswith("fine-tuned")
        assert row["extra_tokens"] == (finetune_tokens if tuned else 0), name
        assert row["learning_rates"] == ([3e-4, 1e-3] if tuned else None), name
    assert by_name["rope+pi"]["scaling"] == {"seed": 0, "rope_type": "linear"}  # the first seed's
    assert by_name["rope+yarn fine-tuned"]["scaling"] == {"rope_type": "yarn"}
    assert by_name["rope"]["scaling"] is None and by_name["alibi"]["scaling"] is None
    assert [by_name[n]["trained_encoding"] for n in ("rope+pi", "alibi fine-tuned")] == ["rope", "alibi"]
    assert [by_name[n]["stage"] for n in ("rope+pi", "rope fine-tuned")] == ["zero-shot", "fine-tuned"]
    assert result["scratch_tokens"] is None and result["alibi"] == "trained"
    assert result["seeds"] == [0, 1] and result["target_length"] == 128 and result["eval_lengths"] == [32, 64, 128]
    assert result["protocol"] == "non-overlapping windows"
    assert result["wall_time_s"] == 3.5 and result["stages_s"] == {"search": 1.5, "sweep": 2.0}
    assert result["windows"]["count"] == 4 and result["windows"]["files"] == 3
    assert result["longrope"] == {"factors": [1.0]} and result["device"] == "cpu (test)"
    assert result["config"] == p.config.to_dict() and result["base_config"] == p.base.to_dict()
    assert result["run"] == "run" and result["train_length"] == p.base.train_length
    assert result["corpus"] == {"sha256": "x"} and result["provenance"] == provenance()
    assert [by_name[n]["method"] for n in ("rope", "rope+pi", "alibi fine-tuned")] == ["rope", "pi", "alibi"]


def test_from_scratch_stride_and_no_alibi_change_what_the_results_say():
    p = smoke_plan(has_alibi=False, from_scratch=True, eval_stride=16)
    result = _collect(p)
    scratch = next(row for row in result["rows"] if row["stage"] == "from scratch")
    tokens = p.base.steps * p.base.batch_size * p.base.train_length + 8 * 4 * 128
    assert scratch["extra_tokens"] == result["scratch_tokens"] == tokens
    assert scratch["learning_rates"] is None and scratch["scaling"] is None
    assert result["protocol"] == "sliding windows, stride 16"
    assert result["alibi"] == "not in --run: ALiBi rows left out"
    assert ("rope trained at target", CONTROL, "from scratch vs RoPE fine-tuned, same tokens") in [
        (c["a"], c["b"], c["question"]) for c in result["comparisons"]]


def test_comparisons_are_the_pairs_each_question_needs():
    p = smoke_plan(methods=("pi",))
    assert comparisons(p.rows) == [
        ("rope", "alibi", "zero-shot vs ALiBi zero-shot"),
        ("rope+pi", "alibi", "zero-shot vs ALiBi zero-shot"),
        ("rope fine-tuned", "alibi fine-tuned", "vs ALiBi fine-tuned on the same tokens"),
        ("rope fine-tuned", "rope", "what fine-tuning adds"),
        ("rope+pi fine-tuned", CONTROL, "scaling + fine-tuning vs fine-tuning alone"),
        ("rope+pi fine-tuned", "alibi fine-tuned", "vs ALiBi fine-tuned on the same tokens"),
        ("rope+pi fine-tuned", "rope+pi", "what fine-tuning adds"),
        ("alibi fine-tuned", "alibi", "what fine-tuning adds"),
    ]
    without = [row for row in p.rows if row.name not in (CONTROL, "alibi", "alibi fine-tuned")]
    assert comparisons(without) == [("rope+pi fine-tuned", "rope+pi", "what fine-tuning adds")]
    scratch = ExtendRow("rope trained at target", "rope", "scratch", "from scratch")
    assert comparisons([scratch]) == [] and comparisons([scratch, p.rows[2]])[-1][:2] == (scratch.name, CONTROL)


def test_each_comparison_is_the_difference_of_the_two_rows_means():
    p = smoke_plan()
    result = _collect(p)
    index = {row.name: i for i, row in enumerate(p.rows)}
    assert len(result["comparisons"]) == len(comparisons(p.rows))
    for c in result["comparisons"]:
        for n in LENGTHS:
            assert c["difference"][n]["mean"] == pytest.approx(index[c["a"]] - index[c["b"]]), (c["a"], c["b"], n)
            assert c["difference"][n]["seed_low"] <= c["difference"][n]["mean"] <= c["difference"][n]["seed_high"]
            assert "seed_std" not in c["difference"][n]


def test_curves_keep_the_steps_every_seed_scored_at_its_chosen_rate():
    result = _collect(smoke_plan())
    for name in ("rope fine-tuned", "rope+yarn fine-tuned", "alibi fine-tuned"):
        curve = result["curves"][name]
        assert list(curve) == ["0", "2", "10"]  # sorted as numbers; "5" and "20" each lack a seed; rate "9" unchosen
        assert curve["0"]["mean"] == pytest.approx(1.0)  # seed 0: [0, 1, 0, 1], seed 1: [1, 2, 1, 2]
        assert curve["10"]["mean"] == pytest.approx(11.0)
        assert curve["10"]["per_seed"] == pytest.approx([10.5, 11.5])
    assert "rope+pi" not in result["curves"] and "alibi" not in result["curves"]


def test_the_sweep_averages_each_rate_over_the_seeds_that_scored_it():
    sweep = _collect(smoke_plan())["sweep"]
    assert set(sweep) == {"rope fine-tuned", "rope+pi fine-tuned", "rope+yarn fine-tuned", "alibi fine-tuned"}
    yarn = sweep["rope+yarn fine-tuned"]
    assert list(yarn["dev_bits"]) == ["1e-4", "3e-4", "1e-3", "3e-3"]  # sorted by value, not as text
    assert yarn["dev_bits"] == pytest.approx({"1e-4": 2.5, "3e-4": 2.375, "1e-3": 2.375, "3e-3": 3.0})
    assert yarn["chosen"] == [3e-4, 1e-3] and yarn["at_edge"] == [False, True]
    assert yarn["dev_windows"] == 4  # the first seed's
