"""What the mutation run over ``posenc.hf`` found unpinned (docs/mutation.md): the per-layer encoding and scaling
of a model with one RoPE per layer type, the defaults ``full_rope_parameters`` fills in, the layers of a plain model,
SmolLM3's sliding-window switch, loading a folder (dtype, tokenizer), and the export's folder: its mode, its record,
its refusals. Tiny random models built offline (tests/test_hf_families.py)."""

import json
import os
import stat

import pytest
import torch
import transformers

from posenc import hf
from tests.test_hf_families import COMMON, tiny


def frequencies(encoding) -> torch.Tensor:
    """A RoPE's angles at positions 0..7 (first head channel pairs): what tells two RoPEs apart."""
    q = torch.ones(1, 1, 8, encoding.head_dim, dtype=torch.float64)
    rotated, _ = encoding.rotate(q, q, torch.arange(8), torch.arange(8))
    return rotated


def test_each_layer_of_a_per_layer_type_model_gets_its_own_types_rope():
    gemma = tiny("gemma3_text")  # layer 0 sliding (theta 1e4, default), layer 1 full (theta 1e6, linear x2)
    local, global_ = hf.rope_encoding(gemma, "sliding_attention"), hf.rope_encoding(gemma, "full_attention")
    assert not torch.allclose(frequencies(local), frequencies(global_))
    assert torch.equal(frequencies(hf.layer_encoding(gemma, 0)), frequencies(local))
    assert torch.equal(frequencies(hf.layer_encoding(gemma, 1)), frequencies(global_))


