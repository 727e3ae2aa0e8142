"""``PositionedEncoding`` (``encoding.at(q_pos, k_pos)``) and the base class's doors, directly.

The backends reach these through attention outputs, where one memoized table per call and one encoding per
test hide a table stored under the wrong key, a length read from the wrong axis, or a NaN reported as the wrong
term. Here each is asked for its own value.
"""

import inspect

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.encodings.base import NoPE, PositionalEncoding
from posenc.kernels.channels import widen
from tests.helpers import seeded_randn as randn

HEADS, HEAD_DIM = 3, 4


def fox():
    return posenc.build("fox", dim=6, num_heads=HEADS, num_layers=1).double()


def positions(length, start=0):
    return torch.arange(start, start + length)[None]


def log_gates(batch, length, seed=0):
    return F.logsigmoid(randn(batch, HEADS, length, seed=seed) + 1.0)


# -- the memo: one table per kind, dtype and argument --------------------------------------------------------

def test_every_memoized_table_is_kept_apart():
    """ALiBi at one set of positions, asked for each table in turn: each answer is its own kind, in its dtype."""
    at = posenc.build("alibi", num_heads=HEADS).at(positions(5, 3), positions(5, 3), contiguous=True)
    bias32 = at.score_bias(torch.float32)
    bias64 = at.score_bias(torch.float64)
    assert (bias32.dtype, bias64.dtype, bias32.shape) == (torch.float32, torch.float64, (1, HEADS, 5, 5))
    causal, full = at.offset_table(True, torch.float64), at.offset_table(False, torch.float64)
    assert (causal[1], causal[0].shape) == (0, (HEADS, 5))  # offsets 0..4
    assert (full[1], full[0].shape) == (-4, (HEADS, 9))  # offsets −4..4
    assert at.offset_table(True, torch.float32)[0].dtype == torch.float32
    assert at.channels_exact(torch.float32) is True and at.channels_exact(torch.float64) is True
    assert at.score_bias(torch.float32) is bias32 and at.offset_table(True, torch.float64) is causal
    new = at.new_tokens()
    assert at.new_tokens() is new and new.k_pos is at.q_pos


def test_new_tokens_keep_the_length_and_the_contiguous_promise():
    at = posenc.build("alibi", num_heads=HEADS).at(positions(2, 6), positions(8), seq_len=20, contiguous=True)
    new = at.new_tokens()
    assert (new.q_pos, new.k_pos, new.seq_len, new.contiguous) == (at.q_pos, at.q_pos, 20, True)


def test_fox_bias_dense_and_cumulative_kept_apart_and_equal_the_formula():
    """The dense gate bias D_ij = Σ_{j<l≤i} log f_l for the last Tq of Tk keys (Tq ≠ B), in the dtype asked, beside
    the cumulative gates it is made of."""
    encoding, gates = fox(), log_gates(2, 6)
    at = encoding.at(positions(4, 2), positions(6)).with_gates(gates)
    cumulative = at.cumulative_gates()
    bias = at.score_bias(torch.float32)
    assert cumulative.shape == (2, HEADS, 6) and bias.shape == (2, HEADS, 4, 6)
    assert bias.dtype == torch.float32 and at.score_bias(torch.float64).dtype == torch.float64
    expected = torch.zeros(2, HEADS, 4, 6, dtype=torch.float64)
    for i in range(4):
        for j in range(6):
            query = i + 2  # the queries are the last 4 keys
            expected[:, :, i, j] = gates[..., j + 1: query + 1].sum(-1) if j <= query else -gates[..., query + 1: j + 1].sum(-1)
    torch.testing.assert_close(at.score_bias(torch.float64), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cumulative, gates.cumsum(-1), rtol=1e-12, atol=1e-12)


