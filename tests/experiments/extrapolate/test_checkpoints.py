"""``posenc plot --ckpt RUN`` reads a finished extrapolate run: each finished model of the run's seed with its saved
weights, in eval mode, and nothing else in the folder; and the first training window of the run's test text."""

import re

import pytest
import torch

from posenc import storage
from posenc.experiments.extrapolate import ExperimentConfig
from posenc.experiments.extrapolate.checkpoints import attention_window, trained_models
from posenc.experiments.extrapolate.rows import all_rows
from posenc.lm.data import stdlib_corpus, text_corpus
from posenc.lm.model import LanguageModel


def _save(run, config, folder: str, encoding: str, fill: float) -> dict:
    model = LanguageModel(config.model_config(all_rows()[encoding], {}))
    weights = {name: torch.full_like(tensor, fill) for name, tensor in model.state_dict().items()}
    storage.save_weights(run / "checkpoints" / folder / "model.safetensors", weights)
    return weights


def test_only_the_run_seeds_finished_models_are_read_with_their_weights(tmp_path):
    config = ExperimentConfig.from_preset("smoke", seed=3)
    storage.write_json(tmp_path / "config.json", config.to_dict())
    rope = _save(tmp_path, config, "rope-seed3", "rope", 0.25)
    _save(tmp_path, config, "alibi-seed4", "alibi", 0.5)  # another seed's
    _save(tmp_path, config, "alibi-seed30", "alibi", 0.5)  # a seed whose digits start with the run's
    (tmp_path / "checkpoints" / "t5-seed3").mkdir()  # training: no model.safetensors yet
    (tmp_path / "checkpoints" / "t5-seed3" / "last.pt").write_bytes(b"")
    storage.save_weights(tmp_path / "checkpoints" / "mystery-seed3" / "model.safetensors", {"w": torch.ones(1)})
    models = trained_models(tmp_path)
    assert list(models) == ["rope"] and not models["rope"].training
    for name, tensor in models["rope"].state_dict().items():
        assert torch.equal(tensor, rope[name]), name


def test_a_folder_that_is_not_a_run_or_has_no_finished_model_of_its_seed_is_one_line(tmp_path):
    folder = re.escape(str(tmp_path))
    with pytest.raises(ValueError, match=f"^--ckpt {folder}: not a posenc extrapolate run "
                                         r"\(no config\.json there\)$"):
        trained_models(tmp_path)
    config = ExperimentConfig.from_preset("smoke", seed=0)
    storage.write_json(tmp_path / "config.json", config.to_dict())
    _save(tmp_path, config, "rope-seed1", "rope", 0.25)  # another seed's: the run has none of its own
    with pytest.raises(ValueError, match=f"^--ckpt {folder}: no finished checkpoints under "
                                         f"{re.escape(str(tmp_path / 'checkpoints'))}$"):
        trained_models(tmp_path)


def test_the_attention_window_is_the_first_training_length_of_the_runs_test_text(tmp_path):
    text = tmp_path / "book.txt"
    text.write_bytes(bytes(torch.randint(32, 127, (10_000,), generator=torch.Generator().manual_seed(0)).tolist()))
    config = ExperimentConfig.from_preset("smoke", text=str(text), train_length=24)
    storage.write_json(tmp_path / "config.json", config.to_dict())
    window = attention_window(tmp_path)
    assert window.dtype == torch.int64 and window.shape == (1, 24)
    corpus = text_corpus(text)
    assert torch.equal(window[0], corpus.test.data[:24].long())
    assert not torch.equal(window[0], corpus.train.data[:24].long())  # the test split's, not the first bytes


def test_a_run_on_the_default_text_reads_the_standard_librarys_test_split(tmp_path):
    storage.write_json(tmp_path / "config.json", ExperimentConfig.from_preset("smoke", train_length=16).to_dict())
    assert torch.equal(attention_window(tmp_path)[0], stdlib_corpus().test.data[:16].long())
