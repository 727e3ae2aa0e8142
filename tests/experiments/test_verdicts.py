"""The verdict rule and its sentences: which comparisons may carry a verdict, which are only consistent, the
family a tiny-model run declares, and the generated verdicts of the results page against their results files."""

import copy
import json
import re
from pathlib import Path

import pytest

from posenc.experiments import published, verdicts
from posenc.experiments.documents import correct, paired

ROOT = Path(__file__).resolve().parents[2]
T_975_4 = 2.7764451051977987  # Student t, 97.5% quantile, 4 degrees of freedom (tables)


def family(*columns, names=None) -> dict:
    """A corrected family of paired comparisons, one per column of per-unit differences (b = 0)."""
    names = names or [f"loss past: row{i} − base" for i in range(len(columns))]
    units = [f"unit {k}" for k in range(len(columns[0]))]
    return correct({name: paired(list(c), [0.0] * len(c), units) for name, c in zip(names, columns)})


@pytest.mark.parametrize("size, needed", [(1, 6), (12, 9), (18, 10), (19, 10), (40, 11)])
def test_the_units_a_family_needs_follow_from_the_smallest_sign_flip_p(size, needed):
    # m · 2 / 2^n < 0.05, the smallest n: 2^n > 40 m
    assert verdicts.units_needed(size) == needed
    assert size * verdicts.smallest_p(needed) < 0.05 <= size * verdicts.smallest_p(needed - 1)
    assert verdicts.smallest_p(5) == 1 / 16 and verdicts.smallest_p(17) == 1 / (1 + (1 << 16))


def test_five_units_that_agree_are_consistent_not_a_verdict():
    (c,) = family([0.30, 0.31, 0.29, 0.33, 0.30]).values()
    assert not c["verdict"] and c["p_holm"] == pytest.approx(1 / 16)
    assert verdicts.outcome(c) == verdicts.CONSISTENT
    one_disagrees = family([0.30, 0.31, 0.29, 0.33, -0.01])
    assert verdicts.outcome(one_disagrees["loss past: row0 − base"]) == verdicts.NONE


def test_sixteen_units_can_carry_a_verdict_and_an_interval_at_zero_cannot():
    strong = [0.1 + 0.01 * k for k in range(16)]
    around_zero = [(-1) ** k * 0.1 + 0.001 for k in range(16)]
    got = family(strong, around_zero)
    assert verdicts.outcome(got["loss past: row0 − base"]) == verdicts.VERDICT
    assert verdicts.outcome(got["loss past: row1 − base"]) == verdicts.NONE
    lines = verdicts.sentences(got, "document")
    assert lines[0].startswith("Family of 2 comparisons over 16 documents. A verdict needs") and "needs 7" not in lines[0]
    assert lines[2].startswith("- **row0 higher than base** (loss past: +0.175 [")
    assert lines[3].startswith("- No verdict: row1 − base, loss past: +0.001 [")


def test_parse_and_expand_a_declared_family_and_refuse_what_the_run_lacks():
    spec = verdicts.parse_family(" alibi:sandwich@8, rope+yarn:rope ")
    assert spec == (("alibi", "sandwich", 8), ("rope+yarn", "rope", None))
    expanded = verdicts.expand_family(spec, ["alibi", "sandwich", "rope", "rope+yarn"], (1, 2, 8))
    assert expanded == [{"a": "alibi", "b": "sandwich", "factor": 8}] + [
        {"a": "rope+yarn", "b": "rope", "factor": f} for f in (1, 2, 8)]
    for text, rows, message in [("alibi:sandwich@4", ["alibi", "sandwich"], "4 is not one of --eval-factors"),
                                ("alibi:fire", ["alibi", "sandwich"], "'fire' is not a row of this run"),
                                ("alibi:alibi", ["alibi"], "compares a row with itself"),
                                ("alibi:sandwich,alibi:sandwich@8", ["alibi", "sandwich"], "named twice")]:
        with pytest.raises(ValueError, match=message):
            verdicts.expand_family(verdicts.parse_family(text), rows, (1, 2, 8))
    for bad in ("alibi", "alibi:", ":sandwich", "alibi:sandwich@x"):
        with pytest.raises(ValueError, match="ROW:ROW or ROW:ROW@FACTOR"):
            verdicts.parse_family(bad)


