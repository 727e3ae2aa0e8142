"""Dense attention by query blocks (``kernels.query_blocks``), as a GPU runs it past its logits budget: here on CPU
tensors with ``needed`` switched on and the budget a few rows, against the one-pass dense path."""

import pytest
import torch

import posenc
from posenc.kernels import dispatch, query_blocks
from tests.helpers import ATTENTION_ENCODINGS, make_encoding, qkv


def _values_and_grads(encoding, causal, mask=None, sink=None, q_positions=None, k_positions=None):
    torch.manual_seed(0)
    q, k, v = (x.requires_grad_() for x in qkv(q_len=12, k_len=12))
    out = posenc.attention(q, k, v, encoding, causal=causal, mask=mask, sink=sink, backend="eager",
                           q_positions=q_positions, k_positions=k_positions)
    leaves = [q, k, v, *encoding.parameters(), *([sink] if sink is not None else [])]
    grads = torch.autograd.grad(out, leaves, torch.randn_like(out), allow_unused=True)
    return [out, *grads]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("key", sorted(ATTENTION_ENCODINGS))
def test_blocks_equal_the_one_pass_dense_path(monkeypatch, key, causal):
    """Every encoding: the output and the gradients of q, k, v and every parameter, to float64's rounding; a
    12-query call in blocks of 5 (the last block short)."""
    encoding = make_encoding(key)
    expected = _values_and_grads(encoding, causal)
    monkeypatch.setattr(query_blocks, "needed", lambda q, k: True)
    monkeypatch.setattr(query_blocks, "GPU_DENSE_ELEMENTS", 2 * 2 * 12 * 5)
    assert query_blocks.rows_per_block(*qkv()[:2]) == 5
    got = _values_and_grads(encoding, causal)
    for a, b in zip(got, expected):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_blocks_take_their_rows_of_a_mask_of_explicit_positions_and_a_sink(monkeypatch):
    """A per-query mask is cut with its queries (a broadcast one is not), with explicit positions and a sink
    logit, as one pass gives them."""
    encoding = make_encoding("t5")
    mask = torch.rand(2, 1, 12, 12) > 0.3
    broadcast = torch.rand(1, 1, 1, 12) > 0.3
    positions = torch.randperm(30)[:12]
    sink = torch.tensor([0.5, -0.2], dtype=torch.float64, requires_grad=True)
    cases = [dict(mask=mask), dict(mask=broadcast), dict(q_positions=positions, k_positions=positions.flip(0)),
             dict(sink=sink)]
    expected = [_values_and_grads(encoding, True, **case) for case in cases]
    monkeypatch.setattr(query_blocks, "needed", lambda q, k: True)
    monkeypatch.setattr(query_blocks, "GPU_DENSE_ELEMENTS", 2 * 2 * 12 * 5)
    for case, wanted in zip(cases, expected):
        for a, b in zip(_values_and_grads(encoding, True, **case), wanted):
            if b is not None:
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_dense_mask_form_gives_way_to_blocks_past_the_budget(monkeypatch):
    """sdpa's float-mask form would hold (B, H, Tq, Tk): past the budget it is dropped, and where no other form
    serves, the dense path runs by blocks (CoPE, bidirectional: the mask form alone)."""
    encoding = make_encoding("cope")
    q, k, v = qkv(q_len=12, k_len=12)
    expected = posenc.attention(q, k, v, encoding, causal=False, backend="eager")
    monkeypatch.setattr(query_blocks, "needed", lambda q, k: True)
    monkeypatch.setattr(query_blocks, "GPU_DENSE_ELEMENTS", 2 * 2 * 12 * 5)
    calls = []
    original = query_blocks.by_query_blocks
    monkeypatch.setattr(query_blocks, "by_query_blocks", lambda *a: calls.append(a[2]) or original(*a))
    got = posenc.attention(q, k, v, encoding, causal=False, backend="sdpa")
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    assert calls == [5]
    key = dispatch.shape_key(type(encoding).__name__, q, k, v, causal=False, needs_grad=True)  # its parameters
    assert dispatch.chosen()[key] == "blocks"


def test_only_a_gpu_past_the_budget_needs_blocks():
    q = torch.empty(1, 16, 16384, 64, device="meta")
    assert not query_blocks.needed(torch.empty(1, 16, 16384, 64), torch.empty(1, 16, 16384, 64))  # CPU
    assert query_blocks._elements(q, q) == 16 * 16384 * 16384 > query_blocks.GPU_DENSE_ELEMENTS
    assert query_blocks.rows_per_block(q, q) == 1024
