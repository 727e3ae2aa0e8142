"""The blockwise kernel where mutation testing found no test: grouped heads whose counts meet the lengths, the
path each problem takes (fused forward and backward, or query blocks), dtypes in and out, channel inputs
without a gradient, Transformer-XL's shifted queries, and each error message's numbers."""

import pytest
import torch

from posenc.kernels import band, blockwise
from tests.kernels.test_blockwise import output_and_grads, reference

NONE = torch.zeros(1, 1, 1, 0, dtype=torch.float64)


def randn(generator, *shape):
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("q_len, k_len, causal", [(4, 4, True), (2, 5, False)],
                         ids=["keys-as-many-as-heads", "queries-as-many-as-kv-heads"])
def test_grouped_heads_where_a_length_equals_a_head_count(q_len, k_len, causal):
    """H = 4 query heads over Hkv = 2: with Tk = H, or Tq = Hkv, a check that read a length for a head count
    would skip the repeat (or repeat by the wrong count)."""
    g = torch.Generator().manual_seed(11)
    q, k, v = randn(g, 1, 4, q_len, 8), randn(g, 1, 2, k_len, 8), randn(g, 1, 2, k_len, 8)
    bias = randn(g, 1, 4, q_len, k_len)
    upstream = randn(g, 1, 4, q_len, 8)
    got = output_and_grads(lambda q, k, v, b: blockwise.blockwise_attention(q, k, v, b, scale=0.4, causal=causal,
                                                                            block=3), upstream, q, k, v, bias)
    allowed = torch.ones(q_len, k_len, dtype=torch.bool).tril() if causal else torch.ones(q_len, k_len, dtype=torch.bool)
    expected = output_and_grads(lambda q, k, v, b: reference(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), b.masked_fill(~allowed, float("-inf")), NONE, NONE,
        0.4), upstream, q, k, v, bias)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


class Paths:
    """Which of the kernel's paths ran: the fused flash forward, the query blocks, and any blockwise scores
    (built in the forward's block path and in the hand-written backward)."""

    def __init__(self, monkeypatch):
        self.fused, self.blocks, self.scores = 0, 0, 0
        fused, blocks, scores = blockwise.cpu_flash.forward, blockwise._forward_in_blocks, blockwise._Scores

        def count_fused(*args, **kwargs):
            self.fused += 1
            return fused(*args, **kwargs)

        def count_blocks(*args, **kwargs):
            self.blocks += 1
            return blocks(*args, **kwargs)

        def count_scores(*args, **kwargs):
            self.scores += 1
            return scores(*args, **kwargs)

        monkeypatch.setattr(blockwise.cpu_flash, "forward", count_fused)
        monkeypatch.setattr(blockwise, "_forward_in_blocks", count_blocks)
        monkeypatch.setattr(blockwise, "_Scores", count_scores)


@pytest.mark.parametrize("value_dim, fused", [(4, True), (6, False), (2, False), (5, False)],
                         ids=["q-and-v-one-width", "v-wider", "v-as-wide-as-heads", "v-as-wide-as-keys"])
def test_the_fused_kernel_serves_exactly_when_q_and_v_have_one_width(monkeypatch, value_dim, fused):
    """H = 2, Dh = 4, T = 5, so a width compared with a head count or a length instead takes the wrong path."""
    paths = Paths(monkeypatch)
    g = torch.Generator().manual_seed(12)
    q, k, v = randn(g, 1, 2, 5, 4), randn(g, 1, 2, 5, 4), randn(g, 1, 2, 5, value_dim)
    blockwise.blockwise_attention(q, k, v, randn(g, 1, 2, 5, 5), scale=0.5, causal=True)
    assert (paths.fused, paths.blocks) == ((1, 0) if fused else (0, 1))


def test_a_bias_without_a_gradient_builds_no_blockwise_scores_in_the_backward(monkeypatch):
    paths = Paths(monkeypatch)
    g = torch.Generator().manual_seed(13)
    q, k, v = (randn(g, 1, 2, 6, 4).requires_grad_() for _ in range(3))
    blockwise.blockwise_attention(q, k, v, randn(g, 1, 2, 6, 6), scale=0.5, causal=True).sum().backward()
    assert (paths.fused, paths.scores) == (1, 0)
    bias = randn(g, 1, 2, 6, 6).requires_grad_()
    blockwise.blockwise_attention(q, k, v, bias, scale=0.5, causal=True).sum().backward()
    assert (paths.fused, paths.scores) == (2, 1)  # the bias's gradient needs the hand-written backward


