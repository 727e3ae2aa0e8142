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
    assert lines[2].endswith("| +0.395 [+0.375, +0.420] |")  # PI against the control at 8×, as docs/extend.md says
    every = published.render("extend-comparisons", RESULTS).splitlines()
    assert set(lines[2:]) < set(every[2:]) and len(every) > len(lines)
