"""``torch.compile(model, fullgraph=True)`` captures the training step and KV-cache decoding of
the tiny LM with every encoding, and the compiled model computes what the eager one does.

Graph capture is what can fail (a data-dependent guard breaks the graph), so most cases
compile with the ``aot_eager`` backend: dynamo and the autograd graph are real, no C++ is
built. One case runs inductor end to end.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from posenc.encodings import ENCODINGS
from posenc.encodings.relative import TransformerXL
from posenc.lm.model import KVCache, LanguageModel, ModelConfig

SCALED_ROPE = {"scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}}


def tiny_model(encoding: str, **encoding_kwargs) -> LanguageModel:
    config = ModelConfig(encoding=encoding, encoding_kwargs=encoding_kwargs, dim=16, num_layers=2, num_heads=2,
                         max_positions=16)
    return LanguageModel(config)


def loss_and_grads(model, tokens):
    loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for p in model.parameters():
        p.grad = None
    return loss.detach(), grads


def check_training_step(model, backend):
    torch._dynamo.reset()
    tokens = torch.randint(0, 256, (2, 10))
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    got_loss, got_grads = loss_and_grads(compiled, tokens)
    loss, grads = loss_and_grads(model, tokens)
    torch.testing.assert_close(got_loss, loss, rtol=1e-5, atol=1e-5)
    for got, expected in zip(got_grads, grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("encoding", list(ENCODINGS) + ["rope+dynamic"])
def test_fullgraph_training_step_equals_eager(encoding):
    model = tiny_model("rope", **SCALED_ROPE) if encoding == "rope+dynamic" else tiny_model(encoding)
    check_training_step(model, "aot_eager")


@pytest.mark.parametrize("encoding", list(ENCODINGS) + ["rope+dynamic"])
def test_fullgraph_kv_cache_decoding_equals_eager_decoding(encoding):
    """Prefill then one token at a time, compiled and eager (which test_model checks against the full pass)."""
    torch._dynamo.reset()
    model = (tiny_model("rope", **SCALED_ROPE) if encoding == "rope+dynamic" else tiny_model(encoding)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)  # sharp attention, so a wrong rotation or bias shows
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    tokens = torch.randint(0, 256, (2, 9))

    def decode(forward):
        cache = KVCache(model.config.num_layers)
        steps = [forward(tokens[:, :6], cache=cache)] + [forward(tokens[:, t : t + 1], cache=cache) for t in (6, 7, 8)]
        return torch.cat(steps, dim=1)

    with torch.no_grad():
        torch.testing.assert_close(decode(compiled), decode(model), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels_from_keys", [0, math.inf], ids=["channels", "bias"])
def test_transformer_xl_compiles_in_either_form(channels_from_keys, monkeypatch):
    """The channel form (what serves from 256 keys on CPU) and the bias form, both under fullgraph compile: the
    per-block rebuild of the query channels calls autograd.grad, which dynamo does not trace, so a compiled
    model hands the kernel whole channels instead."""
    monkeypatch.setattr(TransformerXL, "cpu_channels_from_keys", channels_from_keys)
    check_training_step(tiny_model("transformer_xl"), "aot_eager")


def test_inductor_training_step_equals_eager():
    check_training_step(tiny_model("rope"), "inductor")


def test_training_loop_with_compile_reaches_the_eager_weights(tmp_path):
    """``train(compile=True)`` (what ``posenc extrapolate --compile`` runs) follows the eager run."""
    from posenc.lm.train import TrainConfig, train

    data = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    config = TrainConfig(steps=3, batch_size=4, length=16, lr=1e-3, warmup=1, checkpoint_every=3)
    weights = {}
    for compile in (False, True):
        torch.manual_seed(0)
        model = tiny_model("rope")
        train(model, data, config, checkpoint=tmp_path / f"{compile}.pt", device=torch.device("cpu"), compile=compile)
        weights[compile] = model.state_dict()
    for name, value in weights[False].items():
        torch.testing.assert_close(weights[True][name], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["irope", "swa+global"])
def test_a_model_whose_layers_mix_schemes_compiles_fullgraph(layout):
    """Local layers through the block kernel (a chunk, a window) and a global layer, in one captured graph."""
    from posenc.lm.layouts import LAYOUTS

    chosen = LAYOUTS[layout]
    config = ModelConfig(encoding=chosen.global_encoding, encoding_kwargs=chosen.global_kwargs,
                         layers=chosen.layers(2, 3), dim=16, num_layers=2, num_heads=2, max_positions=16)
    check_training_step(LanguageModel(config), "aot_eager")
