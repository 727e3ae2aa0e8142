"""extrapolate's tables, title and results.md from a made-up results dict: every header, cell and sentence a reader
sees, so a report that printed another length, seed count, rate or file count would fail."""

from posenc.experiments.extrapolate import report
from posenc.lm.runtime import provenance, provenance_line


def _difference(mean, low, high, **seeds):
    return {"mean": mean, "low": low, "high": high, **seeds}


def _results(seeds=2, lrs=(), overlap=True) -> dict:
    rows = [
        {"name": "learned", "description": "a table", "trained_encoding": "learned",
         "parameters": {"model": 1000, "encoding": 2048},
         "bits_per_byte": {"16": 2.5, "32": None}, "interval": {"16": [2.25, 2.75], "32": None},
         "bits_per_byte_std": {"16": 0.125, "32": None},
         "change_from_1x": {"16": _difference(0.0, 0.0, 0.0), "32": None},
         "vs_best": {"16": {"best": "rope", **_difference(0.5, 0.25, 0.75)}, "32": None},
         "rate_sweeps": [{"lr": 0.001, "at_edge": True, "scores": {"0.001": 2.0, "0.003": 2.5}}] * seeds},
        {"name": "rope", "description": "rotations", "trained_encoding": "rope",
         "parameters": {"model": 1000, "encoding": 0},
         "bits_per_byte": {"16": 2.0, "32": 3.0}, "interval": {"16": [1.875, 2.125], "32": [2.75, 3.25]},
         "bits_per_byte_std": {"16": 0.0, "32": 0.25},
         "change_from_1x": {"16": _difference(0.0, 0.0, 0.0),
                            "32": _difference(1.0, 0.75, 1.25, seed_low=-0.5, seed_high=2.5)},
         "vs_best": {"16": {"best": "rope", **_difference(0.0, 0.0, 0.0)},
                     "32": {"best": "rope", **_difference(0.0, 0.0, 0.0)}},
         "rate_sweeps": [{"lr": 0.003, "at_edge": False, "scores": {"0.001": 2.25, "0.003": 2.0}}] * seeds},
    ]
    return {
        "config": {"seeds": seeds, "seed": 3, "lrs": list(lrs)}, "train_length": 16, "eval_lengths": [16, 32],
        "protocol": "non-overlapping windows", "rows": rows,
        "windows": {"split": "test", "count": 12, "length": 32, "bytes": 384, "files": 5, "split_files": 9,
                    "split_bytes": 4096, "interval": "95% bootstrap over 5 files"},
        "train_overlap": {"in_train": 0.0625, "probes": 1200, "probe_bytes": 64, "files": {"a.py": 0.5, "b.py": 0.25,
                                                                                        "c.py": 0.125, "d.py": 0.1}}
        if overlap else None,
        "corpus": {"source": "stdlib", "files": 40, "sha256": "0123456789abcdef0123", "split": "by name"},
        "device": "cpu (2 cores)", "processes": 1, "wall_time_s": 99.6, "provenance": provenance(),
    }


def test_the_table_shows_cells_na_and_each_seeds_rate_with_a_grid():
    header, body = report.table_rows(_results())
    assert header == ["encoding", "1× (16)", "2× (32)"]
    assert body == [["learned", "2.500 [2.250, 2.750] ± 0.125", "N/A"],
                    ["rope", "2.000 [1.875, 2.125]", "3.000 [2.750, 3.250] ± 0.250"]]
    results = _results(lrs=(1e-3, 3e-3))
    header, body = report.table_rows(results)
    assert header[-1] == "lr (dev)" and [line[-1] for line in body] == ["0.001 (edge)", "0.003"]  # every seed alike
    results["rows"][1]["rate_sweeps"] = [{"lr": 0.003, "at_edge": False}, {"lr": 0.001, "at_edge": True}]
    assert report.table_rows(results)[1][1][-1] == "0.003, 0.001 (edge)"  # seeds apart: each seed's, in seed order


def test_the_rate_table_numbers_seeds_from_the_runs_first_and_needs_a_grid():
    assert report.rate_rows(_results()) is None
    header, body = report.rate_rows(_results(lrs=(1e-3, 3e-3)))
    assert header == ["encoding", "seed", "0.001", "0.003", "kept"]
    assert body[:2] == [["learned", "3", "**2.0000**", "2.5000", "0.001 (edge)"],
                        ["learned", "4", "**2.0000**", "2.5000", "0.001 (edge)"]]


