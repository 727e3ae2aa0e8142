"""Every documented ``posenc pretrained`` flag, end to end at smoke size (several per run): LoRA, full fine-tuning of
another scaling, the length-dependent scalings (retrieval re-read per key), ReRoPE's and Self-Extend's options,
the named corpora. --export and --resume run in test_pretrained.py."""

import json

import pytest
import torch

from posenc.cli import main
from posenc.experiments.pretrained import PretrainedConfig
from posenc.experiments.pretrained.measure import ByteTokens, long_documents, tiny_llama
from posenc.extension import retrieval
from posenc import hf


def _run(tmp_path, *flags) -> dict:
    out = tmp_path / "run"
    assert main(["pretrained", "tiny", "--preset", "smoke", *flags, "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())


def test_lora_fine_tunes_pose_and_its_control_and_measures_them(tmp_path):
    got = _run(tmp_path, "--lora", "4", "--methods", "none", "--finetune-steps", "2")
    assert set(got["finetune"]) == {"yarn+pose", "yarn+control"} and got["config"]["lora"] == 4
    for name in ("yarn+pose", "yarn+control"):  # the curve ran through the peft-wrapped model
        assert set(got["finetune"][name]["curve"]) == {"0", "1", "2"}
    assert got["rows"]["yarn+pose"]["past"]["mean"] != got["rows"]["none"]["past"]["mean"]


def test_full_fine_tuning_of_ntk_with_rerope_and_the_length_dependent_scalings(tmp_path):
    got = _run(tmp_path, "--finetune", "full", "--finetune-method", "ntk", "--finetune-steps", "2",
               "--methods", "none,dynamic,longrope,rerope", "--self-extend-window", "16", "--corpus", "stdlib",
               "--search-population", "4", "--search-generations", "1", "--control-stride", "256")
    assert list(got["rows"]) == ["none", "dynamic", "longrope", "rerope", "ntk+full"]
    assert got["rows"]["rerope"]["attention"] == "rerope" and got["self_extend_group"] is None
    assert got["rows"]["longrope"]["rope_parameters"]["rope_type"] == "longrope"
    assert got["control"]["context"] == [257, 512]
    # dynamic NTK's keys were asked with the whole prompt re-read per key, not from a cache of other frequencies
    config = PretrainedConfig.from_preset("smoke")
    model = tiny_llama(0, 512)
    hf.apply_scaling(model, got["rows"]["dynamic"]["rope_parameters"])
    window = long_documents(config, ByteTokens(), "test", 1, config.to)[0]["ids"]
    haystack = retrieval.make_haystack(ByteTokens().encode, window.tolist(), config.to, 4, 1, seed=0,
                                       format=got["retrieval_format"])
    needle = haystack.needles[0]
    encode = ByteTokens().encode
    question = retrieval.FORMATS[got["retrieval_format"]].ask(needle.label)
    _, whole = retrieval.ask_whole(model, haystack.ids, encode(question), encode(" " + needle.key))
    assert got["rows"]["dynamic"]["test"][0]["retrieval"][0]["log_prob"] == pytest.approx(whole, abs=1e-4)


def test_self_extend_options_and_the_bible(tmp_path):
    pytest.importorskip("torch")
    try:
        from posenc.lm.corpora import kjv_path

        kjv_path()
    except ValueError as error:
        pytest.skip(str(error))
    got = _run(tmp_path, "--finetune", "none", "--methods", "none,self-extend", "--self-extend-window", "64",
               "--self-extend-group", "4", "--corpus", "kjv,stdlib", "--documents", "3", "--dev-documents", "1",
               "--keys-per-band", "1", "--to", "640")
    assert got["self_extend_group"] == 4 and got["config"]["to"] == 640
    assert [d.split("/")[0] for d in got["documents"]["test"]] == ["kjv", "stdlib", "kjv"]  # sources in turn
    assert got["corpus"]["parts"]["kjv"]["file_is_pinned_release"]
    assert torch.tensor([d["past"] for d in got["rows"]["self-extend"]["test"]]).isfinite().all()


def test_longropes_factors_are_searched_on_a_dev_document_never_a_test_one(tmp_path, monkeypatch):
    """Pins the wrong version that scores LongRoPE's candidates on a test document: the search reads the first dev
    document, and no test document's tokens."""
    from posenc.experiments.pretrained import stages

    searched = []

    def search_recorded(model, text, config, factor, original, theta, out, log):
        searched.append(text)
        return {"rope_type": "longrope", "factor": factor, "original_max_position_embeddings": original,
                "short_factor": [1.0] * 8, "long_factor": [factor] * 8, "rope_theta": theta}  # head_dim 16

    monkeypatch.setattr(stages, "_search", search_recorded)
    args = ["--methods", "none,longrope", "--finetune", "none", "--documents", "2", "--dev-documents", "2"]
    assert main(["pretrained", "tiny", "--preset", "smoke", *args, "--out", str(tmp_path / "run")]) == 0
    config = PretrainedConfig.from_preset("smoke", documents=2, dev_documents=2)
    dev = long_documents(config, ByteTokens(), "dev", 2, config.to)
    test = long_documents(config, ByteTokens(), "test", 2, config.to)
    assert len(searched) == 1 and torch.equal(searched[0], dev[0]["ids"])
    assert not any(torch.equal(searched[0], t["ids"]) for t in test)