def tiny_results(per_seed: dict[str, list[dict]], comparisons: list[dict]) -> dict:
    return {"config": {"seed": 3}, "train_length": 16, "family": {"declared": "before the run", "exploratory": False,
                                                                  "comparisons": comparisons},
            "rows": [{"name": name, "per_seed": seeds} for name, seeds in per_seed.items()]}


def test_seed_comparisons_pair_each_seeds_mean_and_correct_the_family():
    a = [{"16": 2.0 + s, "32": 2.5 + s} for s in (0.0, 0.1, 0.3, 0.2, 0.4)]
    b = [{"16": 2.1 + s, "32": None} for s in (0.0, 0.1, 0.3, 0.2, 0.5)]
    results = tiny_results({"a": a, "b": b}, [{"a": "a", "b": "b", "factor": 1}, {"a": "a", "b": "b", "factor": 2}])
    got = verdicts.seed_comparisons(results)
    (name, c), = got.items()
    assert name == "bits at 1× (16): a − b" and list(c["per_document"]) == [f"seed {s}" for s in range(3, 8)]
    differences = [-0.1, -0.1, -0.1, -0.1, -0.2]
    assert list(c["per_document"].values()) == pytest.approx(differences)
    mean = sum(differences) / 5
    sd = (sum((d - mean) ** 2 for d in differences) / 4) ** 0.5
    assert c["mean"] == pytest.approx(-0.12) and c["comparisons"] == 1
    assert c["corrected"] == pytest.approx([mean - T_975_4 * sd / 5 ** 0.5, mean + T_975_4 * sd / 5 ** 0.5])
    assert verdicts.without_values(results) == ["a − b at 2×"]
    lines = verdicts.tiny_lines(results)
    assert "- No value (a row has none at that length): a − b at 2×." in lines
    assert lines[-1] == "When the family was fixed: before the run."


def test_a_results_file_without_a_family_is_refused_for_verdicts():
    with pytest.raises(ValueError, match="declares no family"):
        verdicts.tiny_lines({"rows": []})


def readme_verdicts(results: dict) -> list[str]:
    return [line for line in verdicts.pretrained_lines(results, compact=True) if line.startswith("- **")]


def test_a_verdict_sentence_goes_when_its_interval_stops_excluding_zero(tmp_path):
    """The committed 1.5× run: pull one verdict's per-document differences to zero mean and its sentence leaves the
    verdicts for the 'No verdict' paragraph, which the README check then reports as stale."""
    source = ROOT / "docs" / "results" / "smollm2-1.5x-calibrated-all.json"
    results = json.loads(source.read_text())
    name = "loss past: self-extend − yarn"
    assert any(line.startswith("- **self-extend lower than yarn**") for line in readme_verdicts(results))
    moved = copy.deepcopy(results)
    per_document = moved["comparisons"][name]["per_document"]
    shift = sum(per_document.values()) / len(per_document)
    raw = {key: {**c, "per_document": {d: v - (shift if key == name else 0.0) for d, v in c["per_document"].items()}}
           for key, c in moved["comparisons"].items()}
    moved["comparisons"] = correct({key: paired(list(c["per_document"].values()), [0.0] * len(c["per_document"]),
                                                list(c["per_document"])) for key, c in raw.items()})
    lowest, highest = moved["comparisons"][name]["corrected"]
    assert lowest <= 0 <= highest
    assert not any("self-extend lower than yarn" in line for line in readme_verdicts(moved))
    assert "self-extend − yarn, loss past +0.000" in " ".join(verdicts.pretrained_lines(moved, compact=True))
    page = tmp_path / "page.md"
    (tmp_path / "results.json").write_text(json.dumps(results))
    page.write_text("<!-- generated by `posenc report`: pretrained-verdicts-compact results.json -->\n"
                    + published.render("pretrained-verdicts-compact", results) + published.END + "\n")
    assert published.stale([page]) == []
    (tmp_path / "results.json").write_text(json.dumps(moved))
    assert published.stale([page]) == [page]