@pytest.mark.parametrize("value_dim", [8, 6], ids=["fused", "blocks"])
def test_bfloat16_comes_back_in_bfloat16_from_either_path(value_dim):
    q, k = (torch.randn(1, 2, 9, 8, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(1, 2, 9, value_dim, dtype=torch.bfloat16)
    out = blockwise.blockwise_attention(q, k, v, torch.zeros(1, 2, 9, 9), scale=0.3, causal=True)
    assert out.dtype == torch.bfloat16


def test_a_float64_bias_on_float32_inputs_is_cast_to_their_compute_dtype():
    g = torch.Generator().manual_seed(14)
    q, k, v = (randn(g, 1, 2, 7, 4).float().requires_grad_() for _ in range(3))
    bias = randn(g, 1, 2, 7, 7)
    got, want = (output_and_grads(lambda q, k, v: blockwise.blockwise_attention(q, k, v, b, scale=0.5, causal=True),
                                  torch.ones(1, 2, 7, 4), q, k, v) for b in (bias, bias.float()))
    for a, b in zip(got, want, strict=True):  # forward and the fused backward
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_channel_inputs_without_a_gradient_get_none_and_the_others_theirs():
    """ChannelBlocks built from two inputs, one trained and one fixed: the trained one's gradient equals autograd
    through the full channels, the fixed one gets none."""
    g = torch.Generator().manual_seed(15)
    q, k, v = randn(g, 1, 2, 6, 4), randn(g, 1, 2, 6, 4), randn(g, 1, 2, 6, 5)
    weight, fixed = randn(g, 2, 3).requires_grad_(), randn(g, 6, 3)
    k_channels = randn(g, 1, 1, 6, 3)

    def build(start, end, weight, fixed):  # (1, H, end − start, 3)
        return (weight[:, None, :] * fixed[None, start:end, :])[None]

    lazy = blockwise.ChannelBlocks(build, (weight, fixed), length=6, width=3)
    out = blockwise.blockwise_attention(q, k, v, scale=0.5, causal=True, q_channels=lazy, k_channels=k_channels, block=4)
    (got,) = torch.autograd.grad(out.sum(), weight)
    causal = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    want_out = reference(q, k, v, causal, build(0, 6, weight, fixed), k_channels, 0.5)
    (want,) = torch.autograd.grad(want_out.sum(), weight)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-10)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert lazy.full().shape == (1, 2, 6, 3)
    torch.testing.assert_close(lazy.full(), build(0, 6, weight, fixed), rtol=0, atol=0)


def test_shifted_queries_add_one_vector_per_head():
    g = torch.Generator().manual_seed(16)
    q, shift = randn(g, 2, 3, 4, 5), randn(g, 3, 5)
    full = blockwise.ShiftedQueries(q, shift).full()
    for h in range(3):
        torch.testing.assert_close(full[:, h], q[:, h] + shift[h], rtol=0, atol=0)


@pytest.mark.parametrize("call, message", [
    (lambda q: blockwise.blockwise_attention(q, q, q, torch.zeros(1, 2, 5, 4), scale=1.0),
     r"bias must be \(B or 1, H or 1, Tq, Tk\) = \(2, 2, 5, 5\), got \(1, 2, 5, 4\)"),
    (lambda q: blockwise.blockwise_attention(q, q, q, scale=1.0, q_shift=torch.zeros(3, 4)),
     r"q_shift must be \(H, Dh\) = \(2, 4\), got \(3, 4\)"),
    (lambda q: blockwise.blockwise_attention(q[:, :, :2], q, q, scale=1.0, causal=True),
     r"causal needs as many queries as keys, got Tq=2 and Tk=5"),
    (lambda q: blockwise.blockwise_attention(q, q, q, scale=1.0, q_channels=q),
     r"^q_channels and k_channels go together, shaped \(B or 1, H, Tq, C\) and \(B or 1, 1, Tk, C\): got"),
])
def test_error_messages_carry_the_expected_shapes(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(2, 2, 5, 4))


def test_the_band_kernel_without_a_floor_adds_zeros():
    g = torch.Generator().manual_seed(17)
    q, k, v = randn(g, 1, 2, 7, 4), randn(g, 1, 2, 7, 4), randn(g, 1, 2, 7, 6)
    key_band, value_band = randn(g, 3, 4), randn(g, 3, 6)
    got = band.band_attention(q, k, v, key_band, value_band, scale=0.5, block=3)
    want = band.band_attention(q, k, v, key_band, value_band, torch.zeros(6, dtype=torch.float64), scale=0.5, block=3)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
