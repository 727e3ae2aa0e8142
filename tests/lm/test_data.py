import sysconfig
from collections import Counter
from pathlib import Path

import pytest
import torch

from posenc.lm.data import (Split, check_corpus_size, sample_windows, split_of, stdlib_corpus, stdlib_documents,
                            text_corpus, train_batch)
from posenc.lm.leakage import near_duplicate_groups
from posenc.lm.evaluate import sliding_windows


@pytest.fixture(scope="module")
def stdlib():
    return stdlib_corpus()


def test_stdlib_corpus_is_split_by_file_and_fingerprinted(stdlib):
    f = stdlib.fingerprint
    assert f["files"] > 300 and len(stdlib.train) > 5_000_000
    assert len(stdlib.dev) > 100_000 and len(stdlib.test) > 100_000
    assert len(stdlib.train.files) + len(stdlib.dev.files) + len(stdlib.test.files) == f["files"]
    assert len(f["sha256"]) == 64 and f["python_version"]
    # Same bytes every time: the fingerprint is reproducible.
    assert stdlib_corpus().fingerprint["sha256"] == f["sha256"]


def test_train_dev_and_test_hold_disjoint_files_chosen_by_their_group_s_path(stdlib):
    """Each file goes where its near-duplicate group's first path sends it: a file like no other, by its own path;
    the stdlib's generated codec tables (encodings/cp*.py), all in one split."""
    train, dev, test = (set(split.files) for split in (stdlib.train, stdlib.dev, stdlib.test))
    assert not (train & dev) and not (train & test) and not (dev & test)
    groups = near_duplicate_groups(stdlib_documents())
    for name, split in [(n, "train") for n in train] + [(n, "dev") for n in dev] + [(n, "test") for n in test]:
        assert split_of(groups[name]) == split, name
    near = stdlib.fingerprint["near_duplicates"]
    assert near["documents"] > 50 and near["groups"] >= 5 and near["moved"] >= 5
    windows_codecs = {groups[f"encodings/cp125{digit}.py"] for digit in range(9)}  # generated from one template
    assert len(windows_codecs) == 1 and groups["bz2.py"] == groups["lzma.py"] == "bz2.py"
    assert sum(split_of(name) != split_of(groups[name]) for name in groups) == near["moved"]


def test_dev_and_test_bytes_never_appear_in_training(stdlib):
    train = bytes(stdlib.train.data.tolist())
    for split in (stdlib.dev, stdlib.test):
        for start in split.starts[:5]:
            probe = bytes(split.data[start + 100 : start + 300].tolist())
            assert len(probe) == 200 and probe not in train


def test_each_file_starts_where_the_split_says(stdlib):
    for name, start in list(zip(stdlib.test.files, stdlib.test.starts))[:5]:
        assert stdlib.test.file_at(start) == name and stdlib.test.file_at(start + 1) == name
        assert bytes(stdlib.test.data[start : start + 20].tolist()) in (Path(sysconfig.get_paths()["stdlib"])
                                                                       / name).read_bytes()


def test_text_corpus_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="no such file or folder"):
        text_corpus(tmp_path / "missing.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no files"):
        text_corpus(tmp_path / "empty")
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("hello world")
    with pytest.raises(ValueError, match="corpus too small: the train split has 9 bytes"):
        check_corpus_size(text_corpus(tiny), train_length=64, window=512)


def test_folder_corpus_splits_by_file(tmp_path):
    for i in range(60):
        (tmp_path / f"doc{i:02}.txt").write_text(f"document {i} " * 50)
    corpus = text_corpus(tmp_path)
    assert corpus.fingerprint["files"] == 60
    assert 0 < len(corpus.dev) < len(corpus.train) and 0 < len(corpus.test) < len(corpus.train)
    assert corpus.fingerprint["split"].startswith("by document: sha256(name) % 20 < 1 is test")


def test_a_single_file_is_split_by_bytes_into_three(tmp_path):
    (tmp_path / "one.txt").write_bytes(bytes(range(256)) * 40)
    corpus = text_corpus(tmp_path / "one.txt")
    assert (len(corpus.train), len(corpus.dev), len(corpus.test)) == (9216, 512, 512)
    assert torch.equal(torch.cat((corpus.train.data, corpus.dev.data, corpus.test.data)),
                       torch.tensor(list(bytes(range(256)) * 40), dtype=torch.uint8))


