"""FoX's forgetting attention equals the paper's formula in float64 on every backend, its gates come from each
layer's input, its gradients reach the gates, and the tiny LM decodes with a cache as it runs the full pass."""

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.attention import serves
from posenc.lm.model import KVCache, LanguageModel, ModelConfig, StreamingCache

HEADS, DIM = 2, 6


def inputs(batch=2, length=7, head_dim=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, HEADS, length, head_dim, generator=generator, dtype=torch.float64) for _ in range(3))
    log_forget = F.logsigmoid(torch.randn(batch, HEADS, length, generator=generator, dtype=torch.float64) + 1.0)
    return q, k, v, log_forget


def fox():
    return posenc.build("fox", dim=DIM, num_heads=HEADS, num_layers=2).double()


def paper_formula(q, k, v, log_forget):
    """out_i = Σ_{j ≤ i} softmax_j(q_i·k_j/√d + Σ_{j < l ≤ i} log f_l) v_j, with loops."""
    batch, heads, length, dim = q.shape
    out = torch.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                logits = torch.stack([q[b, h, i] @ k[b, h, j] / dim**0.5 + sum(log_forget[b, h, j + 1 : i + 1])
                                      for j in range(i + 1)])
                out[b, h, i] = torch.softmax(logits, 0) @ v[b, h, : i + 1]
    return out


def gated(encoding, log_forget, length):
    positions = torch.arange(length)
    return encoding.at(positions, positions).with_gates(log_forget)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "flex"])
def test_equals_the_paper_formula_on_every_backend(backend):
    q, k, v, log_forget = inputs()
    encoding = fox()
    with torch.no_grad():
        assert serves(backend, encoding, q, k, v)
        got = posenc.attention(q, k, v, gated(encoding, log_forget, 7), backend=backend)
    torch.testing.assert_close(got, paper_formula(q, k, v, log_forget), rtol=1e-10, atol=1e-10)


def test_gates_of_one_are_nope_and_a_constant_gate_is_a_linear_distance_bias():
    q, k, v, _ = inputs()
    encoding = fox()
    ones = torch.zeros(2, HEADS, 7, dtype=torch.float64)
    torch.testing.assert_close(posenc.attention(q, k, v, gated(encoding, ones, 7)), posenc.attention(q, k, v))
    slope = torch.tensor([0.5, 0.125], dtype=torch.float64)
    constant = (-slope)[None, :, None].expand(2, HEADS, 7)
    distance = torch.arange(7)[:, None] - torch.arange(7)[None, :]
    bias = (-slope[:, None, None] * distance).masked_fill(distance < 0, float("-inf"))
    expected = torch.softmax(q @ k.transpose(-1, -2) / 2 + bias, -1) @ v  # ALiBi with slopes 1/2 and 1/8
    torch.testing.assert_close(posenc.attention(q, k, v, gated(encoding, constant, 7)), expected)


def test_gates_are_each_layers_own_projection_of_its_input():
    encoding = fox()
    x = torch.randn(2, 5, DIM, dtype=torch.float64)
    for layer in (0, 1):
        gate = encoding.gates[layer]
        expected = F.logsigmoid(x @ gate.weight.T + gate.bias).transpose(1, 2)
        torch.testing.assert_close(encoding.log_forget(x, layer), expected, rtol=0, atol=0)
    assert encoding.log_forget(x, 0).shape == (2, HEADS, 5)
    assert not torch.equal(encoding.log_forget(x, 0), encoding.log_forget(x, 1))
    with pytest.raises(ValueError, match=r"layer must be in \[0, 1\] .*num_layers=2\), got 2"):
        encoding.log_forget(x, 2)
    torch.testing.assert_close(encoding.log_forget(x), encoding.log_forget(x, 0), rtol=0, atol=0)  # layer 0 unless named
    fresh = posenc.build("fox", dim=DIM, num_heads=HEADS)
    assert len(fresh.gates) == 1  # one layer unless told
    assert torch.all(fresh.gates[0].bias == 0) and 0.01 < float(fresh.gates[0].weight.detach().std()) < 0.04