def test_offset_lookup_parts_in_the_dtype_asked_and_built_once_per_key_count():
    encoding = posenc.build("transformer_xl", num_heads=HEADS, head_dim=HEAD_DIM)
    at = encoding.at(positions(5), positions(5), contiguous=True)
    table, content, position = at.offset_lookup_parts(5, torch.float64)
    assert table.shape == (HEADS, 5, HEAD_DIM) and table.dtype == torch.float64
    assert content.dtype == position.dtype == torch.float64
    torch.testing.assert_close(content, encoding.content_bias.double(), rtol=0, atol=0)
    torch.testing.assert_close(position, encoding.position_bias.double(), rtol=0, atol=0)
    assert at.offset_lookup_parts(5, torch.float64)[0] is table
    assert at.offset_lookup_parts(7, torch.float64)[0].shape == (HEADS, 7, HEAD_DIM)
    assert at.offset_lookup_parts(5, torch.float32)[0].dtype == torch.float32


def test_an_empty_query_block_has_an_offset_table():
    at = posenc.build("alibi", num_heads=HEADS).at(positions(0), positions(4), contiguous=True)
    table, lowest = at.offset_table(False, torch.float32)
    assert table.shape == (HEADS, 3 - lowest + 1)  # offsets lowest..Tk − 1


def test_channels_exact_takes_the_callers_contiguous_promise():
    """Eight contiguous keys span 7 positions whatever their values; read from the values, the same positions at
    2^30 apart are far past float32's channel limit."""
    encoding = posenc.build("alibi", num_heads=HEADS)
    far = torch.arange(8)[None] * 2**30
    assert encoding.at(far, far, contiguous=True).channels_exact(torch.float32) is True
    assert encoding.at(far, far).channels_exact(torch.float32) is False


# -- derived positioned encodings keep what they should ------------------------------------------------------

def test_unmemoized_keeps_positions_length_rotation_and_detached_gates():
    encoding, gates = fox(), log_gates(1, 5).requires_grad_()
    at = encoding.at(positions(5), positions(5), seq_len=40, contiguous=True).with_gates(gates).after_rotation()
    at.score_bias(torch.float64)
    fresh = at.unmemoized()
    assert (fresh.seq_len, fresh.contiguous, fresh.rotated) == (40, True, True)
    assert fresh._memo == {} and fresh.q_pos is at.q_pos and fresh.k_pos is at.k_pos
    assert not fresh.log_forget.requires_grad
    torch.testing.assert_close(fresh.log_forget, gates.detach(), rtol=0, atol=0)
    q = randn(1, HEADS, 5, HEAD_DIM)
    assert fresh.rotate(q, q)[0] is q  # rotated: the q/k door is not opened twice


def test_after_rotation_shares_the_tables_and_gates():
    encoding, gates = fox(), log_gates(1, 5)
    at = encoding.at(positions(5), positions(5), seq_len=9).with_gates(gates)
    bias = at.score_bias(torch.float64)
    done = at.after_rotation()
    assert done.rotated and not at.rotated and done.seq_len == 9
    assert done.score_bias(torch.float64) is bias and done.log_forget is gates


def test_with_gates_keeps_the_length_and_the_rotation():
    at = fox().at(positions(5), positions(5), seq_len=33, contiguous=True).after_rotation()
    gated = at.with_gates(log_gates(1, 5))
    assert (gated.seq_len, gated.contiguous, gated.rotated) == (33, True, True)
    assert gated.context_length() == 33


@pytest.mark.parametrize(("q_len", "k_len", "gates", "message"), [
    (3, 5, lambda: log_gates(1, 5)[:, :2], "log_forget must be \\(B, 3, Tk=5\\).*got \\(1, 2, 5\\)"),
    (3, 5, lambda: log_gates(1, 4), "got \\(1, 3, 4\\)"),
    (3, 5, lambda: log_gates(1, 5)[0], "got \\(3, 5\\)"),
    (6, 5, lambda: log_gates(1, 5), "the last Tq=6 of the keys, got \\(1, 3, 5\\)"),
    (3, 5, lambda: [0.0] * 5, "got list"),
], ids=["heads", "keys", "no batch", "more queries than keys", "not a tensor"])
def test_with_gates_refuses_a_wrong_shape_naming_it(q_len, k_len, gates, message):
    at = fox().at(positions(q_len, 10), positions(k_len, 10))
    with pytest.raises(ValueError, match=message):
        at.with_gates(gates())


def test_a_gated_bias_without_gates_names_the_encoding():
    with pytest.raises(ValueError, match="^ForgettingGates's bias comes from its tokens' forget gates"):
        fox().at(positions(3), positions(3)).score_bias(torch.float32)


