"""``attention()``'s own branches, each against a written-out formula or an exact message: a window with a logit
scale or a caller's mask, one side's positions given, a positioned encoding's checks, the plain causal path with
grouped heads and a scale, Shaw's band in float64, and the refusals' words."""

import contextlib

import pytest
import torch

import posenc
from posenc.attention import attention_weights, choose_backend
from posenc.kernels import dispatch
from tests.helpers import seeded_randn as randn
from tests.oracles import dense_attention as formula

HEADS, WIDTH = 4, 8


def rotated(q, k, q_pos, k_pos):
    rope = posenc.build("rope", head_dim=WIDTH)
    return rope.rotate(q, k, q_pos, k_pos)


@pytest.mark.parametrize(("window", "chunk"), [(3, None), (None, 4)])
def test_a_window_or_chunk_with_a_scale_other_than_one_over_root_width(window, chunk):
    """RoPE at its own positions takes the blockwise local path on sdpa; the scale must reach it."""
    q, k, v = (randn(1, HEADS, 9, WIDTH, seed=s) for s in range(3))
    pos = torch.arange(9)
    offset = pos[:, None] - pos[None, :]
    allowed = (offset >= 0) & ((offset < window) if window else (pos[:, None] // chunk == pos[None, :] // chunk))
    rq, rk = rotated(q, k, pos[None], pos[None])
    expected = formula(rq, rk, v, scale=0.3, allowed=allowed)
    got = posenc.attention(q, k, v, posenc.build("rope", head_dim=WIDTH), backend="sdpa", scale=0.3, window=window,
                           chunk=chunk)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_a_window_keeps_the_callers_mask(backend):
    q, k, v = (randn(1, HEADS, 8, WIDTH, seed=s) for s in range(3))
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    mask[..., 5, 4] = mask[..., 7, 6] = False
    pos = torch.arange(8)
    offset = pos[:, None] - pos[None, :]
    allowed = (offset >= 0) & (offset < 3) & mask[0, 0]
    got = posenc.attention(q, k, v, backend=backend, window=3, mask=mask, scale=0.5)
    torch.testing.assert_close(got, formula(q, k, v, scale=0.5, allowed=allowed), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("given", ["q", "k"])
@pytest.mark.parametrize("backend", ["sdpa", "eager", "sdpa, table form forced"])
def test_one_sides_positions_with_the_others_default(given, backend):
    """ALiBi with query positions 2, 6, 7 over keys 0..7 (or keys at 0, 2, .., 14, the queries at the last three of
    them, 10, 12, 14): neither is the contiguous layout, so no fast path may assume it; forcing the offset-table form
    (which assumes it) must leave the call to a form that serves."""
    alibi = posenc.build("alibi", num_heads=HEADS).double()
    slopes = torch.tensor(alibi.slope_values, dtype=torch.float64).view(1, -1, 1, 1)
    if given == "q":
        q_pos, k_pos = torch.tensor([2, 6, 7]), torch.arange(8)
        kwargs = {"q_positions": q_pos}
    else:
        q_pos, k_pos = torch.arange(10, 16, 2), torch.arange(0, 16, 2)
        kwargs = {"k_positions": k_pos}
    q, k, v = randn(1, HEADS, 3, WIDTH, seed=0), randn(1, HEADS, 8, WIDTH, seed=1), randn(1, HEADS, 8, WIDTH, seed=2)
    offset = q_pos[:, None] - k_pos[None, :]
    expected = formula(q, k, v, scale=0.5, allowed=offset >= 0, bias=-slopes * offset)
    with dispatch.force("table") if backend.endswith("forced") else contextlib.nullcontext():
        got = posenc.attention(q, k, v, alibi, backend=backend.split(",")[0], scale=0.5, **kwargs)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_a_positioned_encodings_checks_say_what_is_wrong():
    alibi = posenc.build("alibi", num_heads=HEADS)
    q, k = torch.zeros(1, HEADS, 4, WIDTH), torch.zeros(1, HEADS, 5, WIDTH)
    with pytest.raises(ValueError, match=r"^pass positions either to encoding\.at\(\.\.\.\) or to attention\(\), not both$"):
        posenc.attention(q, k, k, alibi.at(torch.arange(1, 5), torch.arange(5)), q_positions=torch.arange(1, 5))
    with pytest.raises(ValueError, match=r"^the positioned encoding has 3 query and 5 key positions but the tensors "
                                         r"have Tq=4 and Tk=5$"):
        posenc.attention(q, k, k, alibi.at(torch.arange(2, 5), torch.arange(5)))
    with pytest.raises(ValueError, match=r"has 4 query and 6 key positions but the tensors have Tq=4 and Tk=5$"):
        posenc.attention(q, k, k, alibi.at(torch.arange(2, 6), torch.arange(6)))
    with pytest.raises(ValueError, match="mask"):
        posenc.attention(q, k, k, alibi.at(torch.arange(1, 5), torch.arange(5)),
                         mask=torch.ones(1, HEADS, 4, 4, dtype=torch.bool))


@pytest.mark.parametrize(("q_len", "kv_heads"), [(4, 2), (2, 2)], ids=["Tk = H", "Tq = Hkv"])
def test_the_plain_causal_path_with_grouped_heads_and_a_scale(q_len, kv_heads):
    """NoPE at its own positions runs SDPA's causal path; lengths equal to head counts, a scale not 1/√Dh."""
    q = randn(1, HEADS, q_len, WIDTH, seed=0)
    k, v = randn(1, kv_heads, q_len, WIDTH, seed=1), randn(1, kv_heads, q_len, WIDTH, seed=2)
    allowed = torch.ones(q_len, q_len, dtype=torch.bool).tril()
    got = posenc.attention(q, k, v, backend="sdpa", scale=0.9)
    torch.testing.assert_close(got, formula(q, k, v, scale=0.9, allowed=allowed), rtol=1e-12, atol=1e-12)


def test_shaws_band_runs_in_float64_for_float64_inputs():
    shaw = posenc.build("shaw", head_dim=WIDTH, num_heads=HEADS).double()
    with torch.no_grad():
        for parameter in shaw.parameters():
            parameter.normal_(0, 0.7, generator=torch.Generator().manual_seed(4))
    q, k, v = (randn(1, HEADS, 12, WIDTH, seed=s) for s in range(3))
    torch.testing.assert_close(posenc.attention(q, k, v, shaw, backend="sdpa"),
                               posenc.attention(q, k, v, shaw, backend="eager"), rtol=1e-13, atol=1e-13)


def test_auto_with_a_sink_runs_eager_where_sdpa_cannot():
    shaw = posenc.build("shaw", head_dim=WIDTH, num_heads=HEADS)
    q = torch.zeros(1, HEADS, 3, WIDTH)
    assert choose_backend("auto", shaw, q, q, q) == "sdpa"
    assert choose_backend("auto", shaw, q, q, q, sink=True) == "eager"


@pytest.mark.parametrize(("name", "backend", "kwargs", "message"), [
    ("shaw", "sdpa", {"sink": True}, "its value-side term is outside SDPA's softmax(QKᵀ+mask)·V; use backend='eager'"),
    ("alibi", "flex", {"sink": True}, "a sink logit is one more key, outside a score_mod; use backend='sdpa' or 'eager'"),
    ("shaw", "flex", {}, "its content-position terms are not a score_mod; use backend='eager'"),
    ("transformer_xl", "flex", {}, "its content-position terms are not a score_mod; use backend='sdpa' or 'eager'"),
    ("alibi", "flex", {"grad": True}, "FlexAttention has no backward pass on CPU; use backend='sdpa' or 'eager'"),
])
def test_each_refusal_in_its_words(name, backend, kwargs, message):
    encoding = posenc.build(name, num_heads=HEADS, **({} if name == "alibi" else {"head_dim": WIDTH}))
    q = torch.zeros(1, HEADS, 3, WIDTH, requires_grad=kwargs.get("grad", False))
    expected = f"backend={backend!r} cannot serve {type(encoding).__name__}: {message}"
    with pytest.raises(ValueError) as error:
        choose_backend(backend, encoding, q, q, q, sink=kwargs.get("sink", False))
    assert str(error.value) == expected


def test_attention_weights_check_a_positioned_encodings_mask():
    alibi = posenc.build("alibi", num_heads=HEADS)
    q = torch.zeros(1, HEADS, 4, WIDTH)
    with pytest.raises(ValueError, match="mask"):
        attention_weights(q, q, alibi.at(torch.arange(4), torch.arange(4)), mask=torch.ones(2, 1, 4, 4, dtype=torch.bool))
