"""What crosses a split by document: near-duplicate documents, kept together before the split, and the text that
still stands verbatim in train after it.

Generated files of the standard library (the codec tables in ``encodings/``, say) are near-copies of one another; split
one by one, a test file's table is learned from its sibling in train. ``near_duplicate_groups`` finds them: each
document's bytes are cut into every ``SHINGLE_BYTES``-byte stretch, hashed, and kept as a bottom-k sketch (the
``SKETCH_SIZE`` smallest distinct hashes, Broder 1997); two documents whose sketches estimate a resemblance
(Jaccard similarity of their stretches) of at least ``NEAR_DUPLICATE`` are one group, and groups chain (union-find).
``data.corpus_from_documents`` then sends a whole group where its alphabetically first name's hash sends it.

``train_overlap`` measures what is left: the share of ``PROBE_BYTES``-byte probes of the scored windows found
verbatim among every stretch of train (licence headers and shared idioms remain, and are meant to).

Hashes are polynomial over bytes, wrapping modulo 2**64 (torch int64 arithmetic), then mixed (SplitMix64's
finalizer) where their order matters.
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from .data import Split, Windows

SHINGLE_BYTES = 32
SKETCH_SIZE = 64
NEAR_DUPLICATE = 0.3  # estimated resemblance at which two documents go to the same split (unrelated files: < 0.1)
PROBE_BYTES = 64  # a probe of train_overlap: this many consecutive bytes of an evaluation window
_HASH_BASE = 0x100000001B3  # odd


def stretch_hashes(data: Tensor, length: int) -> Tensor:
    """The hash of every ``length``-byte stretch of ``data`` (N,) uint8: (N − length + 1,) int64, built by doubling
    (the hash of 2m bytes from two of m), so a power-of-two ``length`` costs log2(length) passes over the data."""
    if length <= 0 or length & (length - 1):
        raise ValueError(f"stretch length must be a power of two, got {length}")
    hashes, span, power = data.to(torch.int64) + 1, 1, torch.tensor(_HASH_BASE, dtype=torch.int64)
    while span < length:
        hashes = hashes[:-span] * power + hashes[span:]  # int64 products wrap modulo 2**64
        span, power = 2 * span, power * power
    return hashes


def _mix(x: Tensor) -> Tensor:
    """SplitMix64's finalizer on int64 (torch's ``>>`` on int64 copies the sign bit; the mask clears those copies,
    which makes it the finalizer's logical shift)."""
    for shift, multiplier in ((30, -4658895280553007687), (27, -7723592293110705685), (31, None)):
        x = x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))
        if multiplier is not None:
            x = x * multiplier
    return x


def sketch(data: bytes, size: int = SKETCH_SIZE, shingle: int = SHINGLE_BYTES) -> Tensor:
    """The ``size`` smallest distinct mixed hashes of the document's ``shingle``-byte stretches, sorted: (≤ size,)
    int64 (fewer for a document of fewer distinct stretches; none for one shorter than a shingle)."""
    if len(data) < shingle:
        return torch.zeros(0, dtype=torch.int64)
    hashes = torch.unique(_mix(stretch_hashes(torch.frombuffer(bytearray(data), dtype=torch.uint8), shingle)))
    return hashes[:size]  # torch.unique sorts


def resemblance(a: Tensor, b: Tensor, size: int = SKETCH_SIZE) -> float:
    """Estimated Jaccard similarity of two documents from their sketches: of the ``size`` smallest hashes of the
    union, the share that both sketches hold (0 where either is empty)."""
    if not len(a) or not len(b):
        return 0.0
    union = torch.unique(torch.cat((a, b)))[:size]
    both = torch.isin(union, a) & torch.isin(union, b)
    return both.double().mean().item()


def near_duplicate_groups(documents: list[tuple[str, bytes]], threshold: float = NEAR_DUPLICATE) -> dict[str, str]:
    """{name: the alphabetically first name of its group} for every document: groups chain every pair whose
    ``resemblance`` is at least ``threshold``; a document like no other is its own group. Only pairs whose sketches
    share enough hashes to reach the threshold are compared, so the cost follows the near-duplicates, not the
    square of the documents."""
    sketches = {name: sketch(data) for name, data in documents}
    holders: dict[int, list[str]] = {}
    for name, hashes in sketches.items():
        for value in hashes.tolist():
            holders.setdefault(value, []).append(name)
    shared = Counter(pair for names in holders.values() for pair in combinations(names, 2))
    parent = {name: name for name in sketches}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    for (a, b), count in shared.items():  # the union's bottom-k holds at least the larger sketch's size
        if count >= threshold * max(len(sketches[a]), len(sketches[b])) and \
                resemblance(sketches[a], sketches[b]) >= threshold:
            first, second = sorted((root(a), root(b)))
            parent[second] = first  # a root is its group's smallest name: roots only ever point to smaller ones
    return {name: root(name) for name in sketches}


def train_overlap(train: Split, windows: Windows, probe: int = PROBE_BYTES) -> dict:
    """How much of the evaluation text also stands verbatim in the train split: every window cut into
    ``probe``-byte probes (from its start, whole probes only; windows shorter than a probe are one probe of the
    largest power of two they hold), each looked up among every stretch of train of that length by its 64-bit hash.
    Returns {"probe_bytes", "probes", "in_train" (the share found), "files": {file: share} for the windows' files
    with any found, highest first}."""
    probe = min(probe, 1 << ((windows.length + 1).bit_length() - 1))
    stretches = torch.sort(stretch_hashes(train.data, probe)).values
    starts = torch.arange(0, windows.length + 1 - probe + 1, probe)  # (P,) probe starts inside a window
    probes = windows.tokens[:, starts[:, None] + torch.arange(probe)]  # (N, P, probe)
    hashes = stretch_hashes(probes.reshape(-1).to(torch.uint8), probe)[::probe].contiguous()  # one per probe
    place = torch.searchsorted(stretches, hashes).clamp(max=len(stretches) - 1)
    found = (stretches[place] == hashes).view(len(windows.files), -1).double()  # (N, P)
    per_file: dict[str, list[float]] = {}
    for name, share in zip(windows.files, found.mean(1).tolist()):
        per_file.setdefault(name, []).append(share)
    files = {name: sum(s) / len(s) for name, s in per_file.items() if any(s)}
    return {"probe_bytes": probe, "probes": found.numel(), "in_train": found.mean().item(),
            "files": dict(sorted(files.items(), key=lambda item: -item[1]))}
