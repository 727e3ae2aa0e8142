"""Corpora and windows: the embedded default corpus, the user's text, train windows and evaluation windows.

The default corpus needs no download: the Python standard library source of the
running interpreter (tests excluded), read in sorted path order and split into
train / dev / test *by file* (a hash of each file's path; near-duplicate files together, by their
group's first path: ``leakage``), so no dev or test file, nor a near-copy of one, is ever seen in
training. Anything *chosen* (a learning rate, searched factors) is chosen on dev; every reported
number is measured on test. Every corpus carries a fingerprint (sha256 of its bytes, file count,
Python version, how many documents were grouped as near-duplicates).

Evaluation reads ``Windows``: non-overlapping stretches of one split, a seeded sample
stratified over its files, each labelled with the file it starts in (the unit a bootstrap
resamples), so every row of a table scores the same bytes.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import os
import platform
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .leakage import NEAR_DUPLICATE, SHINGLE_BYTES, near_duplicate_groups

TEST_DIRS = {"test", "tests", "idle_test", "__pycache__", "site-packages", "dist-packages"}
SPLIT_EVERY = 20  # by a hash of its path, one file in 20 goes to test and one in 20 to dev
WINDOW_SEED = 0  # the evaluation windows' sample: fixed, so runs with other model seeds score the same bytes


@dataclass(frozen=True)
class Split:
    """One split: its files' bytes concatenated (each followed by a newline), and where each file starts."""

    data: Tensor  # (N,) uint8
    files: tuple[str, ...] = ()  # relative paths, in order
    starts: tuple[int, ...] = ()  # offset of each file in data

    def __len__(self) -> int:
        return len(self.data)

    def file_at(self, offset: int) -> str:
        """The file holding byte ``offset`` of ``data``."""
        return self.files[bisect.bisect_right(self.starts, offset) - 1]


@dataclass
class Corpus:
    train: Split
    dev: Split
    test: Split
    fingerprint: dict

    def describe(self) -> str:
        f = self.fingerprint
        return (f"{f['source']}: {f['files']} files, {len(self.train):,} train / {len(self.dev):,} dev / "
                f"{len(self.test):,} test bytes ({len(self.dev.files)} dev, {len(self.test.files)} test files), "
                f"sha256 {f['sha256'][:12]}")


def split_of(relative_path: str, every: int = SPLIT_EVERY, test: int = 1, dev: int = 1) -> str:
    """'train', 'dev' or 'test' for a file, by a hash of its path (stable across machines and runs): of ``every``
    hash buckets, the first ``test`` go to test and the next ``dev`` to dev."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    bucket = int.from_bytes(digest[:4], "little") % every
    return "test" if bucket < test else "dev" if bucket < test + dev else "train"


class _SplitBuilder:
    def __init__(self):
        self.data, self.files, self.starts = bytearray(), [], []

    def add(self, name: str, data: bytes) -> None:
        self.files.append(name)
        self.starts.append(len(self.data))
        self.data.extend(data + b"\n")

    def build(self) -> Split:
        return Split(_as_tensor(self.data), tuple(self.files), tuple(self.starts))


def corpus_from_documents(documents, source: str, *, every: int = SPLIT_EVERY, test: int = 1, dev: int = 1
                          ) -> Corpus:
    """A corpus from ``(name, bytes)`` documents in order, each sent whole to one split by a hash of its name
    (``split_of``), near-duplicates together (``leakage.near_duplicate_groups``: by the hash of their group's first
    name); the fingerprint hashes every document's bytes in order and counts the documents grouped."""
    documents = list(documents)
    groups = near_duplicate_groups(documents)
    splits, hasher = {name: _SplitBuilder() for name in ("train", "dev", "test")}, hashlib.sha256()
    for name, data in documents:
        hasher.update(data)
        splits[split_of(groups[name], every, test, dev)].add(name, data)
    sizes = Counter(groups.values())
    grouped = [name for name, first in groups.items() if sizes[first] > 1]
    fingerprint = {
        "source": source,
        "files": len(documents),
        "bytes": sum(len(b.data) for b in splits.values()),
        "sha256": hasher.hexdigest(),
        "python_version": platform.python_version(),
        "split": f"by document: sha256(name) % {every} < {test} is test, < {test + dev} is dev, the rest train; "
                 f"near-duplicates (resemblance >= {NEAR_DUPLICATE} of their {SHINGLE_BYTES}-byte stretches) go "
                 "together, by their group's first name",
        "near_duplicates": {"documents": len(grouped), "groups": len({groups[name] for name in grouped}),
                            "moved": sum(split_of(n, every, test, dev) != split_of(groups[n], every, test, dev)
                                         for n in grouped)},
    }
    return Corpus(splits["train"].build(), splits["dev"].build(), splits["test"].build(), fingerprint)


def _documents(root: Path, files: list[Path]) -> list[tuple[str, bytes]]:
    return [(path.relative_to(root).as_posix(), path.read_bytes()) for path in files]


def _split_by_bytes(name: str, data: bytes | bytearray) -> tuple[Split, Split, Split]:
    """One text that cannot be split by file: the first 90% of bytes train, then 5% dev, the last 5% test."""
    dev_start, test_start = len(data) * 90 // 100, len(data) * 95 // 100
    parts = (data[:dev_start], data[dev_start:test_start], data[test_start:])
    return tuple(Split(_as_tensor(part), (name,), (0,)) for part in parts)


def _as_tensor(data: bytes | bytearray) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def stdlib_documents() -> list[tuple[str, bytes]]:
    """The running interpreter's standard library ``.py`` files, tests excluded: [(relative path, bytes)], sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        path for path in root.rglob("*.py")
        if not TEST_DIRS.intersection(path.relative_to(root).parts[:-1]) and not path.name.startswith("test_")
    )
    return _documents(root, files)


def stdlib_corpus() -> Corpus:
    """The running interpreter's standard library ``.py`` files, tests excluded."""
    return corpus_from_documents(stdlib_documents(), f"python{platform.python_version()} stdlib")


