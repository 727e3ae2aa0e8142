"""extend's generated tables, read from the committed default run."""

import json
from pathlib import Path

from posenc.experiments import published

RESULTS = json.loads((Path(__file__).resolve().parents[3] / "docs" / "results" / "extend-default.json").read_text())


def test_the_versus_control_table_holds_each_scaled_fine_tune_against_plain_rope_fine_tuned_only():
    lines = published.render("extend-versus-control", RESULTS).splitlines()
    assert lines[0] == "| a − b | question | 1× (64) | 2× (128) | 4× (256) | 8× (512) |"
    names = [line.split(" | ")[0].removeprefix("| ") for line in lines[2:]]
    assert names == [f"rope+{m} fine-tuned − rope fine-tuned" for m in ("pi", "ntk", "dynamic", "yarn", "longrope")]
    assert lines[2].endswith("| +0.395 [+0.375, +0.420] |")  # PI against the control at 8× (docs/history/extend.md)
    every = published.render("extend-comparisons", RESULTS).splitlines()
    assert set(lines[2:]) < set(every[2:]) and len(every) > len(lines)


FIVE = json.loads((Path(__file__).resolve().parents[3] / "docs" / "results" / "extend-5seeds.json").read_text())


def test_results_md_of_the_five_seed_run_says_what_its_file_holds():
    """The committed five-seed run's results.md, checked line by line where it is prose (every number below was
    checked against the run: 480 × 512 bytes, 80 × 4 × 512 fine-tuning tokens = 13% of 600 × 32 × 64)."""
    from posenc.experiments.extend import report
    from posenc.lm.runtime import provenance_line

    lines = report.markdown(FIVE).split("\n")
    assert lines[0] == ("# Bits per byte (lower is better): RoPE trained at 64, extended to 512 (factor 8), "
                        "non-overlapping windows, 480 test windows, 5 seeds: mean [95% interval] ± std over seeds")
    assert lines[2] == "| row | stage | 1× (64) | 2× (128) | 4× (256) | 8× (512) |"
    assert lines[3] == "| --- | --- | ---: | ---: | ---: | ---: |" and lines[1] == ""
    assert lines[4 + len(FIVE["rows"])] == ""
    assert lines[5 + len(FIVE["rows"])] == (
        "Scored on the test split: 480 windows of 512 bytes (245,760 bytes from 34 of its 36 files), the same for "
        "every row; intervals: 95% bootstrap over 34 files (and seeds, drawn independently, where several ran), 2000 "
        "resamples; with several seeds also a Student t interval over their means. Fine-tuning: 80 steps × 4 windows "
        "× 512 tokens = 163,840 tokens per fine-tuned row (13% of the 1,228,800 pretraining tokens), from the train "
        "split, at the rate of {0.0001, 0.0003, 0.001} that scores best on 64 dev windows (the grid grows by a step "
        "past its edge while the best rate sits there, up to 2 times). Every method runs at factor 8 at every "
        "length. ALiBi: trained.")
    headings = ["## Paired comparisons (a − b on the same windows; negative: a is better; '(noise)': the interval "
                "covers 0)", "## Change from the row's own 1× score",
                "## Fine-tuning rate, chosen on dev (bits at 512 on 64 dev windows)",
                "## Bits per byte at 512 during fine-tuning, at the chosen rate (64 test windows)",
                "## LongRoPE search", "## Wall time per stage"]
    places = [lines.index(heading) for heading in headings]
    assert places == sorted(places) and all(lines[p - 1] == lines[p + 1] == "" for p in places)
    assert lines[places[1] + 2] == "| row | 2× (128) | 4× (256) | 8× (512) |"
    assert lines[places[0] + 2] == "| a − b | question | 1× (64) | 2× (128) | 4× (256) | 8× (512) |"
    assert lines[places[0] + 3] == "| --- | --- | ---: | ---: | ---: | ---: |"
    rope = next(row for row in FIVE["rows"] if row["name"] == "rope")
    assert lines[places[1] + 4] == "| rope | " + " | ".join(
        f"{rope['change_from_1x'][n]['mean']:+.3f} [{rope['change_from_1x'][n]['low']:+.3f}, "
        f"{rope['change_from_1x'][n]['high']:+.3f}] (seeds [{rope['change_from_1x'][n]['seed_low']:+.3f}, "
        f"{rope['change_from_1x'][n]['seed_high']:+.3f}])" for n in ("128", "256", "512")) + " |"
    assert len(lines[places[0] + 2 : places[1] - 1]) == 2 + len(FIVE["comparisons"])  # header, rule, a line each
    search = lines[places[4] + 2]
    assert search.startswith("Exported: seed 4's factors. Its search scored candidates on 8 dev windows: best 1.7101 "
                             "nats with n̂ = 0; the same factors with n̂ = 0 (what transformers can hold, what the "
                             "`rope+longrope` rows run and what is exported) score 1.7101. Seeds: pi 2.7894, ntk "
                             "2.1877, yarn 1.8146. 282 candidates at 2.96/s; best loss per generation: 1.8121, ")
    assert search.endswith(", 1.7101, 1.7101.")
    assert lines[places[4] + 3 : places[4] + 7] == ["", "Exported `rope_parameters` (rope_parameters.json):", "",
                                                     "```json"]
    json_block = lines[lines.index("```json") + 1 : lines.index("```", lines.index("```json"))]
    assert json_block[:3] == ["{", '  "rope_type": "longrope",', '  "rope_theta": 10000.0,']
    assert json_block[-1] == "}" and json.loads("\n".join(json_block)) == FIVE["longrope"]["rope_parameters"]
    assert lines[places[5] + 2 : places[5] + 4] == ["| stage | seconds |", "| --- | ---: |"]
    corpus = f"Corpus: python3.11.7 stdlib (sha256 `6542f7510a0b9f4f`, split {FIVE['corpus']['split']}). "
    assert lines[-3:] == ["", corpus + f"Device: cpu (2 cores). {provenance_line(FIVE['provenance'])}", ""]
    assert report.terminal_table(FIVE).startswith(lines[0][2:] + "\nrow ")


