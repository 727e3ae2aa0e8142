"""Per-layer positions in the tiny LM: local layers attend only within their window or chunk (a token further back
cannot move their output), decoding from a KV cache equals the full pass, evaluation kwargs reach the global
layers only, and a bad description is one clear error."""

import pytest
import torch

from posenc.lm.layouts import LAYOUTS
from posenc.lm.model import KVCache, LanguageModel, ModelConfig


def layered(layers, encoding="none", **kwargs) -> LanguageModel:
    torch.manual_seed(0)
    config = ModelConfig(encoding=encoding, layers=tuple(layers), dim=32, num_layers=len(layers), num_heads=4,
                         max_positions=32, **kwargs)
    return LanguageModel(config).double().eval()


def moved(model, tokens, position: int) -> torch.Tensor:
    """|Δ logits| at every position (T,) when the token at ``position`` changes."""
    other = tokens.clone()
    other[0, position] = (other[0, position] + 1) % 256
    with torch.no_grad():
        return (model(other) - model(tokens)).abs().amax(dim=(0, 2))


@pytest.mark.parametrize("span", ["window", "chunk"])
def test_a_local_layer_sees_only_its_window_or_chunk(span):
    """Two local layers of span 4: through a window, position t reads t − 6 .. t (two hops of 3 back); through a
    chunk, only its own chunk of 4."""
    model = layered([{"encoding": "rope", span: 4}] * 2)
    tokens = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    change = moved(model, tokens, 5)
    reached = (change > 1e-9).nonzero().flatten().tolist()
    assert reached == (list(range(5, 12)) if span == "window" else [5, 6, 7])


def test_a_global_layer_reads_everything_before():
    model = layered([{"encoding": "rope", "window": 4}, {}])
    tokens = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    assert ((moved(model, tokens, 2) > 1e-9).nonzero().flatten().tolist()) == list(range(2, 16))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_kv_cache_decoding_of_every_layout_equals_the_full_pass(name):
    layout = LAYOUTS[name]
    model = layered(layout.layers(4, 5), encoding=layout.global_encoding, encoding_kwargs=layout.global_kwargs)
    tokens = torch.randint(0, 256, (2, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(4)
        pieces = [model(tokens[:, :6], cache=cache)] + [model(tokens[:, t:t + 1], cache=cache) for t in range(6, 23)]
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-9, atol=1e-9)


def test_global_entries_are_the_plain_model():
    plain = layered([{}, {}], encoding="rope")
    torch.manual_seed(0)
    same = LanguageModel(ModelConfig(encoding="rope", dim=32, num_layers=2, num_heads=4, max_positions=32)).double()
    tokens = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(plain(tokens), same.eval()(tokens), rtol=0, atol=0)


def test_evaluation_kwargs_reach_the_global_layers_only_and_the_weights_still_load():
    layout = LAYOUTS["swa+global"]
    trained = layered(layout.layers(4, 8), encoding="rope", encoding_kwargs=layout.global_kwargs)
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    scaled = layered(layout.layers(4, 8), encoding="rope", encoding_kwargs={**layout.global_kwargs, "scaling": scaling})
    scaled.load_state_dict(trained.state_dict())
    assert scaled.encoding.scaling["rope_type"] == "yarn" and scaled.encoding.scaling["rope_theta"] == 1_000_000.0
    (local,) = scaled.layer_encodings
    assert local.scaling["rope_type"] == "default" and local.scaling["rope_theta"] == 10_000.0
    assert scaled._encoding_of_layer == [0, 0, 0, None]


def test_layers_with_the_same_encoding_share_one_module_and_distinct_ones_do_not():
    model = layered([{"encoding": "rope", "window": 4}, {"encoding": "rope", "chunk": 4},
                     {"encoding": "alibi", "window": 4}, {}])
    assert [type(e).__name__ for e in model.layer_encodings] == ["RoPE", "ALiBi"]
    assert model._encoding_of_layer == [0, 0, 1, None]
    assert model.parameter_counts()["encoding"] == 0


@pytest.mark.parametrize("layers, message", [
    ([{}], "one entry per layer \\(2\\)"),
    ([{}, {"span": 3}], r"layers\[1\]: unknown keys \['span'\]; valid: encoding, encoding_kwargs, window, chunk$"),
    ([{}, {"encoding": "rope", "window": 0}], r"layers\[1\].window must be an integer >= 1"),
    ([{"encoding": "rope", "chunk": -2}, {}], r"layers\[0\].chunk must be an integer >= 1"),
    ([{}, {"encoding_kwargs": {"base": 5.0}}], r"layers\[1\]: encoding_kwargs without an encoding; a global layer "
                                                r"\(\{\}\) takes the model's encoding and encoding_kwargs$"),
    ([{}, {"encoding": "sinusoidal"}], r"layers\[1\]: 'sinusoidal' acts on the input embeddings"),
    ("rope", "layers must be a list of dicts"),
    (({} for _ in range(2)), "layers must be a list of dicts"),  # dicts, but not in a list
])
def test_a_bad_layer_description_is_one_clear_error(layers, message):
    with pytest.raises(ValueError, match=message):
        LanguageModel(ModelConfig(encoding="none", layers=layers, dim=32, num_layers=2, num_heads=4))


def test_named_layouts_put_a_global_layer_every_fourth_and_last():
    layers = LAYOUTS["irope"].layers(6, 16)
    assert [entry.get("chunk") for entry in layers] == [16, 16, 16, None, 16, None]
    assert [entry.get("encoding") for entry in layers] == ["rope", "rope", "rope", None, "rope", None]
    assert LAYOUTS["swa+global"].layers(1, 16) == ({},)
    with pytest.raises(ValueError, match="span must be an integer >= 1"):
        LAYOUTS["rnope-swa"].layers(4, 0)


def test_a_layer_may_give_its_own_encoding_with_its_kwargs():
    layers = ({"encoding": "rope", "encoding_kwargs": {"base": 500.0}, "window": 4}, {})
    model = LanguageModel(ModelConfig(encoding="none", layers=layers, dim=32, num_layers=2, num_heads=4))
    assert model.config.layers == layers