def test_change_and_versus_best_tables():
    header, body = report.change_rows(_results())
    assert header == ["encoding", "2× (32)"]
    assert body == [["learned", "—"], ["rope", "+1.000 [+0.750, +1.250] (seeds [-0.500, +2.500]) (noise)"]]
    header, body = report.versus_best_rows(_results())
    assert header == ["encoding", "1× (16)", "2× (32)"]
    assert body == [["learned", "+0.500 [+0.250, +0.750]", "—"], ["rope", "best", "best"]]


def test_the_title_says_length_protocol_windows_and_seeds():
    assert report.title(_results()) == (
        "Bits per byte (lower is better), trained at 16 bytes, non-overlapping windows, 12 test windows of 32 bytes "
        "from 5 files, 2 seeds: mean [95% interval] ± std over seeds")
    assert report.title(_results(seeds=1)).endswith("from 5 files, 1 seed: mean [95% interval]")
    assert report.terminal_table(_results()).startswith(report.title(_results()) + "\nencoding ")


def test_the_overlap_line_names_the_share_and_the_three_worst_files():
    assert report.overlap_line(_results()["train_overlap"]) == (
        "Train/test overlap: 6.2% of 1,200 64-byte probes of the scored windows stand verbatim in train (most in "
        "a.py 50%, b.py 25%, c.py 12%).")
    clean = {"in_train": 0.0, "probes": 10, "probe_bytes": 8, "files": {}}
    assert report.overlap_line(clean) == ("Train/test overlap: 0.0% of 10 8-byte probes of the scored windows stand "
                                          "verbatim in train.")
    assert report.overlap_line(None) == "Train/test overlap: not measured by this run."


def test_the_parameters_line_lists_each_encodings_own_tables():
    assert report.parameters_line(_results()) == ("Parameters: 1,000 per model, the same for every encoding, plus "
                                                  "the encoding's own tables (learned 2,048).")
    results = _results()
    results["rows"][1]["parameters"] = {"model": 1000, "encoding": 16}
    assert report.parameters_line(results).endswith("own tables (learned 2,048, rope 16).")
    results["rows"][1]["parameters"] = {"model": 1000, "encoding": 0}
    results["rows"][0]["parameters"] = {"model": 1200, "encoding": 0}
    assert report.parameters_line(results) == ("Parameters: 1,000 / 1,200 per model, the same for every encoding, "
                                               "plus the encoding's own tables (none here).")


def test_results_md_has_every_section_in_order():
    results = _results(lrs=(1e-3, 3e-3))
    lines = report.markdown_table(results).split("\n")
    assert lines[:2] == [f"# {report.title(results)}", ""] and lines[2].startswith("| encoding | 1× (16) |")
    headings = ["## Change from the row's own 1× score (paired over the same windows)",
                "## Difference to the best row of each column (paired; '(noise)': the interval covers 0)",
                "## Learning rates, chosen on dev (bits per byte on dev windows at the training length)", "## Rows"]
    places = [lines.index(heading) for heading in headings]
    assert places == sorted(places) and all(lines[p - 1] == lines[p + 1] == "" for p in places)
    assert lines[places[-1] + 2 : places[-1] + 4] == ["- `learned`: a table", "- `rope`: rotations"]
    assert ("Scored on the test split: 12 windows of 32 bytes (384 bytes, a seeded sample stratified over 5 of its 9 "
            "files, 4,096 bytes), the same windows for every row and column; intervals: 95% bootstrap over 5 files."
            ) in lines
    assert report.overlap_line(results["train_overlap"]) in lines
    assert ("Corpus: stdlib (40 files, sha256 `0123456789abcdef`, split by name). Device: cpu (2 cores), 1 "
            f"process(es), training + evaluation 100s. {provenance_line(results['provenance'])}") in lines
    assert report.parameters_line(results) in lines
    footer = lines[lines.index("- `rope`: rotations") + 1 :]
    assert footer[0::2] == [""] * 6  # a blank line before each of the footer's five sentences, and the final newline
    assert lines[-2:] == ["N/A: the encoding has no value at that length (a learned table has no rows past its "
                          "training length).", ""]
    assert "## Learning rates" not in report.markdown_table(_results())
