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
