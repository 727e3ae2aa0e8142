"""``attention_weights()`` and the sink path of ``attention()`` against a formula written out here, in float64:
explicit positions, a mask, a window, a chunk, a sink, a logit scale, bf16 inputs; and which backends ``serves``
names for a sink or a gradient."""

import pytest
import torch

import posenc
from posenc.attention import attention_weights, serves
from tests.helpers import seeded_randn as randn

HEADS, WIDTH = 2, 4


def alibi_weights(q, k, q_pos, k_pos, slopes, *, scale, allowed, sink=None):
    """softmax_j(scale·q_i·k_j − m_h·(q_pos_i − k_pos_j)) over the allowed keys (and a sink logit per head)."""
    logits = scale * q @ k.transpose(-1, -2) - slopes.view(1, -1, 1, 1) * (q_pos[:, None] - k_pos[None, :])
    logits = logits.masked_fill(~allowed, float("-inf"))
    if sink is not None:
        logits = torch.cat((logits, sink.view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)), dim=-1)
        return logits.softmax(-1)[..., :-1]
    return logits.softmax(-1)


@pytest.fixture
def alibi():
    return posenc.build("alibi", num_heads=HEADS).double()


def slopes_of(encoding):
    return torch.tensor(encoding.slope_values, dtype=torch.float64)


def test_explicit_positions_and_a_mask_reach_the_weights(alibi):
    """Queries at 10..13 over keys at 0, 3, 6, 9, 12: the bias reads these positions, causality compares them, and
    a mask removes one more pair."""
    q, k = randn(1, HEADS, 4, WIDTH, seed=0), randn(1, HEADS, 5, WIDTH, seed=1)
    q_pos, k_pos = torch.arange(10, 14), torch.arange(0, 15, 3)
    mask = torch.ones(1, 1, 4, 5, dtype=torch.bool)
    mask[0, 0, 2, 1] = False
    got = attention_weights(q, k, alibi, q_positions=q_pos, k_positions=k_pos, mask=mask, scale=0.7)
    allowed = (k_pos[None, :] <= q_pos[:, None]) & mask
    expected = alibi_weights(q, k, q_pos, k_pos, slopes_of(alibi), scale=0.7, allowed=allowed)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert got[0, :, 0, 4].eq(0).all() and got[0, :, 2, 1].eq(0).all()


def test_the_default_scale_is_one_over_root_width(alibi):
    q, k = randn(1, HEADS, 5, WIDTH, seed=0), randn(1, HEADS, 5, WIDTH, seed=1)
    pos = torch.arange(5)
    expected = alibi_weights(q, k, pos, pos, slopes_of(alibi), scale=WIDTH**-0.5,
                             allowed=torch.ones(5, 5, dtype=torch.bool).tril())
    torch.testing.assert_close(attention_weights(q, k, alibi), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("window", "chunk"), [(2, None), (None, 3)])
def test_a_window_or_a_chunk_joins_the_mask(alibi, window, chunk):
    q, k = randn(1, HEADS, 7, WIDTH, seed=0), randn(1, HEADS, 7, WIDTH, seed=1)
    pos = torch.arange(7)
    offset = pos[:, None] - pos[None, :]
    allowed = (offset >= 0) & ((offset < window) if window else (pos[:, None] // chunk == pos[None, :] // chunk))
    expected = alibi_weights(q, k, pos, pos, slopes_of(alibi), scale=0.5, allowed=allowed)
    got = attention_weights(q, k, alibi, scale=0.5, window=window, chunk=chunk)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_a_sink_takes_its_share_of_every_row(alibi):
    q, k = randn(1, HEADS, 5, WIDTH, seed=0), randn(1, HEADS, 5, WIDTH, seed=1)
    sink = torch.tensor([0.5, 2.0], dtype=torch.float64)
    pos = torch.arange(5)
    expected = alibi_weights(q, k, pos, pos, slopes_of(alibi), scale=0.5,
                             allowed=torch.ones(5, 5, dtype=torch.bool).tril(), sink=sink)
    got = attention_weights(q, k, alibi, scale=0.5, sink=sink)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert (got.sum(-1) < 1).all()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sink": torch.zeros(HEADS)}, "StickBreaking replaces the softmax, which a sink logit would join"),
    ({"window": 0}, "window"),
    ({"chunk": 0}, "chunk"),
    ({"causal": False}, "StickBreaking is causal only"),
])
def test_the_weights_refuse_what_attention_refuses(kwargs, message):
    q = randn(1, HEADS, 3, WIDTH, seed=0)
    with pytest.raises(ValueError, match=message):
        attention_weights(q, q, posenc.build("stick-breaking"), **kwargs)