def test_every_bold_verdict_on_the_results_page_has_a_corrected_interval_off_zero():
    text = (ROOT / "docs" / "results.md").read_text()
    bold = re.findall(r"^- \*\*.*?corrected \[([-+]\d\.\d+), ([-+]\d\.\d+)\]", text, flags=re.M)
    assert len(bold) >= 10
    assert all(not float(low) <= 0 <= float(high) for low, high in bold)


def test_the_headline_counts_the_verdicts_and_groups_them_by_measure():
    strong = [0.1 + 0.01 * k for k in range(16)]
    weaker = [-0.05 - 0.002 * k for k in range(16)]
    around_zero = [(-1) ** k * 0.1 + 0.001 for k in range(16)]
    got = family(strong, weaker, around_zero,
                 names=["loss past: a − base", "loss past: b − base", "keys found: c − base"])
    text = " ".join(verdicts.headline(got, "document"))
    low, high = got["loss past: a − base"]["corrected"]
    assert text.startswith("2 of 3 comparisons carry a verdict over 16 documents")
    assert f"loss past: a − base +0.175 [{low:+.3f}, {high:+.3f}], b − base -0.065 [" in text
    assert text.endswith("No verdict: c − base (keys found).")
    consistent = family([0.30, 0.31, 0.29, 0.33, 0.30], [0.1, -0.1, 0.1, -0.1, 0.1])
    assert " ".join(verdicts.headline(consistent, "seed")) == (
        "0 of 2 comparisons carry a verdict over 5 seeds (mean, Bonferroni-corrected interval). Consistent in every "
        "seed, too few seeds for a verdict: row0 − base (loss past). No verdict: row1 − base (loss past).")


def test_a_tiny_headline_says_when_its_family_was_declared():
    a = [{"16": 2.0 + s} for s in (0.0, 0.1, 0.3, 0.2, 0.4)]
    b = [{"16": 2.1 + s} for s in (0.0, 0.1, 0.3, 0.2, 0.5)]
    results = tiny_results({"a": a, "b": b}, [{"a": "a", "b": "b", "factor": 1}])
    text = " ".join(verdicts.tiny_headline(results))
    assert text.startswith("0 of 1 comparisons carry a verdict over 5 seeds")
    assert text.endswith("The family was declared before the run.")
    with pytest.raises(ValueError, match="declares no family"):
        verdicts.tiny_headline({"rows": []})
    exploratory = {**results, "family": {**results["family"], "exploratory": True}}
    assert " ".join(verdicts.tiny_headline(exploratory)).endswith(
        "Exploratory: the family was fixed after results were seen.")


def test_the_committed_real_model_headline_names_its_family_exploratory():
    results = json.loads((ROOT / "docs" / "results" / "smollm2-1.5x-calibrated-all.json").read_text())
    text = " ".join(verdicts.pretrained_headline(results))
    assert text.startswith("12 of 18 comparisons carry a verdict over 16 documents")
    assert "keys found: yarn − none +0.633 [" in text
    assert "No verdict: 6 comparisons." in text  # past HEADLINE_NAMES, counted
    assert text.endswith("Exploratory: the family was fixed after results were seen.")