def test_results_md_of_a_run_without_fine_tuning_or_search_leaves_their_sections_out():
    from posenc.experiments.extend import report

    bare = {**FIVE, "sweep": {}, "curves": {}, "longrope": None, "scratch_tokens": 1000, "seeds": [0],
            "alibi": "not in --run: ALiBi rows left out"}
    text = report.markdown(bare)
    for heading in ("## Fine-tuning rate", "## Bits per byte at 512 during", "## LongRoPE search"):
        assert heading not in text
    assert "\n\n`rope trained at target`: 1,000 tokens at the target length, the pretraining plus one fine-tuning's " \
           "tokens.\n\n## Paired comparisons" in text
    assert "ALiBi: not in --run: ALiBi rows left out." in text
    assert report.title(bare).endswith("480 test windows, 1 seed: mean [95% interval]")


def test_the_sweep_table_sorts_rates_by_value_and_marks_each_seeds_edge():
    from posenc.experiments.extend import report

    sweep = {"rope fine-tuned": {"dev_bits": {"0.0001": 2.5, "1e-05": 3.0}, "chosen": [0.0001, 1e-05],
                                 "at_edge": [False, True]},
             "alibi fine-tuned": {"dev_bits": {"0.0001": 2.25}, "chosen": [0.0001]}}  # written before at_edge
    assert report.sweep_rows(sweep) == (["row", "lr 1e-05", "lr 0.0001", "chosen"], [
        ["rope fine-tuned", "3.000", "2.500", "0.0001, 1e-05 (edge)"], ["alibi fine-tuned", "", "2.250", "0.0001"]])


def test_the_curve_table_leaves_a_step_a_row_lacks_blank():
    from posenc.experiments.extend import report

    cell = {"mean": 2.0, "low": 1.5, "high": 2.5, "seed_std": 0.25}
    results = {"curves": {"a": {"0": cell, "10": cell}, "b": {"2": cell}}}
    assert report.curve_rows(results) == (["row", "step 0", "step 2", "step 10"], [
        ["a", "2.000 [1.500, 2.500] ± 0.250", "", "2.000 [1.500, 2.500] ± 0.250"],
        ["b", "", "2.000 [1.500, 2.500] ± 0.250", ""]])


def test_two_seeds_are_plural_with_their_spread_and_an_old_config_grows_no_grid():
    from posenc.experiments.extend import report

    two = {**FIVE, "seeds": [0, 1]}
    assert report.title(two).endswith("480 test windows, 2 seeds: mean [95% interval] ± std over seeds")
    old = {**FIVE, "config": {k: v for k, v in FIVE["config"].items() if k != "finetune_widenings"}}
    assert "(the grid grows by a step past its edge while the best rate sits there, up to 0 times)" in \
        report.markdown(old)
