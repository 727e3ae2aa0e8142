"""The tree's shape as rules: arrows point down, commands stay apart, nothing imports in a circle.

Every ``import`` in ``src/posenc`` (function-level ones too) is read with ``ast`` and resolved to a
module of the package. A module belongs to a *unit*: a top-level module (``attention``) or a wing folder
(``lm``). Units are ranked from the foundations up; a module may import its own unit and units ranked
below it, never above. Inside ``experiments/``, each command's sub-package imports no other command's
modules, except that ``extend`` may use ``extrapolate``'s public names (its package ``__init__``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "posenc"

# From the foundations up: each unit may import only the units before it (and itself).
# "posenc" is the package's own __init__ (public names and __version__ over encodings and attention).
UNITS = ("checks", "storage", "positions", "kernels", "encodings", "attention", "posenc", "lm", "extension",
         "hf", "figures", "experiments", "verify", "bench", "cli", "__main__")
COMMANDS = ("extrapolate", "tasks", "extend", "pretrained")
TOP_LEVEL_MODULES_AT_MOST = 9
#: the one experiments module above the commands: it renders their reports into the README's and docs' tables
PUBLISHER = "posenc.experiments.published"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(name: str) -> bool:
    return (SRC / Path(*name.split(".")) / "__init__.py").exists()


def is_module(name: str) -> bool:
    return is_package(name) or (SRC / Path(*name.split("."))).with_suffix(".py").exists()


def source_of(path: Path) -> tuple[str, str, bool]:
    """(module name, text, is a package __init__) of a file under src/."""
    return module_name(path), path.read_text(), path.name == "__init__.py"


def imports_of(name: str, text: str, is_init: bool) -> list[tuple[str, int, bool]]:
    """(imported posenc module, line, at module level) for every import in module ``name``, relative ones resolved."""
    package = name if is_init else name.rpartition(".")[0]
    tree = ast.parse(text)
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in top) for alias in node.names
                      if alias.name.split(".")[0] == "posenc"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                source = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "posenc":
                continue
            for alias in node.names:  # `from package import submodule` imports the submodule
                target = f"{source}.{alias.name}"
                found.append((target if is_module(target) else source, node.lineno, id(node) in top))
    return found


def unit_of(name: str) -> str:
    parts = name.split(".")
    return "posenc" if len(parts) == 1 else parts[1]


def command_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "experiments" and parts[2] in COMMANDS else None


def violations(name: str, text: str, is_init: bool) -> list[str]:
    """Every import of module ``name`` that breaks a rule, as 'module:line imports target: why'."""
    found = []
    for target, line, _ in imports_of(name, text, is_init):
        where = f"{name}:{line} imports {target}"
        mine, theirs = UNITS.index(unit_of(name)), UNITS.index(unit_of(target))
        if theirs > mine:
            found.append(f"{where}: {unit_of(name)} may not import {unit_of(target)} (arrows point down)")
        a, b = command_of(name), command_of(target)
        if unit_of(name) == "experiments" and a is None and b is not None and name != PUBLISHER:
            found.append(f"{where}: shared experiment modules may not import a command")
        public_extrapolate = a == "extend" and target == "posenc.experiments.extrapolate"
        if a and b and a != b and not public_extrapolate:
            found.append(f"{where}: command {a} may not import command {b}'s modules")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles among module-level imports, each as the path that closes it."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def module_level_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name, text, is_init = source_of(path)
        graph[name] = {target for target, _, top in imports_of(name, text, is_init) if top} - {name}
    return graph


def test_every_unit_is_ranked():
    units = {unit_of(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert units <= set(UNITS), f"rank these in UNITS: {sorted(units - set(UNITS))}"


def test_imports_point_down_and_commands_stay_apart():
    found = [v for path in sorted(PACKAGE.rglob("*.py")) for v in violations(*source_of(path))]
    assert not found, "\n".join(found)


def test_no_import_cycles():
    assert cycles(module_level_graph()) == []


def test_top_level_holds_few_modules_and_each_wing_says_what_lives_there():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= TOP_LEVEL_MODULES_AT_MOST, modules
    for init in PACKAGE.glob("*/__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring) > 80, f"{init}: say what lives in this wing and what it may import"


def test_no_source_file_exceeds_400_lines():
    long = {str(p.relative_to(SRC)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


@pytest.mark.parametrize("module, line, why", [
    ("lm/model.py", "from ..experiments.extrapolate import run", "lm may not import experiments"),
    ("encodings/rotary.py", "from ..lm.model import LanguageModel", "encodings may not import lm"),
    ("figures/style.py", "from ..experiments import tables", "figures may not import experiments"),
    ("experiments/pretrained/stages.py", "from ..extend.config import ExtendConfig",
     "command pretrained may not import command extend"),
    ("experiments/extend/stages.py", "from ..extrapolate.stages import prepare_run_dir",
     "command extend may not import command extrapolate"),
    ("experiments/tables.py", "from .extrapolate import run", "shared experiment modules may not import a command"),
    ("hf/loading.py", "import posenc.experiments.pretrained", "hf may not import experiments"),
])
def test_a_forbidden_import_is_caught(module, line, why):
    """Each rule fails on the import it forbids, added to the real module's text."""
    name, text, is_init = source_of(PACKAGE / module)
    assert not violations(name, text, is_init)
    assert any(why in v for v in violations(name, text + f"\n{line}\n", is_init))


