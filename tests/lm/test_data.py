import pytest
import torch

from posenc.lm.data import check_corpus_size, stdlib_corpus, text_corpus, train_batch
from posenc.lm.evaluate import sliding_windows


@pytest.fixture(scope="module")
def stdlib():
    return stdlib_corpus()


def test_stdlib_corpus_is_split_by_file_and_fingerprinted(stdlib):
    f = stdlib.fingerprint
    assert f["files"] > 300 and len(stdlib.train) > 5_000_000 and len(stdlib.validation) > 100_000
    assert len(f["sha256"]) == 64 and f["python_version"]
    # Same bytes every time: the fingerprint is reproducible.
    assert stdlib_corpus().fingerprint["sha256"] == f["sha256"]


def test_validation_files_never_appear_in_training(stdlib):
    probe = bytes(stdlib.validation[1000:1200].tolist())
    assert probe not in bytes(stdlib.train.tolist())


def test_text_corpus_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="no such file or folder"):
        text_corpus(tmp_path / "missing.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no files"):
        text_corpus(tmp_path / "empty")
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("hello world")
    with pytest.raises(ValueError, match="corpus too small: the train split has 9 bytes"):
        check_corpus_size(text_corpus(tiny), train_length=64, eval_span=512)


def test_folder_corpus_splits_by_file(tmp_path):
    for i in range(60):
        (tmp_path / f"doc{i:02}.txt").write_text(f"document {i} " * 50)
    corpus = text_corpus(tmp_path)
    assert corpus.fingerprint["files"] == 60
    assert 0 < len(corpus.validation) < len(corpus.train)
    assert corpus.fingerprint["split"].startswith("by file")


def test_train_batches_are_reproducible_next_byte_pairs(stdlib):
    x1, y1 = train_batch(stdlib.train, 32, 4, torch.Generator().manual_seed(3))
    x2, y2 = train_batch(stdlib.train, 32, 4, torch.Generator().manual_seed(3))
    assert torch.equal(x1, x2) and torch.equal(y1[:, :-1], x1[:, 1:])


@pytest.mark.parametrize("length, stride", [(8, 2), (8, 8), (5, 3), (16, 1)])
def test_sliding_windows_score_every_token_once(length, stride):
    tokens = 40
    seen = []
    for start, first in sliding_windows(tokens, length, stride):
        assert 0 <= start and start + length <= tokens
        seen += list(range(start + first, start + length))
    assert seen == list(range(tokens))