# -- a NaN names its encoding and the term it spoiled --------------------------------------------------------

def nan_(parameter):
    with torch.no_grad():
        parameter.view(-1)[0] = float("nan")


@pytest.mark.parametrize(("build", "ask", "term"), [
    (lambda: posenc.build("fire", num_heads=HEADS),
     lambda at: at.score_bias(torch.float32), "FIRE gave a NaN score bias"),
    (lambda: posenc.build("fire", num_heads=HEADS),
     lambda at: at.offset_table(True, torch.float32), "FIRE gave a NaN score bias"),
    (lambda: posenc.build("transformer_xl", num_heads=HEADS, head_dim=HEAD_DIM),
     lambda at: at.relative_logits(randn(1, HEADS, 4, HEAD_DIM), randn(1, HEADS, 4, HEAD_DIM), None, 0.5),
     "TransformerXL gave a NaN content-position logits"),
    (lambda: posenc.build("cope", head_dim=HEAD_DIM), lambda at: at.counts_table(), "CoPE gave a NaN position table"),
], ids=["dense bias", "offset table", "content-position logits", "position table"])
def test_a_nan_term_is_an_error_naming_encoding_and_term(build, ask, term):
    encoding = build().double()
    nan_(next(encoding.parameters()))
    at = encoding.at(positions(4), positions(4), contiguous=True)
    with pytest.raises(ValueError, match=f"^{term}: its parameters have left the range"):
        ask(at)


def test_nan_forget_gates_name_the_gates():
    gates = log_gates(1, 4)
    gates[0, 1, 2] = float("nan")
    at = fox().at(positions(4), positions(4)).with_gates(gates)
    with pytest.raises(ValueError, match="^ForgettingGates gave a NaN forget gates"):
        at.cumulative_gates()


# -- the base class: absent doors, the offset table, the dense bias, widened channels ------------------------

@pytest.mark.parametrize(("door", "call"), [
    ("score bias", lambda e: e.bias_at(torch.zeros(1), torch.zeros(1))),
    ("content-position logits", lambda e: e.relative_logits(*[torch.zeros(1, 1, 2, 2)] * 2, *[positions(2)] * 2)),
    ("content-position values", lambda e: e.relative_values(torch.zeros(1, 1, 2, 2), *[positions(2)] * 2)),
    ("score channels", lambda e: e.score_channel_parts(*[torch.zeros(1, 1, 2, 2)] * 2, *[positions(2)] * 2, 1.0)),
])
def test_an_absent_door_says_which_encoding_lacks_it(door, call):
    with pytest.raises(NotImplementedError, match=f"^NoPE has no {door}$"):
        call(NoPE())


def test_nope_offers_no_channels_and_no_offset_table():
    nope = NoPE()
    assert nope.channels_exact(positions(2), positions(2), torch.float32, True) is False
    assert nope.offset_table(0, 3, 3, torch.device("cpu")) is None
    assert nope.at(positions(3), positions(3), contiguous=True).offset_table(True, torch.float32) is None


@pytest.mark.parametrize("name", ["fire", "fox"])
def test_the_base_offset_table_refuses_a_bias_that_is_no_function_of_the_offset(name):
    """FIRE reads the query's position, FoX its tokens' gates: the base class's table (one row of offsets per head)
    does not describe them."""
    encoding = posenc.build("fire", num_heads=HEADS) if name == "fire" else fox()
    assert PositionalEncoding.offset_table(encoding, 0, 3, 3, torch.device("cpu")) is None


def test_the_base_offset_table_covers_lowest_to_highest_per_head():
    alibi = posenc.build("alibi", num_heads=HEADS)
    table = PositionalEncoding.offset_table(alibi, -2, 3, 3, torch.device("cpu"), torch.float64)
    assert table.shape == (HEADS, 6)
    expected = alibi.bias_at(torch.arange(-2, 4)[None], torch.arange(HEADS)[:, None], torch.float64)
    torch.testing.assert_close(table, expected, rtol=0, atol=0)


