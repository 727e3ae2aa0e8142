"""The task experiment's tables, caption and results.md from a made-up results dict: every header, cell, unit and
heading as a reader sees them."""

import json

from posenc.experiments.tasks import report
from posenc.lm.runtime import provenance, provenance_line


def _cell(mean, low, high, std=0.0):
    return {"mean": mean, "low": low, "high": high, "seed_std": std}


def _results(task="copy", seeds=1, lrs=()) -> dict:
    rows = [
        {"name": "learned", "randomized_positions": False,
         "exact_match": {"8": _cell(0.5, 0.25, 0.75, 0.125), "16": None},
         "dev_exact_match": {"8": 0.5, "16": None}, "train_seconds": [10.0, 30.0][:seeds],
         "rate_sweeps": [{"lr": 0.001, "at_edge": True, "scores": {"0.001": 0.5, "0.003": 0.75}}] * seeds},
        {"name": "rope", "randomized_positions": True,
         "exact_match": {"8": _cell(1.0, 1.0, 1.0), "16": _cell(0.0, 0.0, 0.0)},
         "dev_exact_match": {"8": 0.875, "16": 0.0625}, "train_seconds": [12.0, 14.0][:seeds],
         "rate_sweeps": [{"lr": 0.003, "at_edge": False, "scores": {"0.001": 0.5, "0.003": 0.25}}] * seeds},
    ]
    return {"task": task, "train_length": 8, "eval_lengths": [8, 16], "seeds": seeds, "rows": rows,
            "config": {"eval_sequences": 64, "lrs": list(lrs), "seed": 0}, "wall_time_s": 42.4,
            "provenance": provenance()}


def test_the_table_shows_each_cell_na_and_the_mean_training_time():
    header, body = report.table_rows(_results(seeds=2))
    assert header == ["encoding", "1× (8)", "2× (16)", "train s"]
    assert body == [["learned", "0.500 [0.250, 0.750] ± 0.125", "N/A", "20"],
                    ["rope", "1.000 [1.000, 1.000]", "0.000 [0.000, 0.000]", "13"]]


def test_with_a_rate_grid_the_table_names_each_seeds_rate():
    results = _results(seeds=2, lrs=(1e-3, 3e-3))
    header, body = report.table_rows(results)
    assert header == ["encoding", "1× (8)", "2× (16)", "lr (dev)", "train s"]
    assert [line[3] for line in body] == ["0.001 (edge)", "0.003"]  # every seed kept the same rate: named once
    results["rows"][0]["rate_sweeps"] = [{"lr": 0.001, "at_edge": True}, {"lr": 0.003, "at_edge": False}]
    assert report.table_rows(results)[1][0][3] == "0.001 (edge), 0.003"  # seeds apart: each seed's, in seed order


def test_the_caption_names_the_task_its_unit_and_the_seeds():
    assert report.caption(_results()) == ("Exact match on copy (sequences copied exactly), trained at 8 tokens, "
                                          "64 test sequences per length, 1 seed: mean [95% interval]")
    assert report.caption(_results("recall", seeds=2)).startswith("Exact match on recall (answers right), ")
    assert "64 test sequences per length, 2 seeds: mean" in report.caption(_results("recall", seeds=2))
    terminal = report.terminal_table(_results())
    assert terminal.startswith(report.caption(_results()) + "\nencoding ")
    assert terminal.splitlines()[1].split() == ["encoding", "1×", "(8)", "2×", "(16)", "train", "s"]


def test_dev_rows_are_means_with_na_and_none_for_an_old_run():
    header, body = report.dev_rows(_results())
    assert header == ["encoding", "1× (8)", "2× (16)"]
    assert body == [["learned", "0.500", "N/A"], ["rope", "0.875", "0.062"]]
    old = _results()
    old["rows"][1]["dev_exact_match"] = None
    assert report.dev_rows(old) is None


def test_results_md_has_each_section_in_order(tmp_path):
    results = _results(lrs=(1e-3, 3e-3))
    report.write_all(results, tmp_path)
    lines = (tmp_path / "results.md").read_text().split("\n")
    assert lines[:3] == ["# posenc task copy", "", report.caption(results)]
    assert lines[3] == "" and lines[4].startswith("| encoding | 1× (8) |")
    figure = lines.index("![exact match vs length](tasks.png)")
    assert lines[figure - 1] == lines[figure + 1] == ""
    rates = lines.index("## Learning rates, chosen on dev (cross-entropy of the scored tokens of dev sequences at the "
                        "training length)")
    dev = lines.index("## Dev sequences (what budgets and presets are chosen on; never reported as results)")
    assert figure < rates < dev and lines[rates + 1] == "" and lines[dev + 1] == ""
    assert lines[rates + 2] == "| encoding | seed | 0.001 | 0.003 | kept |"
    for heading in (rates, dev):  # each table ends with a blank line
        end = next(i for i in range(heading + 2, len(lines)) if not lines[i].startswith("|"))
        assert lines[end] == "" and end > heading + 3
    assert lines[-2:] == [f"42 s. {provenance_line(results['provenance'])}", ""]
    assert (tmp_path / "tasks.png").stat().st_size > 0
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(results))
    plain = _results()
    plain["rows"][0]["dev_exact_match"] = None
    report.write_all(plain, tmp_path)
    text = (tmp_path / "results.md").read_text()
    assert "## Learning rates" not in text and "## Dev sequences" not in text


def test_each_seed_has_its_own_value_in_order_and_a_one_seed_run_has_no_seed_table(tmp_path):
    results = _results(seeds=2)
    results["config"]["seed"] = 3
    results["rows"][0]["exact_match"]["8"]["per_seed"] = [0.0, 1.0]  # a row whose seeds split: its mean 0.5 is neither
    results["rows"][1]["exact_match"]["8"]["per_seed"] = [1.0, 1.0]
    results["rows"][1]["exact_match"]["16"]["per_seed"] = [0.0625, 0.0]
    header, body = report.seed_rows(results)
    assert header == ["encoding (seeds 3–4)", "1× (8)", "2× (16)"]
    assert body == [["learned", "0.000, 1.000", "N/A"], ["rope", "1.000, 1.000", "0.062, 0.000"]]
    assert report.seed_rows(_results(seeds=1)) is None
    report.write_all(results, tmp_path)
    lines = (tmp_path / "results.md").read_text().split("\n")
    heading = lines.index("## Each seed (mean exact match; where seeds split, learning or not, the mean describes "
                          "none of them)")
    assert lines[heading + 1] == "" and lines[heading + 2] == "| encoding (seeds 3–4) | 1× (8) | 2× (16) |"
    assert lines[heading + 6] == ""  # header, rule, two rows, then a blank line
    assert lines[heading + 4] == "| learned | 0.000, 1.000 | N/A |"
    assert lines.index("![exact match vs length](tasks.png)") < heading