def test_bf16_inputs_give_float32_weights_computed_from_float32_vectors():
    """RoPE on bf16 q and k: both are cast to float32 before the rotation, so the weights equal those of the same
    bf16 numbers given as float32."""
    rope = posenc.build("rope", head_dim=WIDTH)
    q, k = randn(1, HEADS, 6, WIDTH, seed=0, dtype=torch.bfloat16), randn(1, HEADS, 6, WIDTH, seed=1,
                                                                         dtype=torch.bfloat16)
    got = attention_weights(q, k, rope)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, attention_weights(q.float(), k.float(), rope), rtol=0, atol=0)


# -- sdpa with a sink: every score term, in float32 or float64, beside the sink ------------------------------

@pytest.mark.parametrize("name", ["kerple", "transformer_xl", "cope"])
@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_with_a_sink_equals_eager(name, masked):
    """Kerple's bias (no float32 number), Transformer-XL's scaled logits, CoPE's counts over the allowed keys."""
    kwargs = {"num_heads": HEADS} if name == "kerple" else {"head_dim": WIDTH} | (
        {"num_heads": HEADS} if name == "transformer_xl" else {})
    encoding = posenc.build(name, **kwargs).double()
    with torch.no_grad():
        for parameter in encoding.parameters():
            parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(3))
    q, k, v = (randn(2, HEADS, 6, WIDTH, seed=s) for s in range(3))
    sink = torch.tensor([0.3, -1.0], dtype=torch.float64)
    mask = (randn(2, 1, 6, 6, seed=4) > -0.3) | torch.eye(6, dtype=torch.bool) if masked else None
    got = posenc.attention(q, k, v, encoding, backend="sdpa", sink=sink, mask=mask, scale=0.8)
    expected = posenc.attention(q, k, v, encoding, backend="eager", sink=sink, mask=mask, scale=0.8)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_sdpa_with_a_sink_in_bf16_builds_its_terms_in_float32():
    encoding = posenc.build("transformer_xl", num_heads=HEADS, head_dim=8)
    q, k, v = (randn(1, HEADS, 6, 8, seed=s, dtype=torch.bfloat16) for s in range(3))
    sink = torch.tensor([0.3, -1.0])
    got = posenc.attention(q, k, v, encoding, backend="sdpa", sink=sink)
    assert got.dtype == torch.bfloat16
    expected = posenc.attention(*(t.double() for t in (q, k, v)), encoding.double(), backend="eager",
                                sink=sink.double())
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=0.03)


def test_serves_names_what_a_sink_or_a_gradient_rules_out():
    alibi = posenc.build("alibi", num_heads=HEADS)
    q = torch.zeros(1, HEADS, 3, WIDTH)
    assert serves("flex", alibi, q, q, q) and not serves("flex", alibi, q, q, q, sink=True)
    assert serves("sdpa", alibi, q, q, q, sink=True)
    trained = q.clone().requires_grad_()
    assert not serves("flex", alibi, trained, q, q)  # no FlexAttention backward on CPU
    with torch.no_grad():
        assert serves("flex", alibi, trained, q, q)
    shaw = posenc.build("shaw", head_dim=WIDTH, num_heads=HEADS)
    assert serves("sdpa", shaw, q, q, q) and not serves("sdpa", shaw, q, q, q, sink=True)
