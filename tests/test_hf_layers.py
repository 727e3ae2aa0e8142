"""Models that mix position schemes per layer, as tiny random models built offline from their transformers configs
(SmolLM3: NoPE layers; Cohere2: RoPE, interleaved, on sliding-window layers only; gpt-oss: YaRN, sliding and
global layers, sink logits; Llama 4: chunked RoPE layers and NoPE global layers with attention temperature):
``hf.layer_positions`` reads each layer as the model's code does, and posenc's attention with ``layer_encoding``
and the layer's window and chunk (``attention(window=, chunk=)``) equals every layer's own attention; rescaling moves
only the layers that rotate."""

import pytest
import torch

import posenc
from posenc import hf

transformers = pytest.importorskip("transformers")

LENGTH = 20
COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
FAMILIES = {
    "smollm3": ("SmolLM3Config", dict(no_rope_layers=[1, 1, 1, 0])),
    "cohere2": ("Cohere2Config", dict(layer_types=["sliding_attention"] * 3 + ["full_attention"], sliding_window=5)),
    "gpt_oss": ("GptOssConfig", dict(head_dim=16, layer_types=["sliding_attention", "full_attention"] * 2,
                                     sliding_window=6, num_local_experts=2, num_experts_per_tok=1,
                                     rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                                      "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                                      "original_max_position_embeddings": 16})),
    "llama4_text": ("Llama4TextConfig", dict(head_dim=16, no_rope_layers=[1, 1, 1, 0], attention_chunk_size=6,
                                             floor_scale=4, attn_scale=0.5, use_qk_norm=False,
                                             intermediate_size_mlp=96, num_local_experts=2)),
}
EXPECTED = {  # (rope, window, chunk, tempered) per layer, from each config above
    "smollm3": [(True, None, None, False)] * 3 + [(False, None, None, False)],
    "cohere2": [(True, 5, None, False)] * 3 + [(False, None, None, False)],
    "gpt_oss": [(True, 6, None, False), (True, None, None, False)] * 2,
    "llama4_text": [(True, None, 6, False)] * 3 + [(False, None, None, True)],
}


def tiny(family: str):
    config_class, extra = FAMILIES[family]
    config = getattr(transformers, config_class)(**COMMON, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).double().eval()


def layer_outputs(model, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(the layer's own attention output, posenc's) for every decoder layer, on hidden states x (1, T, D)."""
    position_embeddings = model.model.rotary_emb(x, torch.arange(x.shape[1])[None])
    pairs = []
    for layer, block in enumerate(model.model.layers):
        attn, described = block.self_attn, hf.layer_positions(model)[layer]
        allowed = hf.layer_mask(described, x.shape[1])
        additive = torch.zeros(allowed.shape, dtype=x.dtype).masked_fill(~allowed, float("-inf"))
        with torch.no_grad():
            own, _ = attn(x, position_embeddings=position_embeddings, attention_mask=additive)
            q, k, v = (p(x).view(1, x.shape[1], -1, attn.head_dim).transpose(1, 2)
                       for p in (attn.q_proj, attn.k_proj, attn.v_proj))
            y = posenc.attention(q, k, v, hf.layer_encoding(model, layer), window=described["window"],
                                 chunk=described["chunk"], sink=getattr(attn, "sinks", None))
            pairs.append((own, attn.o_proj(y.transpose(1, 2).reshape(1, x.shape[1], -1))))
    return pairs


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_positions_read_the_config_as_the_model_does(family):
    described = hf.layer_positions(tiny(family))
    assert [(d["rope"], d["window"], d["chunk"], d["temperature"] is not None) for d in described] == EXPECTED[family]
    if family == "llama4_text":
        assert described[3]["temperature"] == {"kind": "llama4", "beta": 0.5, "floor": 4}


@pytest.mark.parametrize("family", FAMILIES)
def test_posenc_attention_of_every_layer_equals_the_models_own(family):
    model = tiny(family)
    x = torch.randn(1, LENGTH, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for layer, (own, ours) in enumerate(layer_outputs(model, x)):
        # the models compute cos and sin in float32; posenc's angles are float64
        torch.testing.assert_close(ours, own, rtol=0, atol=1e-7, msg=f"{family} layer {layer}")
    if family in hf.INTERLEAVED:  # the layout matters: the other one is a different model
        assert hf.rope_encoding(model).layout == "interleaved"


@pytest.mark.parametrize("family", ["smollm3", "cohere2", "llama4_text"])
def test_rescaling_moves_only_the_layers_that_rotate(family):
    model = tiny(family)
    x = torch.randn(1, LENGTH, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    before = [own for own, _ in layer_outputs(model, x)]
    hf.apply_scaling(model, {"rope_type": "linear", "factor": 4.0})
    after = layer_outputs(model, x)
    for layer, (described, (own, ours)) in enumerate(zip(hf.layer_positions(model), after)):
        torch.testing.assert_close(ours, own, rtol=0, atol=1e-7)  # still equal, scaled
        moved = float((own - before[layer]).abs().max())
        assert moved > 1e-6 if described["rope"] else moved == 0, (family, layer, moved)


def test_a_layer_out_of_range_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"layer must be in \[0, 3\], got 4"):
        hf.layer_encoding(tiny("smollm3"), 4)