def text_corpus(path: str | os.PathLike) -> Corpus:
    """A text file, or a folder of files (read recursively, sorted).

    A folder is split by file; a single file by bytes (90% train, 5% dev, 5% test),
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
        fingerprint = {"source": str(root), "files": 1, "bytes": len(data),
                       "sha256": hashlib.sha256(data).hexdigest(), "python_version": platform.python_version(),
                       "split": "single file: the first 90% of bytes train, the next 5% dev, the last 5% test"}
        return Corpus(*_split_by_bytes(root.name, data), fingerprint)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files:
        raise ValueError(f"--text {root}: the folder holds no files")
    unreadable = [p for p in files if not os.access(p, os.R_OK)]
    if unreadable:
        raise ValueError(f"--text {root}: cannot read {unreadable[0]}")
    corpus = corpus_from_documents(_documents(root, files), str(root))
    if not (len(corpus.train) and len(corpus.dev) and len(corpus.test)):
        # Too few files for a by-file split: fall back to bytes, and say so.
        data = bytearray().join(path.read_bytes() + b"\n" for path in files)
        corpus = Corpus(*_split_by_bytes(root.name, data),
                        {**corpus.fingerprint, "split": "too few files to split by file: the first 90% of bytes "
                                                        "train, the next 5% dev, the last 5% test"})
    return corpus


#: what a run can change when the test split is too small for its evaluation windows (extrapolate's flags)
SHORTER_WINDOWS = "fewer --eval-windows or shorter --eval-factors"


def load_corpus(text: str | os.PathLike | None, *, train_length: int, window: int, windows: int = 1,
                shorter: str = SHORTER_WINDOWS) -> Corpus:
    """``text`` (a file or folder) or, when None, the embedded stdlib corpus; checked for the windows it must supply
    (``shorter``: the command's way to need fewer or shorter ones, named where they do not fit)."""
    corpus = text_corpus(text) if text else stdlib_corpus()
    check_corpus_size(corpus, train_length=train_length, window=window, windows=windows, shorter=shorter)
    return corpus


def check_corpus_size(corpus: Corpus, *, train_length: int, window: int, windows: int = 1,
                      shorter: str = SHORTER_WINDOWS) -> None:
    """Raise before training when the corpus cannot supply training windows and ``windows`` test windows."""
    need_train = 4 * (train_length + 1)
    if len(corpus.train) < need_train:
        raise ValueError(
            f"corpus too small: the train split has {len(corpus.train):,} bytes, training windows of "
            f"{train_length} need at least {need_train:,}; use more text or a smaller --train-length"
        )
    if len(corpus.test) // (window + 1) < windows:
        raise ValueError(
            f"corpus too small: the test split has {len(corpus.test):,} bytes, {windows} evaluation windows of "
            f"{window} bytes (plus one) need {windows * (window + 1):,}; use more text or {shorter}"
        )


def train_batch(data: Tensor, length: int, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random windows of ``length`` + 1 bytes: inputs (B, T) and next-byte targets (B, T), int64."""
    starts = torch.randint(0, len(data) - length - 1, (batch,), generator=generator)
    windows = torch.stack([data[s : s + length + 1] for s in starts.tolist()]).long()  # (B, T+1)
    return windows[:, :-1], windows[:, 1:]


@dataclass(frozen=True)
class Windows:
    """Non-overlapping stretches of one split, ``length`` + 1 bytes each: inputs and their next-byte targets."""

    tokens: Tensor  # (N, length + 1) int64
    files: tuple[str, ...]  # the file each window starts in: the unit a bootstrap resamples
    offsets: tuple[int, ...]  # where each window starts in the split's data

    @property
    def length(self) -> int:
        return self.tokens.shape[1] - 1


def sample_windows(split: Split, length: int, count: int | None = None, *, seed: int = WINDOW_SEED) -> Windows:
    """``count`` windows of ``length`` + 1 bytes of ``split`` (every one when ``count`` is None or too large).

    The split is cut into consecutive slots of ``length`` + 1 bytes (no byte in two slots); each slot belongs to
    the file it starts in. The sample is stratified over files: each file gets a share of ``count`` proportional
    to its slots (largest remainders round up, so the shares sum to ``count``), drawn without replacement with a
    seeded generator, and the windows come back in split order. Raises ValueError when no window fits.
    """
    slot = length + 1
    slots = len(split) // slot
    if slots == 0:
        raise ValueError(f"the split has {len(split):,} bytes: too few for one window of {length} (+1)")
    owners = [split.file_at(i * slot) for i in range(slots)]
    if count is None or count >= slots:
        chosen = list(range(slots))
    else:
        by_file: dict[str, list[int]] = {}
        for index, owner in enumerate(owners):
            by_file.setdefault(owner, []).append(index)
        groups = list(by_file.values())
        exact = [count * len(group) / slots for group in groups]
        quotas = [math.floor(q) for q in exact]
        by_remainder = sorted(range(len(groups)), key=lambda g: quotas[g] - exact[g])  # largest remainder first
        for g in by_remainder[: count - sum(quotas)]:
            quotas[g] += 1
        generator = torch.Generator().manual_seed(seed)
        chosen = sorted(group[i] for group, quota in zip(groups, quotas)
                        for i in torch.randperm(len(group), generator=generator)[:quota].tolist())
    tokens = torch.stack([split.data[i * slot : (i + 1) * slot] for i in chosen]).long()
    return Windows(tokens, tuple(owners[i] for i in chosen), tuple(i * slot for i in chosen))

