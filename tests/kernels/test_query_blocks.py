"""Dense attention by query blocks (``kernels.query_blocks``), as a GPU runs it past its logits budget: here on CPU
tensors with ``needed`` switched on and the budget a few rows, against the one-pass dense path."""

from types import SimpleNamespace

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


def _on_a_gpu(*shape):
    """What ``needed`` reads of a CUDA tensor (its device and shape), where this machine has no GPU."""
    return SimpleNamespace(device=torch.device("cuda"), shape=shape)


def test_a_gpu_call_goes_by_blocks_only_past_the_budget_of_query_rows_times_keys():
    """(1, 16, 4,096) queries against 4,096 keys are 2^28 logits, the budget itself: one pass. One more query or
    key goes by blocks; the keys' heads (grouped-query) do not count, the queries' do."""
    assert query_blocks.GPU_DENSE_ELEMENTS == 16 * 4096 * 4096
    assert not query_blocks.needed(_on_a_gpu(1, 16, 4096, 64), _on_a_gpu(1, 4, 4096, 64))
    assert query_blocks.needed(_on_a_gpu(1, 16, 4097, 64), _on_a_gpu(1, 4, 4096, 64))
    assert query_blocks.needed(_on_a_gpu(1, 16, 4096, 64), _on_a_gpu(1, 4, 4097, 64))
    assert query_blocks.needed(_on_a_gpu(2, 8, 4097, 64), _on_a_gpu(2, 8, 4096, 64))


def test_a_block_is_as_many_rows_as_fit_the_budget_and_never_none():
    meta = dict(device="meta")
    assert query_blocks.rows_per_block(torch.empty(1, 1, 8, 4, **meta), torch.empty(1, 1, 1, 4, **meta)) == (
        query_blocks.GPU_DENSE_ELEMENTS)
    assert query_blocks.rows_per_block(torch.empty(1, 1, 8, 4, **meta), torch.empty(1, 1, 3, 4, **meta)) == (
        query_blocks.GPU_DENSE_ELEMENTS // 3)
    beyond = query_blocks.GPU_DENSE_ELEMENTS + 1  # one query row's logits already past the budget
    assert query_blocks.rows_per_block(torch.empty(1, 1, 8, 4, **meta), torch.empty(1, 1, beyond, 4, **meta)) == 1


def test_without_gradients_each_block_is_attended_once_and_joined_in_order():
    """Under no_grad there is nothing to recompute: each block of rows is attended as is (the last one short)."""
    q = torch.arange(2 * 7 * 3.0).reshape(2, 1, 7, 3)
    seen = []

    def attend(rows, block):
        seen.append(rows)
        return block * (rows.start + 1)

    with torch.no_grad():
        out = query_blocks.by_query_blocks(attend, q, 3)
    assert seen == [slice(0, 3), slice(3, 6), slice(6, 9)]
    assert torch.equal(out, torch.cat([q[:, :, :3], 4 * q[:, :, 3:6], 7 * q[:, :, 6:]], dim=2))
