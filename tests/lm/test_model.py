"""

The tiny LM against its forward pass written out by hand, and the parts of the model a wrong edit would move
unseen: which layers run which encoding, explicit positions under a length-dependent rotation, per-row positions
through the cache, the weights a block holds, and each bad argument's message.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from posenc.lm.model import KVCache, LanguageModel, ModelConfig
from posenc.encodings.alibi import alibi_slopes
from posenc.lm.model import EMBEDDING_STD, StreamingCache


ENCODINGS = {
    "none": {}, "sinusoidal": {}, "learned": {}, "alibi": {}, "rope": {}, "t5": {}, "shaw": {"max_distance": 4},
    "transformer_xl": {},
    "rope_yarn": {"scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}},
    "kerple": {"variant": "power"}, "sandwich": {"sinusoid_dim": 16}, "fire": {"width": 8}, "xpos": {"scale_base": 8.0},
    "cope": {"max_positions": 8}, "mrope": {"interleaved": True}, "axial_rope": {},
}
# Its frequencies depend on the context length, so decoding step t equals the full pass over t + 1 tokens only.
DYNAMIC = {"scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}}


def model(key, **overrides):
    name = key.split("_")[0] if key.startswith("rope") else key
    config = ModelConfig(encoding=name, encoding_kwargs=DYNAMIC if key == "rope_dynamic" else ENCODINGS[key], dim=32, num_layers=2, num_heads=4,
                         max_positions=32, **overrides)
    return LanguageModel(config).double().eval()


@pytest.mark.parametrize("key", list(ENCODINGS))
def test_kv_cache_decoding_equals_full_forward(key):
    lm = model(key)
    tokens = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        full = lm(tokens)
        cache = KVCache(len(lm.blocks))
        pieces = [lm(tokens[:, :7], cache=cache)]
        pieces += [lm(tokens[:, t : t + 1], cache=cache) for t in range(7, 20)]
    assert cache.length == 20
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("key, history_rotated_again", [("rope_yarn", False), ("rope_dynamic", True)])
def test_a_decoding_step_rotates_only_its_new_key_unless_the_rotation_depends_on_length(key, history_rotated_again,
                                                                                       monkeypatch):
    """Cached keys are rotated once; only dynamic NTK/LongRoPE re-rotate the history (new frequencies)."""
    from posenc.encodings import rotary

    lm = model(key)
    tokens = torch.randint(0, 256, (1, 12))
    cache = KVCache(len(lm.blocks))
    with torch.no_grad():
        lm(tokens[:, :11], cache=cache)
        table_lengths = []
        original = rotary.rope_cos_sin
        monkeypatch.setattr(rotary, "rope_cos_sin", lambda pos, *a: table_lengths.append(pos.shape[-1]) or original(pos, *a))
        lm(tokens[:, 11:], cache=cache)
    assert table_lengths == ([1, 12] if history_rotated_again else [1])  # once per step, shared by all layers


def test_parameter_counts_differ_only_by_the_encodings_tables():
    counts = {key: model(key).parameter_counts() for key in ENCODINGS}
    assert len({c["model"] for c in counts.values()}) == 1
    assert counts["learned"]["encoding"] == 32 * 32
    assert counts["t5"]["encoding"] == 32 * 4
    assert counts["rope"]["encoding"] == counts["alibi"]["encoding"] == counts["none"]["encoding"] == 0


@pytest.mark.parametrize("key", ["alibi", "rope", "t5", "transformer_xl"])
def test_model_backends_agree(key):
    tokens = torch.randint(0, 256, (2, 24))
    eager, sdpa = model(key, backend="eager"), model(key, backend="sdpa")
    sdpa.load_state_dict(eager.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(sdpa(tokens), eager(tokens), rtol=1e-9, atol=1e-9)


def test_bfloat16_model_runs_and_stays_close():
    lm = model("rope").float()
    tokens = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        reference = lm(tokens)
        low = lm.to(torch.bfloat16)(tokens)
    assert low.dtype == torch.bfloat16
    assert (low.float() - reference).abs().max() < 0.1


def test_model_config_rejects_bad_sizes():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        ModelConfig(dim=30, num_heads=4)
    with pytest.raises(ValueError, match="unknown encoding 'rotary'"):
        LanguageModel(ModelConfig(encoding="rotary"))


def test_every_encoding_starts_from_the_same_shared_weights_at_the_same_seed():
    """The token embeddings and blocks come from their own generator: an encoding that draws parameters (a learned
    table, FIRE's MLP, Kerple's slopes) leaves them as a parameter-free one has them; another seed moves them."""
    def shared(encoding: str, seed: int) -> dict:
        torch.manual_seed(seed)
        model = LanguageModel(ModelConfig(encoding=encoding, dim=32, num_layers=2, num_heads=4, max_positions=16))
        return {name: p for name, p in model.state_dict().items() if not name.startswith("encoding.")}

    reference = shared("none", 0)
    assert any("qkv" in name for name in reference) and "embed.weight" in reference
    for encoding in ("learned", "fire", "kerple", "cope", "fox", "rope"):
        weights = shared(encoding, 0)
        assert weights.keys() == reference.keys()
        assert all(torch.equal(weights[name], reference[name]) for name in reference), encoding
    other = shared("none", 1)
    assert not torch.equal(other["embed.weight"], reference["embed.weight"])
    assert reference["blocks.0.mlp.0.bias"].abs().sum() == 0  # biases start at zero
    deep = reference["blocks.1.attn_out.weight"].std().item()
    assert deep == pytest.approx(0.02 / 2, rel=0.15)  # GPT-2's shrunk residual branch: 0.02 / sqrt(2 · 2 layers)


def test_dynamic_ntk_decoding_past_the_original_length_equals_the_full_pass_at_each_length():
    """Pins the wrong version that gives a length-dependent scaling the count of the step's new tokens (1) as its
    context length instead of the cache's length plus them. ``test_kv_cache_decoding_equals_full_forward`` runs no
    dynamic scaling at all (``ENCODINGS`` holds none), and counting the rotary tables, as the test above does, sees
    the same table sizes either way. Dynamic NTK is the identity up to its original 8 positions and rescales past
    them, so a step at length 9..20 read with length 1 gets unscaled frequencies and other logits; each step must
    equal the last logits of a full pass over the same prefix (that pass's own length sets its frequencies).
    One layer: its keys come straight from the embeddings, so re-rotating the cached history at the new length is
    exactly the full pass; a deeper layer's cached keys were computed from hidden states of the shorter lengths'
    frequencies, which no cache that keeps them can match (with two layers a cached step differs from the re-read
    by ~1e-6 at init, ~1e-3 with this test's sharpened weights)."""
    def one_layer(encoding_kwargs: dict) -> LanguageModel:
        config = ModelConfig(encoding="rope", encoding_kwargs=encoding_kwargs, dim=32, num_layers=1, num_heads=4)
        return LanguageModel(config).double().eval()

    lm = one_layer(DYNAMIC)
    with torch.no_grad():  # sharpen attention: at init (weights ~0.02) positions move the logits by only ~1e-5
        for block in lm.blocks:
            block.qkv.weight.mul_(10)
    tokens = torch.randint(0, 256, (2, 20))
    cache = KVCache(len(lm.blocks))
    with torch.no_grad():
        torch.testing.assert_close(lm(tokens[:, :4], cache=cache), lm(tokens[:, :4]), rtol=1e-9, atol=1e-9)
        for t in range(4, 20):  # step t: the token at position t, after a cache of t tokens
            step = lm(tokens[:, t : t + 1], cache=cache)[:, 0]  # (B, V)
            full = lm(tokens[:, : t + 1])[:, -1]  # (B, V): the pass over t + 1 tokens, at its own frequencies
            torch.testing.assert_close(step, full, rtol=1e-9, atol=1e-9, msg=f"step at length {t + 1}")
        assert cache.length == 20
        # the scaling acts past the original length only, and there enough to see (else this pins nothing)
        plain = one_layer({})
        plain.load_state_dict(lm.state_dict())
        torch.testing.assert_close(plain(tokens[:, :8]), lm(tokens[:, :8]), rtol=1e-9, atol=1e-9)
        assert (plain(tokens[:, :9])[:, -1] - lm(tokens[:, :9])[:, -1]).abs().max() > 1e-3


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


@pytest.mark.parametrize("field", ["dim", "num_layers", "num_heads", "mlp_ratio", "vocab_size", "max_positions"])
def test_each_size_is_named_when_it_is_not_positive(field):
    with pytest.raises(ValueError, match=f"^{field} must be an integer >= 1, got 0$"):
        ModelConfig(**{field: 0})


def test_tokens_and_caches_the_model_cannot_read_are_named():
    with pytest.raises(ValueError, match=r"^backend must be one of \['auto', 'eager', 'flex', 'sdpa'\], got 'cuda'$"):
        ModelConfig(backend="cuda")
    model = small()
    shape = r"^tokens must be a \(B, T\) integer tensor of ids in \[0, 256\), B, T >= 1, got "
    for tokens, got in ((torch.zeros(2, 5), r"torch.float32 \(2, 5\)$"), (torch.zeros(5, dtype=torch.long),
                        r"torch.int64 \(5,\)$"), (torch.zeros(2, 0, dtype=torch.long), r"torch.int64 \(2, 0\)$"),
                        (torch.zeros(2, 5, dtype=torch.bool), r"torch.bool \(2, 5\)$"), ([[1, 2]], r"<class 'list'> \(\)$")):
        with pytest.raises(ValueError, match=shape + got):
            model(tokens)
    for bad in (-1, 256):
        with pytest.raises(ValueError, match=rf"^tokens must be ids in \[0, 256\) \(vocab_size\), got {bad}$"):
            model(torch.tensor([[0, 255, bad]]))
    assert model(torch.tensor([[0, 255]])).shape == (1, 2, 256)  # both ends of the vocabulary
    for layers in (model.config.num_layers - 1, model.config.num_layers + 1):
        with pytest.raises(ValueError, match=rf"^the cache holds {layers} layers but the model has "
                                             rf"{model.config.num_layers}: make it with KVCache"):
            model(torch.tensor([[1, 2]]), cache=KVCache(layers))
    cache = KVCache(model.config.num_layers)
    model(torch.tensor([[1, 2]]), cache=cache)
    with pytest.raises(ValueError, match=r"^the cache holds a batch of 1 sequences but tokens has B=3: a cache "
                                         r"continues the sequences it was filled with"):
        model(torch.tensor([[3], [4], [5]]), cache=cache)
    assert model(torch.tensor([[3]]), cache=cache).shape == (1, 1, 256) and cache.length == 3


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
