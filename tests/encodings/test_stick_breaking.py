"""Stick-breaking attention equals the paper's product formula and its reference code's log-space form in float64;
it is causal, order-aware and exact under KV caches, packed documents and grouped heads; flex, and sdpa where its
kernel does not serve (tests/kernels/test_sticks.py), refuse it in one line."""

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.attention import attention_weights, choose_backend
from posenc.lm.model import KVCache, LanguageModel, ModelConfig


def qkv(batch=2, heads=2, q_len=7, k_len=7, dim=4, kv_heads=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    kv_heads = kv_heads or heads
    return (torch.randn(batch, heads, q_len, dim, generator=generator, dtype=torch.float64),
            *(torch.randn(batch, kv_heads, k_len, dim, generator=generator, dtype=torch.float64) for _ in range(2)))


def product_formula(q, k, v, attend_current=False):
    """A_ij = β_ij Π_{j<l<i} (1 − β_il), β = σ(q·k/√d), over keys j < i (≤ i with attend_current); loops."""
    batch, heads, length, dim = q.shape
    out = torch.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            for i in range(length):
                for j in range(i + 1 if attend_current else i):
                    share = torch.sigmoid(q[b, h, i] @ k[b, h, j] / dim**0.5)
                    for l in range(j + 1, i + 1 if attend_current else i):
                        share = share * (1 - torch.sigmoid(q[b, h, i] @ k[b, h, l] / dim**0.5))
                    out[b, h, i] += share * v[b, h, j]
    return out


def reference_code_form(q, k, v):
    """The reference code's shape of it: log σ(z) plus log σ(−z) summed by a strictly-lower-triangular matrix."""
    length = q.shape[2]
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    excluded = torch.ones(length, length, dtype=torch.bool).triu(0)  # the key itself and later keys
    log_z = F.logsigmoid(logits).masked_fill(excluded, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(excluded, 0)
    cumulative = torch.ones(length, length, dtype=q.dtype).tril(-1)
    return (log_z + torch.einsum("bhij,jk->bhik", log_beta, cumulative)).exp() @ v


@pytest.mark.parametrize("attend_current", [False, True])
def test_equals_the_product_formula(attend_current):
    q, k, v = qkv()
    got = posenc.attention(q, k, v, posenc.build("stick-breaking", attend_current=attend_current))
    torch.testing.assert_close(got, product_formula(q, k, v, attend_current), rtol=1e-12, atol=1e-12)


def test_equals_the_reference_codes_log_space_form():
    q, k, v = qkv(q_len=9, k_len=9)
    got = posenc.attention(q, k, v, posenc.build("stick-breaking"))
    torch.testing.assert_close(got, reference_code_form(q, k, v), rtol=1e-12, atol=1e-12)


def test_weights_take_the_nearest_keys_first_and_sum_to_at_most_one():
    q, k, _ = qkv(q_len=6, k_len=6)
    weights = attention_weights(q, k, posenc.build("stick-breaking"))
    assert torch.all(weights.sum(-1) <= 1 + 1e-12) and torch.all(weights >= 0)
    assert torch.all(weights[..., 0, :] == 0)  # the first token has no earlier key
    assert torch.all(weights.triu(0) == 0)  # neither itself nor later keys
    z = q @ k.transpose(-1, -2) / 2
    torch.testing.assert_close(weights[..., 5, 4], torch.sigmoid(z[..., 5, 4]))  # the nearest key: its β whole
    torch.testing.assert_close(weights[..., 5, 3], torch.sigmoid(z[..., 5, 3]) * torch.sigmoid(-z[..., 5, 4]))


def test_kv_cache_decoding_equals_the_full_pass_and_grouped_heads_equal_repeated_ones():
    enc = posenc.build("stick-breaking")
    q, k, v = qkv(heads=4, kv_heads=2, q_len=8, k_len=8)
    full = posenc.attention(q, k, v, enc)
    steps = [posenc.attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], enc,
                              q_positions=torch.tensor([t]), k_positions=torch.arange(t + 1)) for t in range(8)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-12, atol=1e-12)
    repeated = posenc.attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), enc)
    torch.testing.assert_close(full, repeated, rtol=0, atol=0)


