"""The cells every report shares say what their numbers support."""

from posenc.experiments import intervals, tables


def test_a_difference_is_noise_unless_its_seed_interval_agrees():
    one_seed = {"mean": -0.07, "low": -0.079, "high": -0.059}
    assert tables.difference_cell(one_seed) == "-0.070 [-0.079, -0.059]"
    disagreeing = {**one_seed, "seed_low": -0.24, "seed_high": 0.1}
    assert tables.difference_cell(disagreeing) == "-0.070 [-0.079, -0.059] (seeds [-0.240, +0.100]) (noise)"
    agreeing = {**one_seed, "seed_low": -0.1, "seed_high": -0.04}
    assert tables.difference_cell(agreeing) == "-0.070 [-0.079, -0.059] (seeds [-0.100, -0.040])"
    assert tables.difference_cell({"mean": 0.01, "low": -0.01, "high": 0.03}).endswith("(noise)")
    assert tables.difference_cell({"mean": 0.0, "low": 0.0, "high": 0.0}) == "identical"
    assert tables.difference_cell(None) == "—"
    assert intervals.supported(agreeing) and not intervals.supported(disagreeing)


def test_text_tables_pad_each_column_to_its_widest_cell():
    table = tables.text_table(["row", "1×"], [["rope", "2.5"], ["alibi fine-tuned", "10.25"]])
    assert table.splitlines() == ["row               1×   ", "----------------  -----",
                                  "rope              2.5  ", "alibi fine-tuned  10.25"]


def test_markdown_tables_right_align_the_number_columns():
    assert tables.markdown_table(["row", "stage", "1×"], [["rope", "zero-shot", "2.5"]], text_columns=2) == [
        "| row | stage | 1× |", "| --- | --- | ---: |", "| rope | zero-shot | 2.5 |"]
    assert tables.markdown_table(["row", "1×", "2×"], [])[1] == "| --- | ---: | ---: |"


def test_interval_and_stage_cells():
    assert tables.interval_cell(2.2534, [2.2411, 2.2659]) == "2.253 [2.241, 2.266]"
    assert tables.interval_cell(2.2534, [2.2411, 2.2659], 0.0123) == "2.253 [2.241, 2.266] ± 0.012"
    assert tables.interval_cell(2.2534, [2.2411, 2.2659], 0.0) == "2.253 [2.241, 2.266]"  # one seed: no spread
    assert tables.interval_cell(None, None) == "N/A"
    assert tables.stage_rows({"search": 243.94, "evaluation": 5.0}) == [["search", "243.9"], ["evaluation", "5.0"]]


def test_rate_rows_line_up_every_rate_any_seed_scored():
    sweeps = {"rope": [{"lr": 0.003, "at_edge": False, "scores": {"0.001": 2.5, "0.003": 2.25, "0.01": 2.75,
                                                                   "1e-05": 4.0}},
                       {"lr": 0.01, "at_edge": True, "scores": {"0.003": 2.5, "0.01": 2.125}}],
              "none": [{"lr": 0.001, "at_edge": False, "scores": {"0.000333333": 3.0, "0.001": 2.0, "0.003": 2.5}}]}
    header, body = tables.rate_rows(sweeps, first_seed=4)
    assert header == ["encoding", "seed", "1e-05", "0.000333333", "0.001", "0.003", "0.01", "kept"]  # by value
    assert body == [["rope", "4", "4.0000", "—", "2.5000", "**2.2500**", "2.7500", "0.003"],
                    ["rope", "5", "—", "—", "—", "2.5000", "**2.1250**", "0.01 (edge)"],
                    ["none", "4", "—", "3.0000", "**2.0000**", "2.5000", "—", "0.001"]]
