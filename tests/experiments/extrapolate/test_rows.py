"""The extrapolation table's rows: what each trains, how each reads its checkpoint at a longer length, their order
and the --encodings parser. Every eval kwarg is checked at two factors and two training lengths, so a row that
ignored the column's factor, used a fixed one, or lost its RoPE base would fail."""

import re

import pytest

from posenc.encodings.registry import one_axis
from posenc.experiments.extrapolate import rows as rows_module
from posenc.experiments.extrapolate.rows import DEFAULT_ROWS, LAYOUT_ROWS, READ_ANOTHER_WAY, all_rows, parse_rows
from posenc.lm.layouts import LAYOUTS

ROWS = all_rows()  # the built-in encodings' rows


@pytest.mark.parametrize("factor, train_length", [(2.0, 64), (8.0, 128)])
def test_rope_rows_scale_by_the_columns_factor_from_the_training_length(factor, train_length):
    def scaling(name):
        return ROWS[name].eval_kwargs(factor, train_length)["scaling"]

    assert scaling("rope+pi") == {"rope_type": "linear", "rope_theta": 10000.0, "factor": factor}
    assert scaling("rope+ntk") == {"rope_type": "ntk", "rope_theta": 10000.0, "factor": factor}
    for name, fixed in (("rope+dynamic", factor), ("rope+dynamic1", 1.0)):
        assert scaling(name) == {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": fixed,
                                 "original_max_position_embeddings": train_length}, name
    assert scaling("rope+yarn") == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": factor,
                                    "original_max_position_embeddings": train_length}
    gemma = ROWS["swa+global+yarn"].eval_kwargs(factor, train_length)["scaling"]
    assert gemma["rope_theta"] == 1_000_000.0 == LAYOUTS["swa+global"].global_kwargs["base"]
    assert gemma["factor"] == factor and gemma["original_max_position_embeddings"] == train_length


@pytest.mark.parametrize("train_length", [64, 256])
def test_temperature_rows_take_the_training_length_as_their_floor(train_length):
    for name in ("none+temperature", "irope+temperature"):
        assert ROWS[name].eval_kwargs(4.0, train_length) == {
            "temperature": {"kind": "llama4", "beta": 0.1, "floor": train_length}}, name
    assert ROWS["learned+interpolate"].eval_kwargs(4.0, train_length) == {"beyond": "interpolate"}


def test_a_trained_row_reads_its_checkpoint_as_trained():
    for name in ("none", "rope", "learned", "alibi", "irope", "swa+global", "rnope-swa"):
        assert ROWS[name].eval_kwargs(8.0, 64) == {} and ROWS[name].train_kwargs == {}, name
        assert ROWS[name].trains == name


def test_rows_read_another_way_reuse_their_encodings_checkpoint_and_layout():
    for trained, rows in READ_ANOTHER_WAY.items():
        assert all(row.trains == trained and row.layout is None for row in rows)
    assert {row.name: (row.trains, row.layout) for row in LAYOUT_ROWS} == {
        "irope": ("irope", "irope"), "irope+temperature": ("irope", "irope"), "swa+global": ("swa+global", "swa+global"),
        "swa+global+yarn": ("swa+global", "swa+global"), "rnope-swa": ("rnope-swa", "rnope-swa")}
    assert ROWS["rnope-swa"].description == LAYOUTS["rnope-swa"].description
    assert all(ROWS[name].layout is None for name in one_axis())


def test_each_encoding_is_followed_by_the_rows_that_read_it_another_way_then_the_layouts():
    names = list(ROWS)
    for trained, rows in READ_ANOTHER_WAY.items():
        start = names.index(trained)
        assert names[start + 1 : start + 1 + len(rows)] == [row.name for row in rows], trained
    assert names[-len(LAYOUT_ROWS):] == [row.name for row in LAYOUT_ROWS]
    assert [name for name in names if name in one_axis()] == list(one_axis())
    assert names.index("rope+yarn") == names.index("rope") + 5


def test_parse_rows_keeps_table_order_and_refuses_what_it_does_not_know():
    assert [row.name for row in parse_rows("rope+yarn, none ,rope,")] == ["none", "rope", "rope+yarn"]
    assert [row.name for row in parse_rows("default")] == [n for n in ROWS if n in DEFAULT_ROWS]
    assert len(parse_rows("default")) == len(DEFAULT_ROWS) == 11
    assert [row.name for row in parse_rows("all")] == list(ROWS)
    with pytest.raises(ValueError, match=r"^--encodings names 'rope' twice; give each once$"):
        parse_rows("rope,none,rope")
    for spec, unknown in (("rope,nope", "['nope']"), ("", "[]"), (" , ", "[]"), ("All", "['All']")):
        with pytest.raises(ValueError, match=r"^--encodings: unknown rows " + re.escape(unknown)):
            parse_rows(spec)
    with pytest.raises(ValueError, match="valid: all, default, none, "):
        parse_rows("x")


def test_the_scaling_builder_itself():
    """The rows above are built when the module loads; this calls the builder as a row would be added later."""
    assert rows_module._rope_scaling("yarn")(4.0, 32) == {"scaling": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}}
    assert rows_module._rope_scaling("dynamic", fixed_factor=1.0, base=500.0)(8.0, 64)["scaling"] == {
        "rope_type": "dynamic", "rope_theta": 500.0, "factor": 1.0, "original_max_position_embeddings": 64}
    assert rows_module._rope_scaling("ntk", base=20.0)(2.0, 16)["scaling"]["rope_theta"] == 20.0
