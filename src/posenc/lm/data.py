"""Corpora and windows: the embedded default corpus, the user's text, train and eval windows.

The default corpus needs no download: the Python standard library source of the
running interpreter (tests excluded), read in sorted path order and split into
train / validation *by file*, so no validation file is ever seen in training.
Every corpus carries a fingerprint (sha256 of its bytes, file count, Python version).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

TEST_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}
VALIDATION_EVERY = 20  # one file in 20 (by a hash of its path) goes to validation


@dataclass
class Corpus:
    train: Tensor  # (N_train,) uint8 bytes
    validation: Tensor  # (N_val,) uint8 bytes
    fingerprint: dict

    def describe(self) -> str:
        f = self.fingerprint
        return (f"{f['source']}: {f['files']} files, {len(self.train):,} train / {len(self.validation):,} "
                f"validation bytes, sha256 {f['sha256'][:12]}")


def _is_validation(relative_path: str) -> bool:
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "little") % VALIDATION_EVERY == 0


def _corpus_from_files(root: Path, files: list[Path], source: str) -> Corpus:
    train, validation, hasher = bytearray(), bytearray(), hashlib.sha256()
    for path in files:
        data = path.read_bytes()
        hasher.update(data)
        relative = path.relative_to(root).as_posix() if path != root else path.name
        (validation if _is_validation(relative) else train).extend(data + b"\n")
    fingerprint = {
        "source": source,
        "files": len(files),
        "bytes": len(train) + len(validation),
        "sha256": hasher.hexdigest(),
        "python_version": platform.python_version(),
        "split": f"by file: sha256(path) % {VALIDATION_EVERY} == 0 is validation",
    }
    return Corpus(_as_tensor(train), _as_tensor(validation), fingerprint)


def _as_tensor(data: bytes | bytearray) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def stdlib_corpus() -> Corpus:
    """The running interpreter's standard library ``.py`` files, tests excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        path for path in root.rglob("*.py")
        if not TEST_DIRS.intersection(path.relative_to(root).parts[:-1]) and not path.name.startswith("test_")
    )
    return _corpus_from_files(root, files, f"python{platform.python_version()} stdlib")


def text_corpus(path: str | os.PathLike) -> Corpus:
    """A text file, or a folder of files (read recursively, sorted).

    A folder is split by file; a single file by bytes (its last 10% is validation),
    since one file cannot be split by file.
    """
    root = Path(path)
    if not root.exists():
        raise ValueError(f"--text {root}: no such file or folder")
    if root.is_file():
        try:
            data = root.read_bytes()
        except OSError as error:
            raise ValueError(f"--text {root}: cannot read it ({error.strerror})") from None
        cut = len(data) * 9 // 10
        fingerprint = {"source": str(root), "files": 1, "bytes": len(data),
                       "sha256": hashlib.sha256(data).hexdigest(), "python_version": platform.python_version(),
                       "split": "single file: last 10% of bytes is validation"}
        return Corpus(_as_tensor(data[:cut]), _as_tensor(data[cut:]), fingerprint)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ValueError(f"--text {root}: the folder holds no files")
    unreadable = [p for p in files if not os.access(p, os.R_OK)]
    if unreadable:
        raise ValueError(f"--text {root}: cannot read {unreadable[0]}")
    corpus = _corpus_from_files(root, files, str(root))
    if len(corpus.validation) == 0 or len(corpus.train) == 0:
        # Too few files for a by-file split: fall back to bytes, and say so.
        data = torch.cat((corpus.train, corpus.validation))
        cut = len(data) * 9 // 10
        corpus = Corpus(data[:cut].clone(), data[cut:].clone(),
                        {**corpus.fingerprint, "split": "too few files to split by file: last 10% of bytes"})
    return corpus


def load_corpus(text: str | os.PathLike | None, *, train_length: int, eval_span: int) -> Corpus:
    """``text`` (a file or folder) or, when None, the embedded stdlib corpus; checked for the windows it must supply."""
    corpus = text_corpus(text) if text else stdlib_corpus()
    check_corpus_size(corpus, train_length=train_length, eval_span=eval_span)
    return corpus


def check_corpus_size(corpus: Corpus, *, train_length: int, eval_span: int) -> None:
    """Raise before training when the corpus cannot supply the requested windows."""
    need_train = 4 * (train_length + 1)
    if len(corpus.train) < need_train:
        raise ValueError(
            f"corpus too small: the train split has {len(corpus.train):,} bytes, training windows of "
            f"{train_length} need at least {need_train:,}; use more text or a smaller --train-length"
        )
    if len(corpus.validation) < eval_span + 1:
        raise ValueError(
            f"corpus too small: the validation split has {len(corpus.validation):,} bytes, evaluation needs "
            f"{eval_span + 1:,} (longest eval length × --eval-windows, plus one); use more text, fewer "
            f"--eval-windows or shorter --eval-factors"
        )


def train_batch(data: Tensor, length: int, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random windows of ``length`` + 1 bytes: inputs (B, T) and next-byte targets (B, T), int64."""
    starts = torch.randint(0, len(data) - length - 1, (batch,), generator=generator)
    windows = torch.stack([data[s : s + length + 1] for s in starts.tolist()]).long()  # (B, T+1)
    return windows[:, :-1], windows[:, 1:]


def eval_span(validation: Tensor, span: int) -> Tensor:
    """The first ``span`` + 1 validation bytes: the text every eval length and encoding scores."""
    return validation[: span + 1].long()
