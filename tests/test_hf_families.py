"""posenc.hf on each model family people hold, as tiny random models built offline from their
transformers config classes: load from a saved folder, rescale, posenc's rotation = the model's
own, loss by position, export and reload."""

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from posenc import hf
from posenc.experiments.pretrained.measure import position_losses

CONTEXT, VOCAB = 32, 97
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=CONTEXT, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
FAMILIES = {
    "llama": (transformers.LlamaConfig, {}),
    "mistral": (transformers.MistralConfig, {"head_dim": 16}),
    "qwen2": (transformers.Qwen2Config, {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
    "qwen3": (transformers.Qwen3Config, {"head_dim": 16}),
    "gemma3_text": (transformers.Gemma3TextConfig, {
        "head_dim": 16, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}}),
    "phi3": (transformers.Phi3Config, {
        "original_max_position_embeddings": CONTEXT // 2,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                            "short_factor": [1.0 + i / 16 for i in range(8)], "long_factor": [1.0 + i for i in range(8)]}}),
}


LONGER = {"rope_type": "longrope", "factor": 4.0, "short_factor": [1.0] * 8, "long_factor": [4.0 + i for i in range(8)]}


def scaling_for(family: str) -> dict:
    """What each family's config can hold: Phi3Config takes only default and longrope."""
    return LONGER if family == "phi3" else {"rope_type": "yarn", "factor": 4.0}


def tiny(family: str, rope_parameters: dict | None = None, seed: int = 0):
    config_class, extra = FAMILIES[family]
    kwargs = {**COMMON, **extra}
    if rope_parameters is not None:
        kwargs["rope_parameters"] = rope_parameters
    torch.manual_seed(seed)
    config = config_class(**kwargs)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(3, VOCAB, (1, 3 * CONTEXT), generator=torch.Generator().manual_seed(1))


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("family", list(FAMILIES))
def test_load_a_saved_folder_and_apply_a_scaling(family, tmp_path, tokens):
    original = tiny(family)
    original.save_pretrained(tmp_path / family)
    model, tokenizer = hf.load(tmp_path / family)
    assert tokenizer is None and model.config.model_type == family
    torch.testing.assert_close(logits(model, tokens), logits(original, tokens))
    before = logits(model, tokens)
    hf.apply_scaling(model, scaling_for(family))
    rebuilt = tiny(family, rope_parameters=dict(model.config.rope_parameters))
    rebuilt.load_state_dict(model.state_dict())
    after = logits(model, tokens)
    torch.testing.assert_close(after, logits(rebuilt, tokens), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before, atol=1e-3)
    scaled = hf.model_rope_parameters(model)
    assert scaled["rope_type"] == scaling_for(family)["rope_type"] and scaled["original_max_position_embeddings"] == hf.original_context(model)
    if family == "gemma3_text":  # the global layers rescale; the local ones keep their own dict
        assert model.config.rope_parameters["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
        assert scaled["rope_theta"] == 1e6
    if family == "phi3":  # the pretraining context Phi-3 keeps outside its rope dict
        assert hf.original_context(model) == CONTEXT // 2
        with pytest.raises(ValueError, match="a 'phi3' config holds only rope_type default, longrope, ntk .*got 'yarn'"):
            hf.apply_scaling(model, {"rope_type": "yarn", "factor": 4.0})


@pytest.mark.parametrize("family", list(FAMILIES))
def test_posenc_rotation_equals_the_models_own(family):
    model = hf.apply_scaling(tiny(family), scaling_for(family))
    types = hf.layer_types(model) or (None,)
    length = 3 * CONTEXT
    q, k = torch.randn(1, 4, length, 16), torch.randn(1, 2, length, 16)
    positions = torch.arange(length)[None]
    for layer_type in types:
        extra = {} if layer_type is None else {"layer_type": layer_type}
        cos, sin = model.model.rotary_emb(q, positions, **extra)
        want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
        got_q, got_k = hf.rope_encoding(model, layer_type).rotate(q, k, positions, positions)
        torch.testing.assert_close(got_q, want_q, rtol=0, atol=1e-4)
        torch.testing.assert_close(got_k, want_k, rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_loss_by_position_and_export(family, tmp_path, tokens):
    model = tiny(family)
    window = tokens[0]
    want = torch.nn.functional.cross_entropy(logits(model, window[None])[0, :-1], window[1:], reduction="none")
    torch.testing.assert_close(position_losses(model, window, 7), want, rtol=1e-5, atol=1e-5)
    scaling = {"rope_type": "ntk", "factor": 2.0} if family == "phi3" else {"rope_type": "linear", "factor": 2.0}
    out = hf.export(model, scaling, tmp_path / "exported")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    torch.testing.assert_close(logits(loaded, tokens), logits(model, tokens), rtol=1e-5, atol=1e-5)
    assert hf.model_rope_parameters(loaded)["rope_type"] == ("default" if family == "phi3" else "linear")


def test_per_layer_type_errors_name_the_choices():
    gemma = tiny("gemma3_text")
    with pytest.raises(ValueError, match=r"layer_type must be one of \['full_attention', 'sliding_attention'\]"):
        hf.rope_encoding(gemma, "global")
    with pytest.raises(ValueError, match="one RoPE for every layer; leave it out"):
        hf.rope_encoding(tiny("llama"), "full_attention")
    both = hf.apply_scaling(gemma, {"rope_type": "linear", "factor": 2.0},
                            layer_types_to_scale=("sliding_attention", "full_attention"))
    assert {params["rope_type"] for params in both.config.rope_parameters.values()} == {"linear"}
