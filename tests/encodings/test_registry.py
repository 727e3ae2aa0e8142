"""The registry is the one list of encodings: every encoding class is in it, docs/guide/api.md's table says what it
says, and bench, verify, the extrapolation rows and the tasks read their lists from it."""

import inspect
import re
from pathlib import Path

import posenc.encodings as encodings
from posenc.bench import attention as bench_attention, command as bench_command
from posenc.encodings import REGISTRY, PositionalEncoding
from posenc.encodings.registry import one_axis, symmetric
from posenc.experiments.extrapolate.rows import all_rows
from posenc.lm.layouts import LAYOUTS
from posenc.experiments.tasks.config import TaskConfig
from posenc import verify

API = Path(__file__).resolve().parents[2] / "docs" / "guide" / "api.md"


def docs_table() -> dict[str, list[str]]:
    """{name: [door, paper, kwargs]} from the Encodings table of docs/guide/api.md."""
    section = API.read_text().split("## Encodings", 1)[1]
    rows = re.findall(r"^\| `([a-z0-9_-]+)` \| (.+?) \| (.+?) \| (.+?) \|$", section, flags=re.MULTILINE)
    return {name: [door, paper, kwargs] for name, door, paper, kwargs in rows}


def test_every_encoding_class_is_registered_once():
    classes = {cls for module in vars(encodings).values() if inspect.ismodule(module)
               for cls in vars(module).values()
               if inspect.isclass(cls) and issubclass(cls, PositionalEncoding) and cls.__module__ == module.__name__}
    abstract = {cls for cls in classes if any(sub in classes for sub in cls.__subclasses__())
                and cls not in {entry.cls for entry in REGISTRY}}
    assert {entry.cls for entry in REGISTRY} == classes - abstract
    assert len({entry.name for entry in REGISTRY}) == len(REGISTRY)


def test_the_docs_table_is_the_registry():
    table = docs_table()
    assert list(table) == [entry.name for entry in REGISTRY]
    for entry in REGISTRY:
        door, paper, kwargs = table[entry.name]
        assert (door, paper) == (entry.door, entry.paper), entry.name
        for parameter in list(inspect.signature(entry.cls.__init__).parameters.values())[1:]:
            if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                assert f"`{parameter.name}" in kwargs, f"{entry.name}: docs/guide/api.md does not name {parameter.name}"


def test_the_commands_read_their_lists_from_the_registry():
    from_positions = one_axis(in_attention=True, from_positions=True)
    assert bench_attention.timed_encodings() == from_positions and verify.attention_encodings() == from_positions
    assert bench_command.every_encoding()[:len(one_axis())] == one_axis()
    assert set(one_axis(in_attention=True)) - set(from_positions) == {"fox"}  # its bias needs its tokens' gates
    rows = all_rows()
    assert [name for name, row in rows.items() if row.name == row.trains and row.layout is None] == list(one_axis())
    assert {row.trains for row in rows.values() if row.layout} == set(LAYOUTS)  # the layouts' rows, from lm.layouts
    assert [trains for _, trains, _ in TaskConfig.from_preset("copy", "smoke", encodings=",".join(one_axis())).rows] \
        == list(one_axis())
    assert "mrope" not in one_axis() and set(symmetric()) == {"kerple", "sandwich", "fire", "cope"}