def test_extend_may_use_extrapolates_public_names_only():
    name, text, is_init = source_of(PACKAGE / "experiments/extend/stages.py")
    assert "posenc.experiments.extrapolate" in {target for target, _, _ in imports_of(name, text, is_init)}
    assert not violations(name, text, is_init)


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


#: modules whose lists of encoding names are choices, not traits: the default preset's rows (a preset is data), and
#: ``extend``, which compares RoPE with ALiBi by design
NAME_LISTS_ALLOWED = {"posenc.encodings.registry", "posenc.experiments.extrapolate.rows",
                      "posenc.experiments.extend.plan"}


def listed_encoding_names(text: str) -> list[tuple[int, list[str]]]:
    """(line, names) of every tuple, list or set literal in ``text`` holding two or more encoding names (or rows
    named after one, "rope+yarn")."""
    from posenc.encodings.registry import ENTRIES

    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            listed = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                      and e.value.split("+")[0] in ENTRIES]
            if len(listed) >= 2:
                found.append((node.lineno, listed))
    return found


def test_no_list_of_encoding_names_outside_the_registry():
    """Benches, checks and commands pick encodings by trait (``registry.having``, ``one_axis``), so a new encoding
    joins them without an edit; a list of names would leave it out silently."""
    found = [f"{module_name(path)}:{line} {names}" for path in sorted(PACKAGE.rglob("*.py"))
             if module_name(path) not in NAME_LISTS_ALLOWED for line, names in listed_encoding_names(path.read_text())]
    assert not found, found
    assert listed_encoding_names('for name in ("alibi", "sandwich"):\n    pass\n') == [(1, ["alibi", "sandwich"])]
    assert listed_encoding_names('ROWS = ["rope+yarn", "none"]\n') == [(1, ["rope+yarn", "none"])]


#: where an encoding's name may be written as a string, and why: besides its own module and the registry, the
#: modules whose presets or comparisons are choices of encodings (data, not traits), and the modules where the
#: same word names something else
NAME_LITERALS_ALLOWED = {
    "posenc.experiments.extrapolate.rows": "the default preset's rows, and the rows that read RoPE's and the "
                                           "learned table's checkpoints another way",
    "posenc.experiments.extend": "posenc extend stretches a RoPE checkpoint and compares it with ALiBi's, by design",
    "posenc.figures.extend": "draws posenc extend's RoPE and ALiBi curves",
    "posenc.lm.model": "ModelConfig's default encoding (RoPE)",
}
#: (module, name): the word means something else there
OTHER_MEANINGS = {
    ("posenc.experiments.pretrained", "none"): "the unscaled model, a row of the scaling methods",
    ("posenc.extension.longrope", "none"): "a loss reduction",
    ("posenc.lm.evaluate", "none"): "a loss reduction",
    ("posenc.positions", "none"): "a cross-attention mode",
    ("posenc.hf", "t5"): "a Hugging Face model type",
    ("posenc.hf", "rope"): "a key of a layer's description: whether it rotates",
    ("posenc.bench", "rope"): "the RoPE-apply table's name",
    ("posenc.kernels.tiles_triton", "fire"): "the kind of offset formula FIRE's tiles compute",
}


def encoding_name_literals(text: str) -> list[tuple[int, str]]:
    """(line, name) of every string constant (docstrings aside) that is a registered encoding's name or a row
    named after one ("rope+yarn", "rope+")."""
    from posenc.encodings.registry import ENTRIES

    tree = ast.parse(text)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and (node.value in ENTRIES or ("+" in node.value and node.value.split("+")[0] in ENTRIES))]


def _allowed(module: str, name: str) -> bool:
    from posenc.encodings.registry import ENTRIES

    base = name.split("+")[0]
    home = ENTRIES[base].cls.__module__
    within = lambda prefix: module == prefix or module.startswith(prefix + ".")  # noqa: E731
    return (module in (home, "posenc.encodings.registry") or any(within(m) for m in NAME_LITERALS_ALLOWED)
            or any(within(m) and base == word for m, word in OTHER_MEANINGS))


def test_no_encoding_name_is_written_outside_its_home():
    """Code that is about one scheme names it through the registry (``name_of(RoPE)``, ``baseline()``) or asks a
    trait; a string would survive a rename silently and hide which trait the code is after."""
    found = [f"{module_name(path)}:{line} {name!r}" for path in sorted(PACKAGE.rglob("*.py"))
             for line, name in encoding_name_literals(path.read_text()) if not _allowed(module_name(path), name)]
    assert not found, "\n".join(found)
    assert sorted(encoding_name_literals('"""rope"""\nx = "alibi" if a else "rope+yarn"\n')) == [
        (2, "alibi"), (2, "rope+yarn")]
    assert not _allowed("posenc.verify", "rope") and _allowed("posenc.encodings.rotary", "rope")
    assert _allowed("posenc.positions", "none") and not _allowed("posenc.positions", "alibi")
