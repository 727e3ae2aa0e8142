"""One position convention across the public API: every encoding method that takes positions (``at``,
``rotate``, ``score_bias``, ``embed``) accepts (T,) and (B or 1, T) alike, as ``attention()`` does, and refuses
any other shape in one line naming the shapes it wants."""

import re

import pytest
import torch

import posenc
from posenc.encodings import ENCODINGS, build_for_model

HEADS, HEAD_DIM, LENGTH = 2, 8, 6
SIZES = dict(dim=HEAD_DIM, head_dim=HEAD_DIM, num_heads=HEADS, max_positions=16)


def every_encoding():
    return [build_for_model(name, sizes=SIZES).double() for name in ENCODINGS]


def qk():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, HEADS, LENGTH, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(2))


def test_the_readmes_positions_work_in_rotate_and_at_too():
    rope = posenc.build("rope", head_dim=HEAD_DIM)
    q, k = qk()
    flat = torch.arange(3, 3 + LENGTH)
    for got, want in zip(rope.rotate(q, k, flat, flat), rope.rotate(q, k, flat[None], flat[None])):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert (rope.rotate(q, k, flat, flat)[0] - q).abs().max() > 0.1  # it did turn them
    at = rope.at(flat, flat)
    assert at.q_pos.shape == at.k_pos.shape == (1, LENGTH)


@pytest.mark.parametrize("encoding", every_encoding(), ids=list(ENCODINGS))
def test_every_position_taking_method_accepts_t_and_one_t_alike(encoding):
    q, k = qk()
    flat, batched = torch.arange(LENGTH), torch.arange(LENGTH)[None]
    with torch.no_grad():
        assert encoding.at(flat, flat).q_pos.shape == encoding.at(batched, batched).q_pos.shape == (1, LENGTH)
        for got, want in zip(encoding.rotate(q, k, flat, flat), encoding.rotate(q, k, batched, batched)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        if encoding.has_bias and not encoding.has_token_gates:  # FoX's bias reads its tokens' gates, not positions
            torch.testing.assert_close(encoding.score_bias(flat, flat, torch.float64),
                                       encoding.score_bias(batched, batched, torch.float64), rtol=0, atol=0)
        if encoding.has_input:
            x = torch.randn(1, LENGTH, HEAD_DIM, dtype=torch.float64)
            torch.testing.assert_close(encoding.embed(x, flat), encoding.embed(x, batched), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["rope", "alibi", "fire", "sandwich"])
def test_other_shapes_are_refused_in_one_line(name):
    encoding = build_for_model(name, sizes=SIZES)
    cube = torch.zeros(1, 1, LENGTH, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"q_pos must have shape \(T,\) or \(B or 1, T\), got \(1, 1, 6\)"):
        encoding.score_bias(cube, cube) if encoding.has_bias else encoding.at(cube, cube)


def refused(message: str):
    return pytest.raises(ValueError, match="^" + re.escape(message) + "$")


def test_rotate_refuses_what_attention_refuses_instead_of_a_wrong_rotation():
    """Each of these once returned an answer: a 3-D q rotated against the wrong axis, a wider Dh rotated in its
    first channels only, integer q truncated, float positions turned."""
    rope = posenc.build("rope", head_dim=HEAD_DIM)
    q, k = qk()
    pos = torch.arange(LENGTH)
    with refused("q must be a 4-D floating-point tensor (B, H, T, Dh), got torch.float64 (2, 6, 8)"):
        rope.rotate(q[0], k, pos, pos)
    with refused("the encoding was built for head_dim=8 but k has Dh=16"):
        rope.rotate(q, torch.cat((k, k), dim=-1), pos, pos)
    with refused("q must be a 4-D floating-point tensor (B, H, T, Dh), got torch.int64 (1, 2, 6, 8)"):
        rope.rotate(q.long(), k, pos, pos)
    with refused("q and k must share the batch B, got 1 and 3"):
        rope.rotate(q, torch.cat((k, k, k)), pos, pos)
    with refused("k must be a 4-D floating-point tensor (B, H, T, Dh), got list ()"):
        rope.rotate(q, k.tolist(), pos, pos)
    with refused("k_pos must be an integer tensor, got torch.bool"):
        rope.rotate(q, k, pos, pos > 2)
    with refused("q_pos must be an integer tensor, got list"):
        rope.rotate(q, k, pos.tolist(), pos)
    with refused("q_pos must be an integer tensor, got torch.float32"):
        rope.rotate(q, k, pos.float(), pos)
    with refused("k_pos must have shape (5,) or (1, 5) to match k, got (6,)"):
        rope.rotate(q, k[:, :, :5], pos, pos)
    with refused("the encoding was built for head_dim=8 but q has Dh=4"):
        posenc.build("mrope", head_dim=HEAD_DIM).rotate(q[..., :4], k, pos[None, None], pos[None, None])
    back, ahead = rope.rotate(q, k, pos - 3, pos - 3), rope.rotate(q, k, pos + 7, pos + 7)
    torch.testing.assert_close(back[0] @ back[1].mT, ahead[0] @ ahead[1].mT)  # negative positions turn back


@pytest.mark.parametrize("name", ["sinusoidal", "learned"])
def test_embed_refuses_a_mismatched_input_by_name(name):
    encoding = build_for_model(name, sizes=SIZES)
    x, pos = torch.zeros(2, LENGTH, HEAD_DIM), torch.arange(LENGTH)
    with refused("the encoding was built for dim=8 but x has D=4"):
        encoding.embed(x[..., :4], pos)
    with refused("positions must have shape (5,) or (2, 5) to match x, got (6,)"):
        encoding.embed(x[:, :5], pos)
    with refused("positions must have shape (6,) or (2, 6) to match x, got (3, 6)"):
        encoding.embed(x, pos.expand(3, -1))
    with refused("x must be a 3-D floating-point tensor (B, T, D), got torch.float32 (6, 8)"):
        encoding.embed(x[0], pos)
    with refused("x must be a 3-D floating-point tensor (B, T, D), got list ()"):
        encoding.embed(x.tolist(), pos)
    with refused("positions must be >= 0, got minimum -1"):  # the learned table read row -1 from its end
        encoding.embed(x, pos - 1)