def test_train_batches_are_reproducible_next_byte_pairs(stdlib):
    x1, y1 = train_batch(stdlib.train.data, 32, 4, torch.Generator().manual_seed(3))
    x2, y2 = train_batch(stdlib.train.data, 32, 4, torch.Generator().manual_seed(3))
    assert torch.equal(x1, x2) and torch.equal(y1[:, :-1], x1[:, 1:])


@pytest.mark.parametrize("length, stride", [(8, 2), (8, 8), (5, 3), (16, 1)])
def test_sliding_windows_score_every_token_once(length, stride):
    tokens = 40
    seen = []
    for start, first in sliding_windows(tokens, length, stride):
        assert 0 <= start and start + length <= tokens
        seen += list(range(start + first, start + length))
    assert seen == list(range(tokens))


def _split(sizes: dict[str, int]) -> Split:
    data, starts = bytearray(), []
    for i, size in enumerate(sizes.values()):
        starts.append(len(data))
        data.extend(bytes([i]) * size)
    return Split(torch.tensor(list(data), dtype=torch.uint8), tuple(sizes), tuple(starts))


def test_windows_are_a_stratified_sample_of_non_overlapping_slots():
    split = _split({"big": 600, "mid": 300, "small": 100})  # 100 slots of 10 bytes: 60 / 30 / 10
    windows = sample_windows(split, 9, 10, seed=3)
    assert windows.tokens.shape == (10, 10) and windows.length == 9
    assert Counter(windows.files) == {"big": 6, "mid": 3, "small": 1}
    assert list(windows.offsets) == sorted(windows.offsets) and len(set(windows.offsets)) == 10
    for tokens, offset, name in zip(windows.tokens, windows.offsets, windows.files):
        assert offset % 10 == 0 and split.file_at(offset) == name
        assert torch.equal(tokens, split.data[offset : offset + 10].long())
    assert sample_windows(split, 9, 10, seed=3).offsets == windows.offsets
    assert sample_windows(split, 9, 10, seed=4).offsets != windows.offsets


def test_largest_remainders_round_up_so_the_shares_sum_to_the_count():
    split = _split({"a": 300, "b": 500, "c": 200})  # 100 slots: shares of 7 are 2.1 / 3.5 / 1.4
    assert Counter(sample_windows(split, 9, 7).files) == {"a": 2, "b": 4, "c": 1}


def test_every_slot_when_the_count_is_none_or_too_large():
    split = _split({"a": 55, "b": 50})  # 10 whole slots of 10 bytes; the last 5 bytes belong to none
    assert sample_windows(split, 9).offsets == tuple(range(0, 100, 10))
    assert sample_windows(split, 9, 1000).offsets == tuple(range(0, 100, 10))
    assert sample_windows(split, 9).files == ("a",) * 6 + ("b",) * 4
    with pytest.raises(ValueError, match="too few for one window"):
        sample_windows(split, 200)


def test_split_assignment_is_pinned_to_the_path_hash():
    """sha256(path)[:4] read little-endian, mod 20: 0 is test, 1 is dev. Pinned, so no change reshuffles the splits."""
    import hashlib

    for name in ("ast.py", "json/decoder.py", "email/parser.py", "asyncio/tasks.py", "re/_parser.py", "a", "b", "c"):
        bucket = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little") % 20
        assert split_of(name) == {0: "test", 1: "dev"}.get(bucket, "train"), name
    assert [split_of(f"doc{i:02}.txt") for i in range(60)].count("train") < 60
    # pinned by name: these would land elsewhere if the hash were read big-endian or over 5 bytes
    assert [split_of(n) for n in ("ast.py", "asyncio/log.py", "bz2.py", "asyncio/taskgroups.py")] == ["test"] * 4
    assert split_of("asyncio/exceptions.py") == "dev"


def test_a_folder_corpus_keeps_each_files_bytes_name_and_start(tmp_path):
    for i in range(60):
        (tmp_path / f"doc{i:02}.txt").write_text(f"document {i} " * 50)
    corpus = text_corpus(tmp_path)
    for split in (corpus.train, corpus.dev, corpus.test):
        assert len(split.files) == len(split.starts) > 0 and split.starts[0] == 0
        for name, start in zip(split.files, split.starts):
            content = (tmp_path / name).read_bytes() + b"\n"
            assert bytes(split.data[start : start + len(content)].tolist()) == content
        assert sum(len((tmp_path / n).read_bytes()) + 1 for n in split.files) == len(split)


def test_a_single_file_split_names_its_file(tmp_path):
    (tmp_path / "one.txt").write_bytes(b"x" * 1000)
    corpus = text_corpus(tmp_path / "one.txt")
    for split in (corpus.train, corpus.dev, corpus.test):
        assert split.files == ("one.txt",) and split.starts == (0,) and split.file_at(len(split) - 1) == "one.txt"


