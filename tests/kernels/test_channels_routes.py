"""``kernels.channels`` called directly: each route's values against a float64 formula, and which route and
widths serve.

``test_channels.py`` checks the channel form through ``attention()``, where softmax forgets a constant added to
every score of a query and either route gives the same output; here the routes are told apart by a spy, and the
widths SDPA is called with (all three equal, so that the CPU flash kernel can serve) are pinned.
"""

import pytest
import torch
import torch.nn.functional as F

from posenc.kernels import blockwise
from posenc.kernels import channels as channels_module
from posenc.kernels.channels import attend_with_channels, flash_width, materialized, sdpa_with_channels
from tests.helpers import seeded_randn as randn
from tests.oracles import dense_attention


def reference(q, k, v, *, scale, q_channels=None, k_channels=None, allowed=None, causal=False):
    """softmax(scale·(q·kᵀ + q_channels·k_channelsᵀ)) over the allowed keys (all earlier ones when causal), times v,
    in float64."""
    bias = None if q_channels is None else scale * q_channels @ k_channels.transpose(-1, -2)
    if causal:
        allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
    return dense_attention(q, k, v, scale=scale, allowed=allowed, bias=bias)


@pytest.fixture
def sdpa_calls(monkeypatch):
    """The (q, k, v) widths and ``enable_gqa`` of every SDPA call."""
    calls, original = [], F.scaled_dot_product_attention

    def recording(q, k, v, **kwargs):
        calls.append(((q.shape[-1], k.shape[-1], v.shape[-1]), kwargs["enable_gqa"]))
        return original(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


@pytest.fixture
def routes(monkeypatch):
    """Which route served each ``attend_with_channels`` call, and the query channels the blockwise kernel got."""
    served = []
    original_sdpa, original_blockwise = channels_module.sdpa_with_channels, blockwise.blockwise_attention

    def via_sdpa(*args, **kwargs):
        served.append(("sdpa", None))
        return original_sdpa(*args, **kwargs)

    def via_blockwise(*args, **kwargs):
        served.append(("blockwise", kwargs["q_channels"]))
        return original_blockwise(*args, **kwargs)

    monkeypatch.setattr(channels_module, "sdpa_with_channels", via_sdpa)
    monkeypatch.setattr(blockwise, "blockwise_attention", via_blockwise)
    return served


@pytest.mark.parametrize(("width", "cuda", "expected"), [
    (33, False, 33), (33, True, 40), (40, True, 40), (41, True, 48), (1, True, 8), (7, False, 7)])
def test_flash_width_rounds_up_to_eight_on_cuda_only(width, cuda, expected):
    assert flash_width(width, cuda=cuda) == expected


@pytest.mark.parametrize(("heads", "q_len", "q_width", "value_width"), [
    (3, 5, 11, 6), (3, 5, 6, 11), (3, 5, 9, 9), (13, 14, 6, 11)],
    ids=["q wider", "v wider", "equal", "v wider, more heads and queries than widths"])
def test_sdpa_with_channels_pads_to_one_width_and_keeps_the_values(sdpa_calls, heads, q_len, q_width, value_width):
    """Shapes distinct from the widths (B 1, Tk 7), so a wrong axis shows; padding with zeros changes no score
    and no output column, and v's padding is cut off."""
    q = randn(1, heads, q_len, q_width, seed=0)
    k, v = randn(1, heads, 7, q_width, seed=1), randn(1, heads, 7, value_width, seed=2)
    allowed = randn(q_len, 7, seed=3) > -0.5
    allowed[:, 0] = True
    out = sdpa_with_channels(q, k, v, scale=0.3, is_causal=False, attn_mask=allowed)
    assert out.shape == (1, heads, q_len, value_width)
    torch.testing.assert_close(out, reference(q, k, v, scale=0.3, allowed=allowed), rtol=1e-12, atol=1e-12)
    width = max(q_width, value_width)
    assert sdpa_calls == [((width, width, width), False)]


@pytest.mark.parametrize("value_width", [6, 10])
def test_sdpa_with_channels_groups_heads_when_a_length_equals_a_head_count(sdpa_calls, value_width):
    """H 4 query heads on Hkv 2 key heads, with Tk = H and Tq = Hkv, so that comparing a length where a head count
    belongs gives the wrong ``enable_gqa``."""
    q, k, v = randn(2, 4, 2, 8, seed=0), randn(2, 2, 4, 8, seed=1), randn(2, 2, 4, value_width, seed=2)
    out = sdpa_with_channels(q, k, v, scale=0.5, is_causal=False)
    torch.testing.assert_close(out, reference(q, k, v, scale=0.5), rtol=1e-12, atol=1e-12)
    assert sdpa_calls == [((max(8, value_width),) * 3, True)]


def test_sdpa_with_channels_causal():
    q, k, v = randn(1, 2, 6, 5, seed=0), randn(1, 2, 6, 5, seed=1), randn(1, 2, 6, 3, seed=2)
    torch.testing.assert_close(sdpa_with_channels(q, k, v, scale=0.4, is_causal=True),
                               reference(q, k, v, scale=0.4, causal=True), rtol=1e-12, atol=1e-12)


def channel_blocks(query_side):
    """``ChannelBlocks`` that build ``query_side`` (B or 1, H, Tq, C) block by block, as a product of its input."""
    return blockwise.ChannelBlocks(build=lambda start, end, x: 2.0 * x[:, :, start:end], inputs=(query_side / 2,),
                                   length=query_side.shape[2], width=query_side.shape[-1])


def test_materialized_builds_blocks_adds_shifts_and_keeps_tensors():
    query_side, q, shift = randn(1, 3, 5, 4, seed=0), randn(2, 3, 5, 4, seed=1), randn(3, 4, seed=2)
    assert materialized(query_side) is query_side
    torch.testing.assert_close(materialized(channel_blocks(query_side)), query_side, rtol=0, atol=0)
    torch.testing.assert_close(materialized(blockwise.ShiftedQueries(q, shift)), q + shift[None, :, None, :],
                               rtol=0, atol=0)


# C extra channels against Dv = 8 value columns: more channels than v is wide goes blockwise on CPU, else SDPA.
# B 1, H 3, Hkv 3, Tq = Tk 7, Dh 5: no length or head count equals a width, so a wrong axis changes the route.
ROUTES = [(12, "blockwise"), (8, "sdpa"), (6, "sdpa")]


@pytest.mark.parametrize(("extra", "route"), ROUTES)
@pytest.mark.parametrize("side", ["tensor", "blocks"])
@pytest.mark.parametrize("mask", ["none", "causal", "allowed"])
def test_attend_with_channels_route_and_values(routes, extra, route, side, mask):
    content, shift = randn(1, 3, 7, 5, seed=0), randn(3, 5, seed=1)
    k, v = randn(1, 3, 7, 5, seed=2), randn(1, 3, 7, 8, seed=3)
    query_side, key_side = randn(1, 3, 7, extra, seed=4), randn(1, 1, 7, extra, seed=5)
    allowed = (randn(1, 1, 7, 7, seed=6) > -0.3) | torch.eye(7, dtype=torch.bool) if mask == "allowed" else None
    out = attend_with_channels(blockwise.ShiftedQueries(content, shift), k, v,
                               channel_blocks(query_side) if side == "blocks" else query_side, key_side, scale=0.35,
                               is_causal=mask == "causal", allowed=allowed)
    expected = reference(content + shift[None, :, None, :], k, v, scale=0.35, q_channels=query_side,
                         k_channels=key_side, allowed=allowed, causal=mask == "causal")
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    assert [name for name, _ in routes] == [route]


def test_attend_with_channels_under_compile_hands_the_blockwise_kernel_built_channels(routes, monkeypatch):
    """Under ``torch.compile`` the kernel gets every query's channels at once, not blocks to rebuild."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    content, k, v = randn(1, 3, 7, 5, seed=0), randn(1, 3, 7, 5, seed=1), randn(1, 3, 7, 4, seed=2)
    query_side, key_side = randn(1, 3, 7, 12, seed=3), randn(1, 1, 7, 12, seed=4)
    out = attend_with_channels(content, k, v, channel_blocks(query_side), key_side, scale=0.35, is_causal=True)
    torch.testing.assert_close(out, reference(content, k, v, scale=0.35, q_channels=query_side,
                                              k_channels=key_side, causal=True), rtol=1e-10, atol=1e-10)
    [(name, handed)] = routes
    assert name == "blockwise" and isinstance(handed, torch.Tensor)
    torch.testing.assert_close(handed, query_side, rtol=0, atol=0)
