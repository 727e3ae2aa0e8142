"""Shared by the oracle tests of Kerple, Sandwich, FIRE, xPos and CoPE (tests/encodings/test_<name>.py): float64
inputs and posenc's attention on every backend that serves against softmax(q·kᵀ/√Dh + bias)·v one query at a time."""

import torch

import posenc
from posenc.attention import serves
from tests.oracles import naive_attention

HEADS, HEAD_DIM, LENGTH = 3, 8, 9


def qkv(length=LENGTH, heads=HEADS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, length, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(3))


def assert_attention_equals_oracle(enc, bias, q, k, v, causal=True, atol=1e-10, **kwargs):
    """posenc's attention (every backend that serves) = softmax(q·kᵀ/√Dh + bias)·v one query at a time."""
    length = q.shape[2]
    allowed = torch.ones(length, length).tril().bool() if causal else None
    for backend in ("eager", "sdpa", "flex"):
        if not serves(backend, enc, q, k, v):
            continue
        with torch.no_grad():
            got = posenc.attention(q, k, v, enc, causal=causal, backend=backend, **kwargs)
        for h in range(q.shape[1]):
            want = naive_attention(q[0, h], k[0, h], v[0, h], bias=bias[h], allowed=allowed)
            torch.testing.assert_close(got[0, h], want, rtol=atol, atol=atol, msg=f"{backend}, head {h}")