def test_an_empty_split_is_an_empty_byte_tensor(tmp_path):
    (tmp_path / "only.txt").write_text("one file: every split but train is empty, then split by bytes")
    corpus = text_corpus(tmp_path)
    assert corpus.fingerprint["split"].startswith("too few files")
    from posenc.lm.data import _as_tensor

    empty = _as_tensor(b"")
    assert empty.shape == (0,) and empty.dtype == torch.uint8


def test_the_stdlib_corpus_leaves_out_tests():
    from posenc.lm.data import TEST_DIRS

    stdlib = stdlib_corpus()  # not the module's fixture: each call must run the code under test
    names = stdlib.train.files + stdlib.dev.files + stdlib.test.files
    assert not [n for n in names if n.rsplit("/", 1)[-1].startswith("test_") or TEST_DIRS & set(n.split("/")[:-1])]
    assert stdlib.fingerprint["source"].startswith("python") and "json/decoder.py" in names


def test_a_single_file_corpus_fingerprint(tmp_path):
    import hashlib
    import platform

    (tmp_path / "one.txt").write_bytes(b"abc" * 100)
    assert text_corpus(tmp_path / "one.txt").fingerprint == {
        "source": str(tmp_path / "one.txt"), "files": 1, "bytes": 300,
        "sha256": hashlib.sha256(b"abc" * 100).hexdigest(), "python_version": platform.python_version(),
        "split": "single file: the first 90% of bytes train, the next 5% dev, the last 5% test"}


def test_a_folder_skips_hidden_files_reads_subfolders_and_fingerprints_itself(tmp_path):
    (tmp_path / "sub").mkdir()
    for i in range(200):
        (tmp_path / "sub" / f"doc{i:03}.txt").write_text(f"document {i} " * 20)
    (tmp_path / ".hidden").write_text("secret")
    corpus = text_corpus(tmp_path)
    names = corpus.train.files + corpus.dev.files + corpus.test.files
    assert len(names) == 200 and all(n.startswith("sub/doc") for n in names)
    f = corpus.fingerprint
    assert f["source"] == str(tmp_path) and f["files"] == 200 and f["split"].startswith("by document")
    assert f["bytes"] == len(corpus.train) + len(corpus.dev) + len(corpus.test) == sum(
        len(f"document {i} " * 20) + 1 for i in range(200))


def test_a_folder_without_dev_files_falls_back_to_bytes(tmp_path):
    """ast.py hashes to test, a.txt and b.txt to train: no dev file, so the split is by bytes."""
    for name in ("ast.py", "a.txt", "b.txt"):
        (tmp_path / name).write_text(name * 100)
    corpus = text_corpus(tmp_path)
    assert corpus.fingerprint["split"].startswith("too few files to split by file")
    total = sum(len(name * 100) + 1 for name in ("a.txt", "ast.py", "b.txt"))
    assert len(corpus.train) + len(corpus.dev) + len(corpus.test) == total and len(corpus.dev) > 0
    assert corpus.dev.files == (tmp_path.name,)


def _corpus(train: int, test: int):
    from posenc.lm.data import Corpus

    def split(n):
        return Split(torch.zeros(n, dtype=torch.uint8), ("f",), (0,))

    return Corpus(split(train), split(10), split(test), {})


def test_corpus_size_checks_sit_exactly_at_what_is_needed():
    check_corpus_size(_corpus(4 * 17, 3 * 33), train_length=16, window=32, windows=3)  # exactly enough
    with pytest.raises(ValueError, match="the train split has 67 bytes, training windows of 16 need at least 68"):
        check_corpus_size(_corpus(4 * 17 - 1, 3 * 33), train_length=16, window=32, windows=3)
    with pytest.raises(ValueError, match="the test split has 98 bytes, 3 evaluation windows of 32 bytes "
                                         r"\(plus one\) need 99; use more text or fewer --eval-windows or shorter "
                                         r"--eval-factors$"):
        check_corpus_size(_corpus(4 * 17, 3 * 33 - 1), train_length=16, window=32, windows=3)
    with pytest.raises(ValueError, match=r"need 99; use more text or a smaller --factor$"):  # extend's way out
        check_corpus_size(_corpus(4 * 17, 3 * 33 - 1), train_length=16, window=32, windows=3,
                          shorter="a smaller --factor")
    check_corpus_size(_corpus(4 * 17, 33), train_length=16, window=32)  # one window by default