def test_the_dense_bias_and_at_name_a_bad_key_position():
    alibi, three_dims = posenc.build("alibi", num_heads=HEADS), torch.zeros(1, 1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="^k_pos must have shape"):
        alibi.score_bias(positions(3), three_dims)
    with pytest.raises(ValueError, match="^k_pos must have shape"):
        alibi.at(positions(3), three_dims)


class Shifted(PositionalEncoding):
    """A q/k door that adds each token's position to its vector: ``rotate`` alone, so the base class's
    ``rotate_positioned`` serves it."""

    has_rotation = True

    def rotate(self, q, k, q_pos, k_pos):
        return q + q_pos[:, None, :, None], k + k_pos[:, None, :, None]


def test_the_base_q_k_door_hands_rotate_the_query_and_key_positions():
    q, k = randn(1, 2, 3, 4), randn(1, 2, 5, 4, seed=1)
    at = Shifted().at(positions(3, 10), positions(5, 20))
    got_q, got_k = at.rotate(q, k)
    torch.testing.assert_close(got_q, q + torch.arange(10, 13)[None, None, :, None], rtol=0, atol=0)
    torch.testing.assert_close(got_k, k + torch.arange(20, 25)[None, None, :, None], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["alibi", "transformer_xl"])
def test_score_channels_are_the_widened_parts(name):
    """q' = [content, query side] and k' = [k, key side]: through the positioned encoding and the module alike."""
    encoding = posenc.build(name, num_heads=HEADS, **({"head_dim": HEAD_DIM} if name == "transformer_xl" else {}))
    encoding = encoding.double()
    q, k = randn(2, HEADS, 5, HEAD_DIM, seed=1), randn(2, HEADS, 5, HEAD_DIM, seed=2)
    at = encoding.at(positions(5, 7), positions(5, 7), contiguous=True)
    content, query_side, key_side = at.score_channel_parts(q, k, 0.5)
    content = content if isinstance(content, torch.Tensor) else content.full()
    query_side = query_side if isinstance(query_side, torch.Tensor) else query_side.full()
    wide_q, wide_k = at.score_channels(q, k, 0.5)
    torch.testing.assert_close(wide_q, widen(content, query_side), rtol=0, atol=0)
    torch.testing.assert_close(wide_k, widen(k, key_side), rtol=0, atol=0)
    assert wide_k.shape == (2, HEADS, 5, HEAD_DIM + key_side.shape[-1])


def test_no_one_encoding_kernel_trait_is_a_flag_on_the_base_class():
    """The kernels that serve one kind of encoding say what they read as a Protocol in their own module; the base
    class carries none of it, so NoPE is served by none of them and each built-in by exactly its own."""
    from posenc.encodings.cope import CoPE
    from posenc.encodings.fire import FIRE
    from posenc.encodings.relative import Shaw, TransformerXL
    from posenc.encodings.stick_breaking import StickBreaking
    from posenc.kernels import band, gated_counts, offset_bias, offset_lookup, sticks

    served = {band.Banded: Shaw(HEAD_DIM, HEADS), gated_counts.GatedCounts: CoPE(HEAD_DIM),
              offset_lookup.OffsetLookups: TransformerXL(HEAD_DIM, HEADS), sticks.BreaksSticks: StickBreaking(),
              offset_bias.DistanceSegments: FIRE(HEADS)}
    for trait, own in served.items():
        assert [isinstance(e, trait) for e in served.values()] == [e is own for e in served.values()], trait
        assert not isinstance(NoPE(), trait)
    for flag in ("has_band_form", "has_gated_counts", "has_offset_lookups", "breaks_sticks"):
        assert not hasattr(NoPE, flag), flag
    # From Python 3.12 isinstance reads a Protocol's members statically (inspect.getattr_static), which never sees
    # a module's parameters or buffers: each member must be found that way on the encoding it serves
    members = {band.Banded: ("has_band_form", "band_parts"), gated_counts.GatedCounts: ("gated_counts_parts",),
               offset_lookup.OffsetLookups: ("offset_lookup_table", "query_shifts"),
               sticks.BreaksSticks: ("stick_breaking_current",), offset_bias.DistanceSegments: ("distance_segments",)}
    for trait, names in members.items():
        for name in names:
            inspect.getattr_static(served[trait], name)
