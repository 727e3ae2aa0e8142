"""The tiny LM against its forward pass written out by hand, and the parts of the model a wrong edit would move
unseen: which layers run which encoding, explicit positions under a length-dependent rotation, per-row positions
through the cache, the weights a block holds, and each bad argument's message."""

import math

import pytest
import torch
import torch.nn.functional as F

from posenc.encodings.alibi import alibi_slopes
from posenc.lm.model import EMBEDDING_STD, KVCache, LanguageModel, ModelConfig, StreamingCache

DYNAMIC = {"scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}}


def small(encoding: str = "alibi", **overrides) -> LanguageModel:
    torch.manual_seed(0)
    config = ModelConfig(**{"encoding": encoding, "dim": 16, "num_layers": 2, "num_heads": 4, "max_positions": 16,
                            "backend": "eager", **overrides})
    return LanguageModel(config).double().eval()


def by_hand(model: LanguageModel, tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits (B, T, V), each layer's attention weights (B, H, T, T)): a pre-norm decoder with ALiBi's biases."""
    config = model.config
    batch, length = tokens.shape
    heads, head_dim = config.num_heads, config.head_dim
    i = torch.arange(length)
    bias = -alibi_slopes(heads).double()[:, None, None] * (i[:, None] - i[None, :])  # (H, T, T)
    future = i[None, :] > i[:, None]
    x, maps = model.embed.weight[tokens], []
    for block in model.blocks:
        h = F.layer_norm(x, (config.dim,), block.attn_norm.weight, block.attn_norm.bias)
        q, k, v = (h @ block.qkv.weight.T).view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        weights = (q @ k.transpose(-1, -2) / math.sqrt(head_dim) + bias).masked_fill(future, -math.inf).softmax(-1)
        maps.append(weights)
        x = x + (weights @ v).transpose(1, 2).reshape(batch, length, config.dim) @ block.attn_out.weight.T
        h = F.layer_norm(x, (config.dim,), block.mlp_norm.weight, block.mlp_norm.bias)
        up, _, down = block.mlp
        x = x + F.linear(F.gelu(F.linear(h, up.weight, up.bias)), down.weight, down.bias)
    x = F.layer_norm(x, (config.dim,), model.final_norm.weight, model.final_norm.bias)
    return x @ model.embed.weight.T, maps


def test_the_model_is_the_pre_norm_decoder_written_out_by_hand():
    model, tokens, maps = small(), torch.randint(0, 256, (2, 10)), []
    with torch.no_grad():
        logits = model(tokens, maps=maps)
        want, want_maps = by_hand(model, tokens)
    torch.testing.assert_close(logits, want, rtol=1e-10, atol=1e-10)
    assert len(maps) == len(want_maps) == 2
    for got, expected in zip(maps, want_maps):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_a_block_holds_no_attention_biases_and_a_sink_only_when_asked():
    shapes = {name: tuple(p.shape) for name, p in small().blocks[0].named_parameters()}
    assert shapes == {"attn_norm.weight": (16,), "attn_norm.bias": (16,), "qkv.weight": (48, 16),
                      "attn_out.weight": (16, 16), "mlp_norm.weight": (16,), "mlp_norm.bias": (16,),
                      "mlp.0.weight": (64, 16), "mlp.0.bias": (64,), "mlp.2.weight": (16, 64), "mlp.2.bias": (16,)}
    assert small(attention_sink=True).blocks[0].sink.shape == (4,)


def test_input_encodings_are_built_at_the_token_embeddings_scale():
    assert small("sinusoidal").encoding.scale == pytest.approx(EMBEDDING_STD * math.sqrt(2))  # RMS 0.02
    assert small("learned").encoding.init_std == EMBEDDING_STD


def test_each_local_layer_runs_its_own_encoding_with_its_own_arguments():
    tokens = torch.randint(0, 256, (1, 12))

    def logits(local: dict) -> torch.Tensor:
        model = small("none", layers=({"window": 6, **local}, {}))
        with torch.no_grad():
            return model(tokens)

    rope = logits({"encoding": "rope"})
    assert not torch.allclose(rope, logits({"encoding": "none"}))
    assert not torch.allclose(rope, logits({"encoding": "rope", "encoding_kwargs": {"base": 100.0}}))
    two = small("none", num_layers=3, layers=({"encoding": "rope", "window": 4}, {}, {
        "encoding": "rope", "encoding_kwargs": {"base": 100.0}, "window": 4}))
    assert len(two.layer_encodings) == 2 and two._encoding_of_layer == [0, None, 1]


def test_explicit_positions_set_a_length_dependent_rotation_by_their_own_span():
    scaled, plain = small("rope", encoding_kwargs=DYNAMIC), small("rope")
    plain.load_state_dict(scaled.state_dict())
    tokens = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        inside = [model(tokens, positions=torch.arange(8)) for model in (scaled, plain)]
        beyond = [model(tokens, positions=torch.arange(20, 28)) for model in (scaled, plain)]
    torch.testing.assert_close(inside[0], inside[1], rtol=0, atol=0)  # 8 positions: no scaling yet
    assert not torch.allclose(beyond[0], beyond[1])  # reaching position 27 scales, whatever the 8 tokens


def test_decoding_with_positions_per_row_equals_the_full_pass():
    model, tokens = small("rope"), torch.randint(0, 256, (2, 9))
    positions = torch.stack([torch.arange(9), torch.arange(9) + 3])
    with torch.no_grad():
        full = model(tokens, positions=positions)
        cache = KVCache(2)
        pieces = [model(tokens[:, :5], positions=positions[:, :5], cache=cache)]
        pieces += [model(tokens[:, t : t + 1], positions=positions[:, t : t + 1], cache=cache) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("field", ["dim", "num_layers", "num_heads"])
def test_each_size_is_named_when_it_is_not_positive(field):
    with pytest.raises(ValueError, match=f"^{field} must be an integer >= 1, got 0$"):
        ModelConfig(**{field: 0})


def test_bad_layers_positions_and_caches_are_named():
    assert ModelConfig(num_layers=2, layers=[{}, {}]).layers == ({}, {})  # kept as a tuple
    with pytest.raises(ValueError, match=r"^layers\[0\]: 'sinusoidal' acts on the input embeddings, not in a layer; "
                                         r"give it as the model's encoding$"):
        small("none", layers=({"encoding": "sinusoidal", "window": 4}, {}))
    with pytest.raises(ValueError, match="^positions"):
        small()(torch.randint(0, 256, (2, 5)), positions=torch.zeros(3, 5, dtype=torch.long))
    assert StreamingCache(1, sink_tokens=0).sink_tokens == 0
    with pytest.raises(ValueError, match="^sink_tokens must be an integer >= 0, got -1$"):
        StreamingCache(1, sink_tokens=-1)


def test_each_layer_forgets_through_its_own_gate():
    model, tokens = small("fox"), torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        before = model(tokens)
        model.encoding.gates[1].bias.fill_(-3.0)  # the second layer forgets fast; the first is untouched
        after = model(tokens)
    assert not torch.allclose(before, after)
