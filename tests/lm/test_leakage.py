"""What crosses a split: near-duplicate documents grouped before it, verbatim overlap measured after it."""

import pytest
import torch

from posenc.lm import leakage
from posenc.lm.data import Split, corpus_from_documents, sample_windows, split_of


def random_bytes(count: int, seed: int) -> bytes:
    return bytes(torch.randint(0, 256, (count,), generator=torch.Generator().manual_seed(seed)).tolist())


def edited(data: bytes, every: int, seed: int) -> bytes:
    """``data`` with one byte in ``every`` changed (at seeded places)."""
    out = bytearray(data)
    for place in torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[: len(data) // every]:
        out[place] ^= 0x55
    return bytes(out)


def jaccard(a: bytes, b: bytes, shingle: int = leakage.SHINGLE_BYTES) -> float:
    """The exact resemblance the sketches estimate: Jaccard similarity of the sets of ``shingle``-byte stretches."""
    sa = {a[i : i + shingle] for i in range(len(a) - shingle + 1)}
    sb = {b[i : i + shingle] for i in range(len(b) - shingle + 1)}
    return len(sa & sb) / len(sa | sb)


def test_stretch_hashes_are_equal_exactly_where_the_stretches_are():
    data = torch.tensor(list(b"abcdabcdabcxabcd"), dtype=torch.uint8)
    hashes = leakage.stretch_hashes(data, 4).tolist()
    stretches = [bytes(data[i : i + 4].tolist()) for i in range(len(data) - 3)]
    assert len(hashes) == 13
    for i in range(13):
        for j in range(13):
            assert (hashes[i] == hashes[j]) == (stretches[i] == stretches[j]), (i, j)
    for bad in (0, 3, 12):
        with pytest.raises(ValueError, match="power of two"):
            leakage.stretch_hashes(data, bad)


def test_resemblance_estimates_the_jaccard_similarity_of_the_stretches():
    """Against the exact Jaccard similarity of 32-byte stretch sets: within 3 standard errors of a 64-hash sketch."""
    base = random_bytes(6000, 0)
    for every, seed in ((400, 1), (150, 2), (60, 3)):
        other = edited(base, every, seed)
        exact = jaccard(base, other)
        estimate = leakage.resemblance(leakage.sketch(base), leakage.sketch(other))
        assert abs(estimate - exact) < 3 * (exact * (1 - exact) / leakage.SKETCH_SIZE) ** 0.5 + 0.02, (every, exact)
    assert leakage.resemblance(leakage.sketch(base), leakage.sketch(base)) == 1.0
    assert leakage.resemblance(leakage.sketch(base), leakage.sketch(random_bytes(6000, 9))) == 0.0
    assert leakage.resemblance(leakage.sketch(b"short"), leakage.sketch(base)) == 0.0  # shorter than a shingle
    assert len(leakage.sketch(base)) == leakage.SKETCH_SIZE and len(leakage.sketch(b"x" * 40)) == 1


def test_near_duplicates_chain_into_groups_named_by_their_first_member():
    """b is a (lightly edited) copy of d, e a copy of b: one group, named "b" (its first name); a and c stand alone,
    and so does f, a heavily edited copy (its resemblance to d is far below the threshold)."""
    d = random_bytes(5000, 0)
    b = edited(d, 300, 1)
    e = edited(b, 300, 2)
    f = edited(d, 12, 3)
    assert jaccard(d, f) < 0.1 < leakage.NEAR_DUPLICATE < jaccard(d, b)
    documents = [("d", d), ("a", random_bytes(5000, 4)), ("e", e), ("c", random_bytes(5000, 5)), ("b", b), ("f", f)]
    assert leakage.near_duplicate_groups(documents) == {"a": "a", "b": "b", "c": "c", "d": "b", "e": "b", "f": "f"}
    assert leakage.near_duplicate_groups([("x", b"tiny"), ("y", b"tiny")]) == {"x": "x", "y": "y"}


def test_a_corpus_sends_a_group_where_its_first_name_goes():
    """Two near-copies whose own paths fall in different splits land together, in the first name's split; the
    fingerprint counts them."""
    names = [f"doc{i:02}" for i in range(60)]
    first = next(n for n in names if split_of(n) == "test")
    second = next(n for n in names if split_of(n) == "train" and n > first)
    text = random_bytes(3000, 0)
    documents = [(n, random_bytes(3000, i + 1)) for i, n in enumerate(names) if n not in (first, second)]
    documents += [(first, text), (second, edited(text, 300, 7))]
    corpus = corpus_from_documents(documents, "synthetic")
    assert first in corpus.test.files and second in corpus.test.files
    assert corpus.fingerprint["near_duplicates"] == {"documents": 2, "groups": 1, "moved": 1}
    assert "near-duplicates (resemblance >= 0.3" in corpus.fingerprint["split"]


def test_train_overlap_finds_exactly_the_probes_that_stand_verbatim_in_train():
    """Against a brute-force search (bytes.find) on random bytes with planted copies: a probe counts only when all
    of its bytes stand in train in order; one byte changed and it is not found."""
    generator = torch.Generator().manual_seed(0)
    train = torch.randint(0, 256, (5000,), generator=generator, dtype=torch.uint8)
    test = torch.randint(0, 256, (1100,), generator=generator, dtype=torch.uint8)
    test[0:80] = train[1234:1314]  # windows of 50 + 1 bytes, probes at 0, 16, 32: window 0's three, window 1's first
    test[185:201] = train[4984:5000]  # the last 16 bytes of train: window 3's third probe
    test[255:271] = train[10:26]
    test[260] ^= 1  # window 5's first probe, one byte off: not found
    split = Split(test, ("a.py", "b.py"), (0, 510))
    windows = sample_windows(split, 50)
    overlap = leakage.train_overlap(Split(train, ("t.py",), (0,)), windows, probe=16)
    raw = bytes(train.tolist())
    expected = [[raw.find(bytes(w[s : s + 16].tolist())) >= 0 for s in range(0, 51 - 16 + 1, 16)]
                for w in windows.tokens]
    assert overlap["probes"] == len(windows.files) * 3 and overlap["probe_bytes"] == 16
    assert overlap["in_train"] == pytest.approx(sum(map(sum, expected)) / overlap["probes"])
    assert expected[:2] == [[True, True, True], [True, False, False]] and expected[3] == [False, False, True]
    assert sum(map(sum, expected)) == 5
    assert list(overlap["files"]) == ["a.py"]
    assert overlap["files"]["a.py"] == pytest.approx(sum(map(sum, expected[:10])) / 30)
    with pytest.raises(ValueError, match="power of two"):
        leakage.train_overlap(Split(train, ("t.py",), (0,)), windows, probe=12)


def test_windows_shorter_than_a_probe_are_probed_at_the_largest_power_of_two_they_hold():
    train = Split(torch.tensor(list(b"0123456789abcdef" * 4), dtype=torch.uint8), ("t",), (0,))
    test = Split(torch.tensor(list(b"456789abcdefXYZW"), dtype=torch.uint8), ("a",), (0,))
    overlap = leakage.train_overlap(train, sample_windows(test, 9))  # one window of 10 bytes: one 8-byte probe
    assert overlap["probe_bytes"] == 8 and overlap["probes"] == 1 and overlap["in_train"] == 1.0


def test_the_edges_a_mutant_moves_stay_where_they_are():
    """The boundaries mutation testing found unpinned: a 1-byte stretch is the byte itself (+1); a document of
    exactly one shingle has one hash; a window whose length fits its probes exactly has every probe counted,
    the last included; a 16-byte window is one 16-byte probe; files are listed by share, not by name."""
    data = torch.tensor([0, 7, 255], dtype=torch.uint8)
    assert leakage.stretch_hashes(data, 1).tolist() == [1, 8, 256]
    assert len(leakage.sketch(b"x" * leakage.SHINGLE_BYTES)) == 1 and len(leakage.sketch(b"x" * 31)) == 0
    train = Split(torch.tensor(list(range(64)) * 2, dtype=torch.uint8), ("t",), (0,))
    test = torch.tensor([200] * 128, dtype=torch.uint8)
    test[48:64] = torch.arange(48, 64)  # window 0 (64 bytes): only its last probe (48..63) is in train
    test[64:80] = torch.arange(0, 16)  # window 1: its first probe
    test[80:96] = torch.arange(16, 32)  # and its second
    windows = sample_windows(Split(test, ("a.py", "z.py"), (0, 64)), 63)
    overlap = leakage.train_overlap(train, windows, probe=16)
    assert overlap["probes"] == 8 and overlap["in_train"] == 3 / 8
    assert list(overlap["files"].items()) == [("z.py", 0.5), ("a.py", 0.25)]
    short = leakage.train_overlap(train, sample_windows(Split(test[48:64], ("s",), (0,)), 15))
    assert short["probe_bytes"] == 16 and short["probes"] == 1 and short["in_train"] == 1.0


def test_a_stretch_hash_is_the_documented_polynomial_wrapping_modulo_two_to_the_64():
    data = torch.tensor(list(random_bytes(40, seed=3)), dtype=torch.uint8)
    for length in (1, 2, 8, 32):
        want = []
        for start in range(len(data) - length + 1):
            value = 0
            for byte in data[start : start + length].tolist():
                value = (value * leakage._HASH_BASE + byte + 1) % 2**64
            want.append(value - 2**64 if value >= 2**63 else value)  # as a signed int64
        assert leakage.stretch_hashes(data, length).tolist() == want, length
    assert leakage.sketch(b"shorter than a shingle").dtype == torch.int64


def test_a_pair_goes_together_only_when_its_resemblance_reaches_the_threshold(monkeypatch):
    """Sketches set by hand: the shared-hash count only filters; the resemblance decides, at the threshold itself."""
    made = {"a": torch.arange(1, 45).tolist() + list(range(100, 120)),  # 20 shared hashes, all above
            "b": torch.arange(45, 89).tolist() + list(range(100, 120)),  # 88 others: the union's bottom 64 share none
            "c": [1, 2], "d": [1, 2, 3, 4]}  # resemblance exactly 0.5, and 2 shared of the larger 4
    monkeypatch.setattr(leakage, "sketch", lambda data: torch.tensor(made[data.decode()], dtype=torch.int64))
    groups = leakage.near_duplicate_groups([(name, name.encode()) for name in made], threshold=0.5)
    assert groups == {"a": "a", "b": "b", "c": "c", "d": "c"}
    assert leakage.near_duplicate_groups([("a", b"a"), ("b", b"b")], threshold=0.3) == {"a": "a", "b": "b"}


def test_a_window_one_short_of_a_power_of_two_takes_the_power_below_and_no_probe_past_its_end():
    train = Split(torch.tensor(list(random_bytes(300, seed=4)), dtype=torch.uint8), ("t",), (0,))
    test = Split(torch.cat([train.data[:63], torch.tensor(list(random_bytes(63, seed=5)), dtype=torch.uint8)]),
                 ("a", "b"), (0, 63))
    for length, probe, share in ((62, 32, 1.0), (30, 16, 2 / 3)):  # 63 and 31 tokens: one probe from each start
        overlap = leakage.train_overlap(train, sample_windows(test, length))
        assert overlap["probe_bytes"] == probe and overlap["probes"] == len(sample_windows(test, length).files)
        assert overlap["files"] == {"a": pytest.approx(share)}  # (a's third 31-token window starts at its last byte)


def test_a_probe_equal_to_trains_largest_stretch_is_found_and_one_above_every_stretch_is_not():
    train_bytes = random_bytes(17, seed=6)  # two 16-byte stretches
    hashes = leakage.stretch_hashes(torch.tensor(list(train_bytes), dtype=torch.uint8), 16).tolist()
    largest = train_bytes[hashes.index(max(hashes)) :][:16]
    above = next(candidate for seed in range(100) for candidate in [random_bytes(16, seed=100 + seed)]
                 if leakage.stretch_hashes(torch.tensor(list(candidate), dtype=torch.uint8), 16).item() > max(hashes))
    train = Split(torch.tensor(list(train_bytes), dtype=torch.uint8), ("t",), (0,))
    test = Split(torch.tensor(list(largest + above + b"."), dtype=torch.uint8), ("a",), (0,))
    overlap = leakage.train_overlap(train, sample_windows(test, 32), probe=16)  # one window: two probes
    assert overlap["probes"] == 2 and overlap["in_train"] == 0.5


@pytest.mark.parametrize("a, b, size, bottom_k", [
    (range(0, 64), range(32, 96), leakage.SKETCH_SIZE, 32 / 64),  # bottom 64 of 0..95 is a: 32 shared / 64
    ([1, 2, 7, 8], [3, 4, 7, 8], 4, 0.0),  # bottom 4 = 1, 2, 3, 4: the shared 7 and 8 lie above it
    ([1, 3, 4, 9], [1, 2, 4, 8], 4, 2 / 4),  # bottom 4 = 1, 2, 3, 4: 1 and 4 in both
    ([-5, 0, 7], [-5, 3, 7], 3, 1 / 3),  # signed hashes: bottom 3 = -5, 0, 3
    ([2, 5, 6], [3, 5, 6], 2, 0.0)])  # size below the sketches': bottom 2 = 2, 3
def test_resemblance_reads_only_the_bottom_k_of_the_union(a, b, size, bottom_k):
    """Pins the wrong version that scores the whole union of the two sketches (|A ∩ B| / |A ∪ B| of the sketches,
    1/3, 1/3, 1/3, 1/2 and 1/2 here) instead of its ``size`` smallest hashes (Broder 1997): the bottom-k of the
    union is a uniform sample of the documents' union, the whole union of two bottom-k sketches is not. Each
    expected value is counted by hand in its comment."""
    a, b = torch.tensor(list(a), dtype=torch.int64), torch.tensor(list(b), dtype=torch.int64)
    assert leakage.resemblance(a, b, size=size) == pytest.approx(bottom_k, abs=1e-12)
    assert leakage.resemblance(b, a, size=size) == pytest.approx(bottom_k, abs=1e-12)


def test_resemblance_is_unbiased_at_a_resemblance_of_three_tenths():
    """Pins the same wrong version statistically: over 1,000 seeded pairs of random documents whose 32-byte stretch
    sets have Jaccard similarity exactly 0.3 (a shared 331-byte part S, then 350 bytes of each's own: 300 shared
    stretches of 1,000), the mean bottom-k estimate lies within 3 standard errors (0.0054) of 0.3. The whole union
    of the sketches under-counts the shared share (mean 0.285 here), 8 standard errors off."""
    generator, estimates = torch.Generator().manual_seed(0), []
    for _ in range(1000):
        data = bytes(torch.randint(0, 256, (331 + 2 * 350,), generator=generator).tolist())
        shared, own_a, own_b = data[:331], data[331:681], data[681:]
        estimates.append(leakage.resemblance(leakage.sketch(shared + own_a), leakage.sketch(shared + own_b)))
    assert jaccard(shared + own_a, shared + own_b) == pytest.approx(0.3)  # (331 − 31) / (331 + 700 − 31)
    standard_error = (0.3 * 0.7 / leakage.SKETCH_SIZE / len(estimates)) ** 0.5
    assert abs(sum(estimates) / len(estimates) - 0.3) < 3 * standard_error
