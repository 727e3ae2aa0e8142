"""The Python examples of the README and of every docs page run as written (in order, one namespace per page),
and every docs page is linked from the README."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))

# What each page's examples must leave behind: a wrong or skipped block changes these.
OUTCOMES = {
    "README.md": lambda ns: ns["step"].shape == (1, 8, 1, 64) and ns["out"].shape == (1, 8, 128, 64),
    "api.md": lambda ns: ns["logits"].shape == (1, 1, 256) and ns["packed"].shape == (1, 8, 8, 64),
    "extend.md": lambda ns: ns["found"]["rope_type"] == "longrope" and len(ns["found"]["long_factor"]) == 16,
    "pretrained.md": lambda ns: ns["ids"].shape == (2, 8) and ns["group"] == 3 and ns["out"].shape == (1, 4, 100, 32),
}


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_python_examples_run(page):
    blocks = python_blocks(page)
    if page.name not in OUTCOMES:
        assert not blocks, f"{page.name} has Python examples: say in OUTCOMES what they must produce"
        return
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)
    assert OUTCOMES[page.name](namespace)


def test_the_readme_links_every_docs_page_and_stays_short():
    text = README.read_text()
    assert len(text.splitlines()) < 150  # the front door; the record is in docs/
    missing = [page.name for page in PAGES if f"docs/{page.name}" not in text]
    assert not missing, f"the README does not link {missing}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_relative_links_and_images_exist(page):
    targets = re.findall(r"\]\(([^)#:]+)\)", page.read_text())
    broken = [t for t in targets if not (page.parent / t).exists()]
    assert not broken, broken