def test_a_tiny_headline_names_comparisons_without_values_and_survives_having_none():
    """A learned table has no value past its length: the headline says which comparisons lack one, as the full
    lines do, and a family with none left says so instead of failing."""
    a = [{"16": 2.0 + s, "32": 2.5} for s in (0.0, 0.1, 0.3, 0.2, 0.4)]
    b = [{"16": 2.1 + s, "32": None} for s in (0.0, 0.1, 0.3, 0.2, 0.5)]
    both = tiny_results({"a": a, "b": b}, [{"a": "a", "b": "b", "factor": 1}, {"a": "a", "b": "b", "factor": 2}])
    text = " ".join(verdicts.tiny_headline(both))
    assert text.startswith("0 of 1 comparisons") and "No value (a row has none at that length): a − b at 2×." in text
    only_missing = tiny_results({"a": a, "b": b}, [{"a": "a", "b": "b", "factor": 2}])
    assert " ".join(verdicts.tiny_headline(only_missing)).startswith(
        "No declared comparison has values in both rows. No value (a row has none at that length): a − b at 2×.")


def test_a_headline_names_up_to_three_comparisons_of_a_kind_and_counts_more():
    around_zero = [[(-1) ** k * 0.1 + 0.001 * j for k in range(16)] for j in range(4)]
    names = [f"loss past: row{j} − base" for j in range(4)]
    three = " ".join(verdicts.headline(family(*around_zero[:3], names=names[:3]), "document"))
    assert three.endswith("No verdict: row0 − base (loss past), row1 − base (loss past), row2 − base (loss past).")
    four = " ".join(verdicts.headline(family(*around_zero, names=names), "document"))
    assert four.endswith("No verdict: 4 comparisons.")


def test_wrapping_breaks_neither_a_long_word_nor_a_hyphenated_one():
    hyphenated = "x" * 100 + " Bonferroni-corrected interval"
    assert verdicts.wrapped([hyphenated]) == ["x" * 100, "Bonferroni-corrected interval"]
    long_word = "- see " + "y" * 130 + " next"
    assert verdicts.wrapped([long_word]) == ["- see", "  " + "y" * 130, "  next"]
    assert verdicts.wrapped(["", "short"]) == ["", "short"]


def test_every_comparison_without_a_value_is_named_once():
    a = [{"16": 2.0 + s, "32": 2.5, "64": 2.6} for s in (0.0, 0.1, 0.3, 0.2, 0.4)]
    b = [{"16": 2.1 + s, "32": None, "64": None} for s in (0.0, 0.1, 0.3, 0.2, 0.5)]
    results = tiny_results({"a": a, "b": b}, [{"a": "a", "b": "b", "factor": f} for f in (1, 2, 4)])
    named = "No value (a row has none at that length): a − b at 2×, a − b at 4×."
    assert "- " + named in verdicts.tiny_lines(results)
    assert named in " ".join(verdicts.tiny_headline(results))


def test_when_a_family_was_fixed_reads_results_that_predate_families():
    assert verdicts.when_fixed({}) == "When the family was fixed: not recorded."
    assert verdicts.when_fixed({"family": {"declared": None}}) == "When the family was fixed: not recorded."
    assert verdicts.family_line({}) == "When the family was fixed: not recorded (the run predates declared families)."


def test_refusals_name_the_rows_and_nothing_else():
    with pytest.raises(ValueError, match=r"'fire' is not a row of this run; its rows: alibi, sandwich$"):
        verdicts.expand_family(verdicts.parse_family("alibi:fire"), ["alibi", "sandwich"], (1,))
    with pytest.raises(ValueError, match=r"^--compare: a comparison is named twice$"):
        verdicts.expand_family(verdicts.parse_family("alibi:sandwich@1,alibi:sandwich"), ["alibi", "sandwich"], (1,))
    for lines in (verdicts.tiny_lines, verdicts.tiny_headline):
        with pytest.raises(ValueError, match=r"^this results file declares no family of comparisons \(extrapolate "
                                             r"--compare\)$"):
            lines({"rows": []})
