"""A learned sink logit per head: a zero-valued key every query may attend to."""

import math

import pytest
import torch

import posenc
from tests.helpers import ATTENTION_ENCODINGS, make_encoding, qkv
from tests.oracles import naive_attention

SINK = torch.tensor([0.5, -1.0], dtype=torch.float64)


def with_sink_oracle(q, k, v, sink, allowed):
    """Softmax attention one query at a time with one more key: logit ``sink``, value zero. (Tq, Dv)."""
    extra_k = torch.cat((torch.zeros(1, q.shape[-1], dtype=q.dtype), k))
    extra_v = torch.cat((torch.zeros(1, v.shape[-1], dtype=v.dtype), v))
    bias = torch.zeros(q.shape[0], k.shape[0] + 1, dtype=torch.float64)
    bias[:, 0] = sink
    keep = torch.cat((torch.ones(q.shape[0], 1, dtype=torch.bool), allowed), 1)
    return naive_attention(q, extra_k, extra_v, bias=bias, allowed=keep)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_sink_equals_one_more_zero_key_with_the_sink_logit(backend):
    q, k, v = qkv(batch=1, q_len=6, k_len=6)
    out = posenc.attention(q, k, v, backend=backend, sink=SINK)
    allowed = torch.ones(6, 6).tril().bool()
    for h in range(2):
        torch.testing.assert_close(out[0, h], with_sink_oracle(q[0, h], k[0, h], v[0, h], float(SINK[h]), allowed),
                                   rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("key", [k for k in ATTENTION_ENCODINGS if k not in ("shaw",)])
def test_sdpa_with_sink_agrees_with_eager_for_every_encoding(key):
    enc = make_encoding(key)
    q, k, v = qkv(q_len=5, k_len=12)
    kwargs = dict(q_positions=torch.arange(7, 12), k_positions=torch.arange(12), sink=SINK)
    with torch.no_grad():
        torch.testing.assert_close(posenc.attention(q, k, v, enc, backend="sdpa", **kwargs),
                                   posenc.attention(q, k, v, enc, backend="eager", **kwargs), rtol=1e-10, atol=1e-10)


def test_sink_limits_and_gradient():
    q, k, v = qkv(q_len=8, k_len=8)
    plain = posenc.attention(q, k, v)
    torch.testing.assert_close(posenc.attention(q, k, v, sink=torch.full((2,), -1e4, dtype=torch.float64)), plain)
    assert posenc.attention(q, k, v, sink=torch.full((2,), 1e4, dtype=torch.float64)).abs().max() < 1e-12
    weights = posenc.attention_weights(q, k, sink=SINK)
    assert (weights.sum(-1) < 1).all() and (weights.sum(-1) > 0).all()
    sink = SINK.clone().requires_grad_()
    posenc.attention(q, k, v, sink=sink, backend="sdpa").sum().backward()
    assert sink.grad is not None and sink.grad.abs().min() > 0


def test_kv_cache_decoding_with_a_sink_equals_the_full_pass():
    enc = make_encoding("alibi")
    q, k, v = qkv(q_len=9, k_len=9)
    full = posenc.attention(q, k, v, enc, sink=SINK)
    steps = [posenc.attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], enc, sink=SINK,
                              q_positions=torch.tensor([t]), k_positions=torch.arange(t + 1)) for t in range(9)]
    torch.testing.assert_close(torch.cat(steps, 2), full, rtol=1e-10, atol=1e-10)


def test_bad_sinks_are_refused_with_the_reason():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"sink must be a tensor of one logit per query head, shape \(2,\), got \(3,\)"):
        posenc.attention(q, k, v, sink=torch.zeros(3))
    with pytest.raises(ValueError, match="a sink logit is one more key, outside a score_mod; use backend='sdpa'"):
        posenc.attention(q, k, v, backend="flex", sink=SINK)
    with torch.no_grad():
        assert math.isfinite(float(posenc.attention(q, k, v, make_encoding("shaw"), sink=SINK).sum()))  # auto: eager


def test_a_model_with_sinks_learns_them_and_decodes_from_its_cache():
    from posenc.lm.model import KVCache, LanguageModel, ModelConfig

    lm = LanguageModel(ModelConfig(encoding="rope", dim=32, num_layers=2, num_heads=4, max_positions=32,
                                   attention_sink=True)).double()
    tokens = torch.randint(0, 256, (2, 16))
    lm(tokens).logsumexp(-1).mean().backward()
    assert all(block.sink.grad is not None and block.sink.grad.abs().sum() > 0 for block in lm.blocks)
    with torch.no_grad():
        for block in lm.blocks:
            block.sink.normal_(0, 2.0)
        full = lm.eval()(tokens)
        cache = KVCache(2)
        steps = [lm(tokens[:, :5], cache=cache)] + [lm(tokens[:, t : t + 1], cache=cache) for t in range(5, 16)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-9, atol=1e-9)


def test_streaming_cache_keeps_first_and_recent_tokens_at_slot_positions():
    """Within sink_tokens + window it is the plain cache; past it each step of a one-layer model (whose
    cached keys and values depend on their tokens alone) equals a full pass over the first tokens, the
    window and the new token, numbered 0..n: StreamingLLM's definition. Deeper layers keep the values
    their tokens got when first seen, as StreamingLLM does."""
    from posenc.lm.model import KVCache, LanguageModel, ModelConfig, StreamingCache

    for encoding in ("rope", "alibi"):
        torch.manual_seed(0)
        lm = LanguageModel(ModelConfig(encoding=encoding, dim=32, num_layers=1, num_heads=4, max_positions=64)).double()
        with torch.no_grad():
            for parameter in lm.parameters():
                parameter.normal_(0, 0.3)
        lm.eval()
        tokens = torch.randint(0, 256, (1, 30))
        with torch.no_grad():
            stream = StreamingCache(1, sink_tokens=2, window=6)
            steps = [lm(tokens[:, :5], cache=stream)] + [lm(tokens[:, t : t + 1], cache=stream) for t in range(5, 30)]
            assert stream.length == 8 and stream.keys[0].shape[2] == 8
            plain = KVCache(1)
            torch.testing.assert_close(torch.cat(steps[:4], 1), lm(tokens[:, :8], cache=plain), rtol=1e-9, atol=1e-9)
            for t in (8, 9, 17, 29):  # past the 2 + 6 kept: first two tokens, the last six, then token t
                kept = torch.cat((tokens[:, :2], tokens[:, t - 6 : t], tokens[:, t : t + 1]), 1)
                torch.testing.assert_close(steps[t - 4], lm(kept)[:, -1:], rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        StreamingCache(2, window=0)
