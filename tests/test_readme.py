"""The Python examples of the README and of every docs page run as written (in order, one namespace per page),
every docs page is reachable from the README through docs/README.md, and every relative link of the README, the docs
and the benchmarks resolves: to a file that exists and, with a #fragment, to one of its headings."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INDEX = ROOT / "docs" / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
LINKED = [README, *PAGES, *sorted((ROOT / "benchmarks").rglob("*.md"))]

# What each page's examples must leave behind: a wrong or skipped block changes these.
OUTCOMES = {
    "README.md": lambda ns: ns["step"].shape == (1, 8, 1, 64) and ns["out"].shape == (1, 8, 128, 64),
    "docs/guide/api.md": lambda ns: ns["logits"].shape == (1, 1, 256) and ns["packed"].shape == (1, 8, 8, 64)
    and ns["mine"].shape == (1, 4, 16, 32) and "sqrt-decay" not in ns["posenc"].ENCODINGS,
    "docs/extend.md": lambda ns: ns["found"]["rope_type"] == "longrope" and len(ns["found"]["long_factor"]) == 16,
    "docs/pretrained.md": lambda ns: ns["ids"].shape == (2, 8) and ns["group"] == 3 and ns["out"].shape == (1, 4, 100, 32),
}


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


@pytest.mark.parametrize("page", [README, *PAGES], ids=name)
def test_python_examples_run(page):
    blocks = python_blocks(page)
    if name(page) not in OUTCOMES:
        assert not blocks, f"{name(page)} has Python examples: say in OUTCOMES what they must produce"
        return
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), namespace)
    assert OUTCOMES[name(page)](namespace)


def links(page: Path) -> list[str]:
    """The relative targets of ``page``'s Markdown links and images (outside code), fragments kept."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


def anchors(page: Path) -> set[str]:
    """GitHub's ids of ``page``'s headings: lower case, punctuation dropped, spaces as hyphens, repeats numbered."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
    return {slug if i == 0 else f"{slug}-{i}" for slug, n in seen.items() for i in range(n + 1)}


def test_the_readme_reaches_every_docs_page_and_stays_short():
    text = README.read_text()
    assert len(text.splitlines()) < 150  # the front door; the record is in docs/
    assert "docs/README.md" in text
    index = {(INDEX.parent / t.split("#")[0]).resolve() for t in links(INDEX)}
    missing = [name(page) for page in PAGES if page != INDEX and page not in index]
    assert not missing, f"docs/README.md does not link {missing}"


@pytest.mark.parametrize("page", LINKED, ids=name)
def test_relative_links_and_images_exist(page):
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (fragment and file.suffix == ".md" and fragment not in anchors(file)):
            broken.append(target)
    assert not broken, broken