def test_sdpa_gradients_reach_the_gates_as_eagers_do():
    q, k, v, _ = inputs()
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    grads = {}
    for backend in ("eager", "sdpa"):
        torch.manual_seed(0)
        encoding = fox()
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = posenc.attention(*leaves, gated(encoding, encoding.log_forget(x, 1), 7), backend=backend)
        grads[backend] = torch.autograd.grad(out.square().sum(), [*leaves, *encoding.gates[1].parameters()])
    assert grads["eager"][3].abs().max() > 1e-3  # the gate's weight learns
    for got, want in zip(grads["sdpa"], grads["eager"]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_packed_documents_equal_separate_runs():
    q, k, v, log_forget = inputs(batch=1, length=9)
    doc_ids = torch.tensor([0] * 4 + [1] * 5)
    positions = posenc.document_positions(doc_ids)
    encoding = fox()
    packed = posenc.attention(q, k, v, encoding.at(positions, positions).with_gates(log_forget),
                              mask=posenc.document_mask(doc_ids))
    separate = torch.cat([posenc.attention(q[:, :, s], k[:, :, s], v[:, :, s],
                                           gated(encoding, log_forget[..., s], s.stop - s.start))
                          for s in (slice(0, 4), slice(4, 9))], dim=2)
    torch.testing.assert_close(packed, separate, rtol=1e-12, atol=1e-12)


def test_the_tiny_lm_decodes_with_a_cache_as_it_runs_the_full_pass():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(encoding="fox", dim=16, num_layers=2, num_heads=2)).double()
    assert [g.in_features for g in model.encoding.gates] == [16, 16]  # one gate projection per layer
    tokens = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(2)
        steps = torch.cat([model(tokens[:, t : t + 1], cache=cache) for t in range(12)], dim=1)
        assert cache.gates[1].shape == (2, 2, 12)
        torch.testing.assert_close(steps, full, rtol=1e-10, atol=1e-10)
        streaming = StreamingCache(2, sink_tokens=2, window=4)
        for t in range(12):
            model(tokens[:, t : t + 1], cache=streaming)
        assert streaming.gates[0].shape == (2, 2, 6) and streaming.keys[0].shape[2] == 6


def test_bad_calls_are_one_line_errors():
    q, k, v, log_forget = inputs()
    encoding = fox()
    with pytest.raises(ValueError, match=r"bias comes from its tokens' forget gates: attend with encoding.at"):
        posenc.attention(q, k, v, encoding)
    with pytest.raises(ValueError, match=r"log_forget must be \(B, 2, Tk=7\) .* got \(2, 2, 6\)"):
        gated(encoding, log_forget[..., :6], 7)
    with pytest.raises(ValueError, match="RoPE takes no forget gates"):
        posenc.build("rope", head_dim=4).at(torch.arange(7), torch.arange(7)).with_gates(log_forget)
    with pytest.raises(ValueError, match="causal only"):
        posenc.attention(q, k, v, gated(encoding, log_forget, 7), causal=False)
    with pytest.raises(ValueError) as refused:
        encoding.score_bias(torch.arange(7), torch.arange(7))
    assert str(refused.value) == ("ForgettingGates's bias comes from its tokens' forget gates, not from positions: "
                                  "attend with encoding.at(q_pos, k_pos).with_gates(encoding.log_forget(x, layer))")


def test_the_cumulative_sum_is_float64_so_far_gates_keep_their_digits_and_float32_stays_float32():
    encoding = fox().float()
    steps = 100_000
    log_forget = torch.full((1, HEADS, steps), -0.3, dtype=torch.float32)  # c reaches −30,000
    bias = encoding.gate_bias(log_forget, 4, torch.float32)  # the last 4 queries against every key
    assert bias.dtype == torch.float32 and bias.shape == (1, HEADS, 4, steps)
    torch.testing.assert_close(bias[..., -1, -2], torch.full((1, HEADS), -0.3), rtol=0, atol=1e-6)  # one gate back
    x = torch.randn(2, 5, DIM)
    assert encoding.log_forget(x, 0).dtype == torch.float32
    # bf16 activations: the gates in float32 (the projection's bf16 output upcast before the log-sigmoid)
    half = encoding.to(torch.bfloat16)
    got = half.log_forget(x.to(torch.bfloat16), 0)
    expected = F.logsigmoid(half.gates[0](x.to(torch.bfloat16)).float()).transpose(1, 2)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_bad_sizes_name_the_argument():
    for kwargs, message in [({"num_heads": 0}, "num_heads must be an integer >= 1, got 0"),
                            ({"dim": 0}, "dim must be an integer >= 1, got 0"),
                            ({"num_layers": 0}, "num_layers must be an integer >= 1, got 0")]:
        with pytest.raises(ValueError, match=message):
            posenc.build("fox", **{"dim": DIM, "num_heads": HEADS, **kwargs})
