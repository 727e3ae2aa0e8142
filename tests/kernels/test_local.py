"""Sliding-window and chunked attention: the block kernel equals the one-query-at-a-time oracle, every backend and
encoding equals eager under the same window, and KV-cache decoding equals the full pass."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.attention import serves
from posenc.kernels.local import local_attention
from tests.helpers import ATTENTION_ENCODINGS, make_encoding, qkv
from tests.oracles import naive_attention


def allowed_pairs(length: int, window: int | None, chunk: int | None) -> torch.Tensor:
    """(T, T) bool, written out pair by pair from the definitions."""
    return torch.tensor([[j <= i and (window is None or i - j < window) and (chunk is None or i // chunk == j // chunk)
                          for j in range(length)] for i in range(length)])


def oracle(q, k, v, window, chunk) -> torch.Tensor:
    allowed = allowed_pairs(q.shape[2], window, chunk)
    return torch.stack([torch.stack([naive_attention(q[b, h], k[b, h], v[b, h], allowed=allowed)
                                     for h in range(q.shape[1])]) for b in range(q.shape[0])])


@pytest.mark.parametrize("length, window, chunk", [
    (13, 4, None), (16, 4, None), (5, 8, None), (13, None, 4), (16, None, 4), (5, None, 8), (1, 3, None),
    (17, 3, 8), (17, 6, 4), (12, 4, 4)])
def test_the_block_kernel_equals_the_oracle(length, window, chunk):
    q, k, v = qkv(batch=2, q_len=length, k_len=length)
    out = local_attention(q, k, v, window=window, chunk=chunk, scale=q.shape[-1] ** -0.5)
    torch.testing.assert_close(out, oracle(q, k, v, window, chunk), rtol=1e-10, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(length=st.integers(1, 40), window=st.one_of(st.none(), st.integers(1, 12)),
       chunk=st.one_of(st.none(), st.integers(1, 12)))
def test_the_block_kernel_equals_the_masked_eager_pass_with_gradients(length, window, chunk):
    if window is None and chunk is None:
        window = 5
    q, k, v = (t.requires_grad_() for t in qkv(batch=1, q_len=length, k_len=length))
    out = local_attention(q, k, v, window=window, chunk=chunk, scale=0.3)
    mask = allowed_pairs(length, window, chunk)[None, None]
    reference = posenc.attention(q, k, v, mask=mask, scale=0.3, backend="eager")
    torch.testing.assert_close(out, reference, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad((out * v.sum(-1, keepdim=True)).sum(), (q, k, v))
    expected = torch.autograd.grad((reference * v.sum(-1, keepdim=True)).sum(), (q, k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("key", list(ATTENTION_ENCODINGS))
@pytest.mark.parametrize("span", [{"window": 3}, {"chunk": 4}])
def test_every_encoding_and_backend_equals_eager_with_the_pairs_as_a_mask(key, span):
    enc = make_encoding(key)
    q, k, v = qkv(batch=2, q_len=10, k_len=10)
    mask = allowed_pairs(10, span.get("window"), span.get("chunk"))[None, None]
    with torch.no_grad():
        expected = posenc.attention(q, k, v, enc, mask=mask, backend="eager")
        for backend in ("eager", "sdpa", "auto"):
            if backend == "sdpa" and not serves(backend, enc, q, k, v):
                continue
            torch.testing.assert_close(posenc.attention(q, k, v, enc, backend=backend, **span), expected,
                                       rtol=1e-10, atol=1e-10)


def test_the_window_changes_the_output_and_a_wide_one_does_not():
    enc = make_encoding("rope")
    q, k, v = qkv(q_len=12, k_len=12)
    full = posenc.attention(q, k, v, enc)
    torch.testing.assert_close(posenc.attention(q, k, v, enc, window=12), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(posenc.attention(q, k, v, enc, chunk=12), full, rtol=1e-12, atol=1e-12)
    narrow = posenc.attention(q, k, v, enc, window=11)
    torch.testing.assert_close(narrow[:, :, :11], full[:, :, :11], rtol=1e-12, atol=1e-12)
    assert (narrow[:, :, 11] - full[:, :, 11]).abs().max() > 1e-3  # the last query lost key 0


def test_weights_show_the_window_and_the_chunk():
    q, k, _ = qkv(batch=1, q_len=9, k_len=9)
    window = posenc.attention_weights(q, k, window=3)[0, 0]
    assert ((window > 0) == allowed_pairs(9, 3, None)).all()
    chunk = posenc.attention_weights(q, k, chunk=4)[0, 0]
    assert ((chunk > 0) == allowed_pairs(9, None, 4)).all()


@pytest.mark.parametrize("span", [{"window": 4}, {"chunk": 4}])
def test_kv_cache_steps_equal_the_full_pass(span):
    enc = make_encoding("rope")
    q, k, v = qkv(batch=1, q_len=11, k_len=11)
    full = posenc.attention(q, k, v, enc, **span)
    for t in range(6, 11):  # the query at position t over keys 0..t
        step = posenc.attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], enc, **span)
        torch.testing.assert_close(step[:, :, 0], full[:, :, t], rtol=1e-10, atol=1e-10)


def test_grouped_query_heads_are_served():
    q = torch.randn(1, 4, 9, 8, dtype=torch.float64)
    k, v = torch.randn(1, 2, 9, 8, dtype=torch.float64), torch.randn(1, 2, 9, 8, dtype=torch.float64)
    repeated = [t.repeat_interleave(2, dim=1) for t in (k, v)]
    torch.testing.assert_close(posenc.attention(q, k, v, window=3, backend="sdpa"),
                               posenc.attention(q, *repeated, window=3, backend="eager"), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name, value", [("window", 0), ("chunk", -2), ("window", 2.5), ("chunk", True)])
def test_a_bad_span_is_one_clear_error(name, value):
    q, k, v = qkv(q_len=4, k_len=4)
    with pytest.raises(ValueError, match=f"{name} must be an integer >= 1"):
        posenc.attention(q, k, v, **{name: value})