def test_scaling_the_local_layers_keeps_their_own_theta_and_leaves_the_global_dict():
    gemma = tiny("gemma3_text")
    full = dict(gemma.config.rope_parameters["full_attention"])
    hf.apply_scaling(gemma, {"rope_type": "linear", "factor": 3.0}, layer_types_to_scale=("sliding_attention",))
    assert gemma.config.rope_parameters["sliding_attention"] == {"rope_type": "linear", "factor": 3.0,
                                                                 "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
    assert gemma.config.rope_parameters["full_attention"] == full
    with pytest.raises(ValueError, match="^layer_types_to_scale is for models with one RoPE per layer type; this "
                                         "one has one$"):
        hf.apply_scaling(tiny("llama"), {"rope_type": "linear", "factor": 2.0}, layer_types_to_scale=("x",))


def test_a_per_layer_type_model_without_global_layers_must_be_told_which_type():
    gemma = tiny("gemma3_text")
    gemma.config.rope_parameters = {"sliding_attention": gemma.config.rope_parameters["sliding_attention"],
                                    "chunked_attention": {"rope_type": "default", "rope_theta": 5e5}}
    with pytest.raises(ValueError, match=r"^this model has one RoPE per layer type \(sliding_attention, "
                                         r"chunked_attention\); name one with layer_type=$"):
        hf.model_rope_parameters(gemma)
    assert hf.model_rope_parameters(gemma, "chunked_attention")["rope_theta"] == 5e5


def test_full_rope_parameters_fills_in_what_the_dict_leaves_out():
    llama = tiny("llama")
    llama.config.rope_parameters = {"rope_type": "default"}  # no theta: transformers' default, 10,000
    assert hf.full_rope_parameters(llama, {"rope_type": "linear", "factor": 2.0})["rope_theta"] == 10000.0
    legacy = hf.full_rope_parameters(tiny("llama"), {"type": "yarn", "factor": 2.0})  # the pre-4.45 key
    assert legacy["rope_type"] == "yarn" and legacy["original_max_position_embeddings"] == 32
    partial = tiny("llama")
    partial.config.rope_parameters = {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}
    got = hf.full_rope_parameters(partial, {"rope_type": "linear", "factor": 2.0})
    assert (got["rope_theta"], got["partial_rotary_factor"]) == (5e5, 0.5)
    with pytest.raises(ValueError, match="factor"):  # every check of rope_frequencies runs on the full dict
        hf.full_rope_parameters(tiny("llama"), {"rope_type": "yarn", "factor": -2.0})
    with pytest.raises(ValueError, match="a 'phi3' config holds only rope_type default, longrope, ntk"):
        hf.full_rope_parameters(tiny("phi3"), {"type": "linear", "factor": 2.0})


def test_the_head_width_is_the_configs_own_when_it_names_one():
    config = transformers.LlamaConfig(**{**COMMON, "head_dim": 32})
    assert hf.head_dim(config) == 32 and hf.head_dim(transformers.LlamaConfig(**COMMON)) == 16


def test_a_plain_model_has_full_attention_rope_layers_only():
    assert hf.layer_positions(tiny("llama")) == tuple(
        {"layer_type": "full_attention", "rope": True, "window": None, "chunk": None, "temperature": None}
        for _ in range(2))


@pytest.mark.parametrize("switch, window", [(True, 5), (False, None)])
def test_smollm3_windows_only_when_its_switch_is_on(switch, window):
    config = transformers.SmolLM3Config(**{**COMMON, "num_hidden_layers": 2}, no_rope_layers=[1, 1],
                                        use_sliding_window=switch, sliding_window=5,
                                        layer_types=["sliding_attention", "full_attention"])
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert [d["window"] for d in hf.layer_positions(model)] == [window, None]


def test_an_unsupported_model_names_the_supported_ones_and_its_own_scheme():
    bloom = transformers.AutoModelForCausalLM.from_config(transformers.BloomConfig(
        n_layer=1, n_head=2, hidden_size=16, vocab_size=50))
    with pytest.raises(ValueError) as raised:
        hf.check_supported(bloom)
    assert str(raised.value) == ("posenc.hf supports the RoPE model types " + ", ".join(hf.SUPPORTED) +
                                 "; this model is 'bloom', whose attention uses ALiBi")
    llama = tiny("llama")
    del llama.model.rotary_emb  # a supported type whose rotary embedding is not where posenc reads it
    with pytest.raises(ValueError, match="'llama', whose attention uses no rotary embedding posenc can find$"):
        hf.check_supported(llama)


def test_a_folder_loads_in_float32_unless_asked_with_its_tokenizer_when_it_has_one(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    original = tiny("llama").double()
    original.save_pretrained(tmp_path / "m")
    model, tokenizer = hf.load(tmp_path / "m")
    assert next(model.parameters()).dtype == torch.float32 and tokenizer is None and not model.training
    assert next(hf.load(tmp_path / "m", dtype=torch.float64)[0].parameters()).dtype == torch.float64
    words = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(tmp_path / "m")
    _, tokenizer = hf.load(tmp_path / "m")
    assert tokenizer("hello world")["input_ids"] == [1, 2]


def test_the_export_is_shared_like_any_result_and_records_what_wrote_it(tmp_path):
    umask = os.umask(0o022)
    try:
        out = hf.export(tiny("llama"), {"rope_type": "linear", "factor": 2.0}, tmp_path / "deep" / "er" / "x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o755  # not mkdtemp's 0700
    record = json.loads((out / "posenc.json").read_text())
    assert record["written_by"] == "posenc.hf.export" and record["rope_parameters"]["factor"] == 2.0
    assert (out / "model.safetensors").exists() and not list(out.parent.glob(".x.*"))  # no temp folder left
    hf.export(tiny("llama"), {"rope_type": "linear", "factor": 3.0}, out)  # an earlier export is replaced
    assert json.loads((out / "posenc.json").read_text())["rope_parameters"]["factor"] == 3.0


def test_the_export_refuses_a_foreign_folder_and_quantized_weights(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="exists and was not written by posenc.hf.export"):
        hf.export(tiny("llama"), {"rope_type": "linear", "factor": 2.0}, foreign)
    assert (foreign / "notes.txt").read_text() == "keep"
    hf.check_export_folder(tmp_path / "empty")  # a missing folder is fine, and so is an empty one
    (tmp_path / "empty").mkdir()
    hf.check_export_folder(tmp_path / "empty")
    quantized = tiny("llama")
    quantized.hf_quantizer = type("Q", (), {"quantization_config": type("C", (), {"quant_method": "gguf"})()})()
    with pytest.raises(ValueError, match=r"^this model's weights are quantized \(gguf\); export writes float "
                                         r"weights only: load it unquantized$"):
        hf.export(quantized, {"rope_type": "linear", "factor": 2.0}, tmp_path / "q")


def test_a_dict_without_a_type_is_default_which_every_family_holds():
    got = hf.full_rope_parameters(tiny("phi3"), {"rope_theta": 20000.0})  # Phi-3 holds default and longrope only
    assert got["rope_type"] == "default" and got["rope_theta"] == 20000.0


def test_the_rotary_width_a_dict_implies_is_checked_against_the_model():
    with pytest.raises(ValueError, match=r"rotary dim .* must be an even integer >= 2, got 9 \(head_dim=16"):
        hf.full_rope_parameters(tiny("llama"), {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5625})


def test_a_negative_layer_names_the_argument():
    with pytest.raises(ValueError, match="^layer must be an integer >= 0, got -1$"):
        hf.layer_encoding(tiny("llama"), -1)


def test_a_foreign_folders_refusal_says_what_to_do(tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    with pytest.raises(ValueError) as raised:
        hf.check_export_folder(tmp_path)
    assert str(raised.value).endswith("name a new folder (an earlier export in it would be replaced)")


def test_an_export_that_fails_midway_leaves_neither_folder_nor_temp(tmp_path, monkeypatch):
    model = tiny("llama")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(model, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):
        hf.export(model, {"rope_type": "linear", "factor": 2.0}, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_the_export_writes_the_tokenizer_it_is_given(tmp_path):
    from tokenizers import Tokenizer, models

    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]")), unk_token="[UNK]")
    out = hf.export(tiny("llama"), {"rope_type": "linear", "factor": 2.0}, tmp_path / "x", tokenizer)
    assert (out / "tokenizer.json").exists() and hf.load(out)[1] is not None


def test_the_joined_gemma3_file_is_cached_under_the_home_folder_by_default(monkeypatch, tmp_path):
    from tests.test_hf import fake_gemma3_parts

    fake_gemma3_parts(monkeypatch, tmp_path, [b"GGUF", b"-a", b"-b", b"-c"])
    monkeypatch.setattr(hf.Path, "home", classmethod(lambda cls: tmp_path / "home"))
    assert hf.gemma3_path() == tmp_path / "home" / ".cache" / "posenc" / "gemma-3-270m-q4_k_m.gguf"
