"""How ``pretrained`` splits its measurements between processes: every rank walks the same keys and takes every
world_size-th; a filed measurement is read back, not made again. The calibration of the keys' wording splits its dev
documents so too (two threads stand in for torchrun's processes)."""

import threading
from types import SimpleNamespace

import torch

from posenc.experiments.pretrained import keys
from posenc.experiments.pretrained.share import Share


def test_ranks_take_alternate_measurements_and_file_each_once(tmp_path):
    made = []

    def measure(name: str):
        return lambda: made.append(name) or {"name": name}

    shares = [Share(rank, 3) for rank in range(3)]
    taken = {rank: [] for rank in range(3)}
    for k in range(7):
        for rank, share in enumerate(shares):
            got = share.measured(tmp_path / f"m{k}.json", measure(f"m{k} by {rank}"))
            if got is not None:
                taken[rank].append(got["name"])
    assert taken == {0: ["m0 by 0", "m3 by 0", "m6 by 0"], 1: ["m1 by 1", "m4 by 1"], 2: ["m2 by 2", "m5 by 2"]}
    assert [s.seen for s in shares] == [7, 7, 7] and [s.made for s in shares] == [3, 2, 2]

    alone = Share()  # one process, after the others: reads every file back and makes none
    assert [alone.measured(tmp_path / f"m{k}.json", measure("again"))["name"] for k in range(7)] == [
        "m0 by 0", "m1 by 1", "m2 by 2", "m3 by 0", "m4 by 1", "m5 by 2", "m6 by 0"]
    assert (alone.seen, alone.made) == (7, 0) and len(made) == 7


def test_calibration_in_two_processes_asks_each_dev_document_once(tmp_path, monkeypatch):
    """"made-up" finds the keys of the first three documents (3 of 5, under the bar), so "remember" (4 of 5: the bar,
    0.8, reached) is asked next, and calibration stops there: each (document, wording) asked once in all, each rank
    its own share."""
    asked = []
    monkeypatch.setattr(keys, "use_attention", lambda model, implementation: None)
    monkeypatch.setattr(keys, "haystack", lambda tokens, ids, length, config, index, wording: (index, wording))

    def retrieve(model, planted, encode, decode):
        index, wording = planted
        asked.append((threading.current_thread().name, index, wording))
        return [{"correct": index < {"made-up": 3, "remember": 4}[wording], "band": 0, "log_prob": -1.0 - index}]

    monkeypatch.setattr(keys.retrieval, "retrieve", retrieve)
    barrier, calibrations = threading.Barrier(2, timeout=30), {}

    def rank(r: int):
        runtime = SimpleNamespace(rank=r, world_size=2, barrier=barrier.wait)
        dev = [{"ids": torch.arange(64)} for _ in range(5)]
        calibrations[r] = keys.calibrate(None, SimpleNamespace(encode=None, decode=None), dev,
                                         ["made-up", "remember", "secret-word"], SimpleNamespace(bands=1), 32,
                                         tmp_path, runtime)

    threads = [threading.Thread(target=rank, args=(r,), name=f"rank{r}") for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(asked) == sorted((f"rank{i % 2}", i, w) for w in ("made-up", "remember") for i in range(5))
    assert calibrations[0] == calibrations[1]
    assert [(w, c["accuracy"], c["log_prob"]) for w, c in calibrations[0].items()] == [
        ("made-up", 0.6, -3.0), ("remember", 0.8, -3.0)]