def test_packed_documents_equal_separate_runs_and_the_future_never_leaks():
    enc = posenc.build("stick-breaking")
    q, k, v = qkv(batch=1, q_len=11, k_len=11)
    doc_ids = torch.tensor([0] * 4 + [1] * 7)
    positions = posenc.document_positions(doc_ids)
    packed = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions,
                              mask=posenc.document_mask(doc_ids))
    separate = torch.cat([posenc.attention(q[:, :, s], k[:, :, s], v[:, :, s], enc)
                          for s in (slice(0, 4), slice(4, 11))], dim=2)
    torch.testing.assert_close(packed, separate, rtol=1e-12, atol=1e-12)
    later = [t.clone() for t in (q, k, v)]
    for t in later:
        t[:, :, 6:] = torch.randn_like(t[:, :, 6:])
    changed = posenc.attention(*later, enc)
    torch.testing.assert_close(changed[:, :, :6], posenc.attention(q, k, v, enc)[:, :, :6], rtol=0, atol=0)


def test_gradients_equal_finite_differences():
    q, k, v = (t[:1, :1, :5].clone().requires_grad_() for t in qkv())
    assert torch.autograd.gradcheck(lambda *x: posenc.attention(*x, posenc.build("stick-breaking")), (q, k, v))


def test_softmax_backends_bidirectional_calls_and_sinks_are_refused_in_one_line(monkeypatch):
    from posenc.kernels import sticks

    enc = posenc.build("stick-breaking")
    q, k, v = qkv()
    with pytest.raises(ValueError, match="replace the softmax that flex computes; use backend='eager'"):
        posenc.attention(q, k, v, enc, backend="flex")
    monkeypatch.setattr(sticks, "serves", lambda q: False)  # a GPU, or no C++ compiler: no stick-breaking kernel
    assert choose_backend("auto", enc, q, k, v) == "eager"
    with pytest.raises(ValueError, match="replace the softmax that sdpa computes; use backend='eager'"):
        posenc.attention(q, k, v, enc, backend="sdpa")
    monkeypatch.undo()
    with pytest.raises(ValueError, match="causal only: it has no bidirectional form; pass causal=True"):
        posenc.attention(q, k, v, enc, causal=False)
    with pytest.raises(ValueError, match="causal only"):
        attention_weights(q, k, enc, causal=False)
    with pytest.raises(ValueError, match="which a sink logit would join; leave sink out"):
        posenc.attention(q, k, v, enc, sink=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="attend_current must be True or False, got 1"):
        posenc.build("stick-breaking", attend_current=1)


def test_the_tiny_lm_trains_with_it_and_decodes_with_a_cache():
    torch.manual_seed(0)
    model = LanguageModel(ModelConfig(encoding="stick-breaking", dim=16, num_layers=2, num_heads=2)).double()
    tokens = torch.randint(0, 256, (2, 12))
    logits = model(tokens)
    logits.float().logsumexp(-1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
    cache = KVCache(2)
    with torch.no_grad():
        steps = torch.cat([model(tokens[:, t : t + 1], cache=cache) for t in range(12)], dim=1)
        torch.testing.assert_close(steps, model(tokens), rtol=1e-10, atol=1e-10)


def test_float32_inputs_give_float32_outputs_near_the_float64_ones():
    q, k, v = qkv()
    enc = posenc.build("stick-breaking", attend_current=True)
    assert "attend_current=True" in repr(enc) and enc.attend_current is True
    got = posenc.attention(q.float(), k.float(), v.float(), enc)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), posenc.attention(q, k, v, enc), rtol=1e-5, atol=1e-5)
