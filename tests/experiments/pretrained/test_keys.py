"""The keys ``pretrained`` plants and asks: each document's haystack carries the run's wording and retrieval tasks,
and the calibration of the wording splits its dev documents between processes (two threads stand in for torchrun's)."""

import threading
from types import SimpleNamespace

import torch

from posenc.experiments.pretrained import keys
from posenc.experiments.pretrained.config import PretrainedConfig
from posenc.experiments.pretrained.measure import ByteTokens


def test_a_documents_haystack_has_the_runs_wording_tasks_and_seed():
    tokens = ByteTokens()
    ids = torch.tensor(tokens.encode("In the beginning was the word. " * 60))
    config = PretrainedConfig.from_preset("smoke", retrieval_tasks="multi-value", task_questions=1, task_size=3)
    planted = keys.haystack(tokens, ids, 1500, config, 2, "remember")
    assert len(planted.ids) == 1500 and planted.format == "remember"
    assert len(planted.needles) == config.bands * config.keys_per_band
    (question,) = planted.questions
    assert question.task == "multi-value" and len(question.answers) == 3
    again = keys.haystack(tokens, ids, 1500, config, 2, "remember")
    other = keys.haystack(tokens, ids, 1500, config, 3, "remember")
    assert again.ids == planted.ids and other.ids != planted.ids  # seeded by the document's index
    later_seed = keys.haystack(tokens, ids, 1500, PretrainedConfig.from_preset(
        "smoke", seed=config.seed + 1, retrieval_tasks="multi-value", task_questions=1, task_size=3), 2, "remember")
    assert later_seed.ids != planted.ids


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
