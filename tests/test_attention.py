import re
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.attention import choose_backend, serves
from posenc.kernels import flex, gated_counts, offset_lookup
from posenc.kernels.forms import gpu_score_forms
from tests.helpers import ATTENTION_ENCODINGS, HEAD_DIM, HEADS, make_encoding, mask_per_head, qkv
from tests.oracles import naive_attention

BACKENDS = ["eager", "sdpa", "flex"]


@torch.no_grad()
def served(key, backend, q, k, v):
    return serves(backend, make_encoding(key), q, k, v)


# FlexAttention's score_mod adds to a score; these encodings' relative logits or values are more than that.
FLEX_REFUSES = ("shaw", "transformer_xl", "cope")


def cases():
    """Every (encoding, backend) pair the backend serves; refusals are tested apart. A fixed list, not ``serves``:
    the test ids must not hang on the code under test (a mutant of ``serves`` would change what is collected). A
    list, not a generator: a mark keeps it, and a second collection in one process (mutmut's) would find it spent."""
    return [pytest.param(key, backend, id=f"{key}-{backend}") for key in ATTENTION_ENCODINGS for backend in BACKENDS
            if not (backend == "flex" and key in FLEX_REFUSES)]


def test_the_served_pairs_are_the_listed_cases():
    listed = {tuple(case.values) for case in cases()}
    assert {(key, backend) for key in ATTENTION_ENCODINGS for backend in BACKENDS if served(key, backend, *qkv())} \
        == listed


@pytest.mark.parametrize("key, backend", cases())
@pytest.mark.parametrize("causal", [True, False])
def test_every_backend_agrees_with_eager(key, backend, causal):
    enc = make_encoding(key)
    q, k, v = qkv(q_len=5, k_len=12)
    q_pos = torch.tensor([[7, 8, 9, 10, 11], [2, 3, 4, 20, 21]])
    k_pos = torch.arange(12).expand(2, -1)
    mask = torch.rand(2, 1, 5, 12) > 0.2
    mask[..., 0] = True  # every query keeps at least one key
    with torch.no_grad():
        kwargs = dict(q_positions=q_pos, k_positions=k_pos, causal=causal, mask=mask)
        expected = posenc.attention(q, k, v, enc, backend="eager", **kwargs)
        got = posenc.attention(q, k, v, enc, backend=backend, **kwargs)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("key, backend", cases())
def test_kv_cache_decoding_equals_full_forward(key, backend):
    enc = make_encoding(key)
    q, k, v = qkv(q_len=10, k_len=10)
    with torch.no_grad():
        full = posenc.attention(q, k, v, enc, backend=backend)
        prefill = posenc.attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc, backend=backend)
        steps = [prefill]
        for t in range(4, 10):  # one new query against the cache of keys 0..t
            steps.append(posenc.attention(
                q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], enc, backend=backend,
                q_positions=torch.tensor([t]), k_positions=torch.arange(t + 1),
            ))
        if getattr(enc, "length_dependent", False):
            # Dynamic scaling re-derives frequencies from the current length, so step t
            # equals the full forward pass over the first t+1 tokens, not over all 10.
            full = torch.cat([prefill] + [
                posenc.attention(q[:, :, : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], enc, backend=backend)[:, :, -1:]
                for t in range(4, 10)
            ], dim=2)
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("key", list(ATTENTION_ENCODINGS))
def test_default_positions_put_queries_at_the_end_of_the_keys(key):
    enc = make_encoding(key)
    q, k, v = qkv(q_len=3, k_len=9)
    with torch.no_grad():
        implicit = posenc.attention(q, k, v, enc)
        explicit = posenc.attention(q, k, v, enc, q_positions=torch.arange(6, 9), k_positions=torch.arange(9))
    torch.testing.assert_close(implicit, explicit)


@pytest.mark.parametrize("key", ["rope", "alibi", "t5"])
def test_queries_default_to_the_last_of_the_key_positions_given(key):
    """Keys given alone at 20..28: the queries sit at 26..28, not at 6..8, where every key came after them (each
    row masked to zeros)."""
    enc = make_encoding(key)
    q, k, v = qkv(batch=2, q_len=3, k_len=9)
    keys = torch.arange(20, 29).expand(2, -1)
    with torch.no_grad():
        implicit = posenc.attention(q, k, v, enc, k_positions=keys)
        explicit = posenc.attention(q, k, v, enc, q_positions=keys[:, 6:], k_positions=keys)
    torch.testing.assert_close(implicit, explicit, rtol=0, atol=0)
    assert implicit.abs().amin(dim=-1).gt(0).all()


@pytest.mark.parametrize("key", list(ATTENTION_ENCODINGS))
def test_packed_documents_equal_separate_runs(key):
    enc = make_encoding(key)
    q, k, v = qkv(batch=1, q_len=11, k_len=11)
    doc_ids = torch.tensor([0] * 4 + [1] * 7)
    positions = posenc.document_positions(doc_ids)
    assert positions.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6]
    with torch.no_grad():
        packed = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions,
                                  mask=posenc.document_mask(doc_ids))
        first = posenc.attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], enc)
        second = posenc.attention(q[:, :, 4:], k[:, :, 4:], v[:, :, 4:], enc)
    torch.testing.assert_close(packed, torch.cat((first, second), dim=2))


@pytest.mark.parametrize("key", list(ATTENTION_ENCODINGS))
def test_future_tokens_never_change_past_outputs(key):
    enc = make_encoding(key)
    q, k, v = qkv(q_len=10, k_len=10)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    q2[:, :, 6:], k2[:, :, 6:], v2[:, :, 6:] = (torch.randn_like(t[:, :, 6:]) for t in (q, k, v))
    with torch.no_grad():
        a, b = posenc.attention(q, k, v, enc), posenc.attention(q2, k2, v2, enc)
    torch.testing.assert_close(a[:, :, :6], b[:, :, :6])
    assert not torch.allclose(a[:, :, 6:], b[:, :, 6:])


@pytest.mark.parametrize("key", list(ATTENTION_ENCODINGS))
def test_only_nope_is_permutation_equivariant(key):
    enc = make_encoding(key)
    q, k, v = qkv(batch=1, q_len=9, k_len=9)
    perm = torch.tensor([3, 0, 7, 1, 8, 2, 6, 4, 5])
    with torch.no_grad():
        out = posenc.attention(q, k, v, enc, causal=False)
        permuted = posenc.attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], enc, causal=False)
    equivariant = torch.allclose(permuted, out[:, :, perm], atol=1e-12)
    assert equivariant == (key == "none")


def test_eager_matches_naive_softmax_oracle_with_alibi_bias():
    enc = posenc.build("alibi", num_heads=HEADS)
    q, k, v = qkv(batch=1, q_len=6, k_len=6)
    got = posenc.attention(q, k, v, enc, backend="eager")
    for h in range(HEADS):
        slope = float(posenc.alibi_slopes(HEADS)[h])
        bias = [[-slope * (i - j) for j in range(6)] for i in range(6)]
        allowed = [[j <= i for j in range(6)] for i in range(6)]
        torch.testing.assert_close(got[0, h], naive_attention(q[0, h], k[0, h], v[0, h], bias=bias, allowed=allowed))


@settings(max_examples=25, deadline=None)
@given(q_len=st.integers(1, 8), extra=st.integers(0, 8), start=st.integers(0, 2**20), causal=st.booleans())
def test_rope_sdpa_matches_naive_oracle_on_random_shapes(q_len, extra, start, causal):
    enc = posenc.build("rope", head_dim=8)
    k_len = q_len + extra
    q, k, v = qkv(batch=1, q_len=q_len, k_len=k_len)
    k_pos = torch.arange(start, start + k_len)
    got = posenc.attention(q, k, v, enc, q_positions=k_pos[extra:], k_positions=k_pos, causal=causal, backend="sdpa")
    qr, kr = enc.rotate(q, k, k_pos[extra:].unsqueeze(0), k_pos.unsqueeze(0))
    allowed = [[(not causal) or j <= i + extra for j in range(k_len)] for i in range(q_len)]
    torch.testing.assert_close(got[0, 1], naive_attention(qr[0, 1], kr[0, 1], v[0, 1], allowed=allowed))


class TestCrossAttention:
    def setup_method(self):
        self.rope = posenc.build("rope", head_dim=8)
        self.q, self.k, self.v = qkv(batch=1, q_len=4, k_len=6)

    def run(self, mode):
        q_pos, k_pos = posenc.cross_attention_positions(mode, 4, 6)
        encoding = None if mode == "none" else self.rope
        return posenc.attention(self.q, self.k, self.v, encoding, q_positions=q_pos, k_positions=k_pos, causal=False)

    def test_none_is_plain_content_attention(self):
        out = self.run("none")
        torch.testing.assert_close(out[0, 0], naive_attention(self.q[0, 0], self.k[0, 0], self.v[0, 0]))

    def test_query_only_rotates_queries_and_not_keys(self):
        q_rot, _ = self.rope.rotate(self.q, self.q, torch.arange(4).unsqueeze(0), torch.arange(4).unsqueeze(0))
        out = self.run("query_only")
        torch.testing.assert_close(out[0, 1], naive_attention(q_rot[0, 1], self.k[0, 1], self.v[0, 1]))

    def test_separate_and_unified_timelines(self):
        separate, unified = self.run("separate"), self.run("unified")
        q_pos, k_pos = posenc.cross_attention_positions("unified", 4, 6)
        assert q_pos.tolist() == [6, 7, 8, 9] and k_pos.tolist() == list(range(6))
        # Unified = separate with every query shifted by Tk: different offsets, different outputs.
        assert not torch.allclose(separate, unified)
        q_pos, k_pos = posenc.cross_attention_positions("separate", 4, 6)
        shifted = posenc.attention(self.q, self.k, self.v, self.rope, q_positions=q_pos + 6, k_positions=k_pos, causal=False)
        torch.testing.assert_close(shifted, unified)


def test_refusals_name_a_backend_that_can():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="backend='sdpa' cannot serve Shaw.*use backend='eager'"):  # no band form
        posenc.attention(q, k, v, posenc.build("shaw", head_dim=8, num_heads=2, interpolate_factor=2.0), backend="sdpa")
    with pytest.raises(ValueError, match="backend='flex' cannot serve TransformerXL.*'sdpa' or 'eager'"):
        posenc.attention(q, k, v, make_encoding("transformer_xl"), backend="flex")
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="no backward pass on CPU"):
        posenc.attention(q, k, v, make_encoding("alibi"), backend="flex")
    assert choose_backend("auto", make_encoding("shaw"), q, k, v) == "sdpa"  # its band form
    assert choose_backend("auto", make_encoding("alibi"), q, k, v) == "sdpa"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, k, v: posenc.attention(q[0], k, v), r"q must be a 4-D tensor"),
        (lambda q, k, v: posenc.attention(q, k[:, :1], v), r"must share the batch B, and k, v the heads"),
        (lambda q, k, v: posenc.attention(q[:, :1], k, v), r"a multiple of Hkv"),
        (lambda q, k, v: posenc.attention(q, k[..., :4], v), r"same head width"),
        (lambda q, k, v: posenc.attention(q, k.bfloat16(), v), r"one dtype, got torch.float64, torch.bfloat16 and"),
        (lambda q, k, v: posenc.attention(q, k, v.float(), posenc.build("alibi", num_heads=2)), r"one dtype"),
        (lambda q, k, v: posenc.attention(q, k, v[:, :, :3]), r"same length Tk"),
        (lambda q, k, v: posenc.attention(q, k, v, posenc.build("alibi", num_heads=3)), r"num_heads=3 .* H=2"),
        (lambda q, k, v: posenc.attention(q, k, v, posenc.build("rope", head_dim=4)), r"head_dim=4 .* Dh=8"),
        (lambda q, k, v: posenc.attention(q, k, v, q_positions=torch.arange(5)), r"q_positions must have shape \(12,\)"),
        (lambda q, k, v: posenc.attention(q, k, v, k_positions=torch.arange(12) - 1), r"k_positions must be >= 0"),
        (lambda q, k, v: posenc.attention(q, k, v, k_positions=torch.arange(12.0)), r"integer tensor"),
        (lambda q, k, v: posenc.attention(q, k, v, backend="fast"), r"backend must be one of"),
        (lambda q, k, v: posenc.attention(q, k, v, mask=torch.ones(12, 12)), r"mask must be a bool tensor"),
        (lambda q, k, v: posenc.attention(q, k, v, mask=torch.ones(1, 1, 3, 12, dtype=torch.bool)),
         r"mask must be 4-D, each dim 1 or that of \(B, H, Tq, Tk\) = \(2, 2, 12, 12\), got \(1, 1, 3, 12\)$"),
        (lambda q, k, v: posenc.attention(q, k[:, :, :4], v[:, :, :4]), r"Tq \(12\) must be <= Tk \(4\)"),
        (lambda q, k, v: posenc.attention(q.long(), k.long(), v.long()), r"must be floating-point tensors"),
        (lambda q, k, v: posenc.attention(q[:, :, :0], k[:, :, :0], v[:, :, :0], posenc.build("alibi", num_heads=2)),
         r"at least one position each \(Tq, Tk >= 1\), got Tq=0 and Tk=0"),
        (lambda q, k, v: posenc.attention(q, k, v, scale=float("nan")), r"scale must be None .* got nan"),
        (lambda q, k, v: posenc.attention(q[:, :0], k[:, :0], v[:, :0]),
         r"^q and k must have at least one head each \(H, Hkv >= 1\), got H=0 and Hkv=0$"),
        (lambda q, k, v: posenc.attention(q, k[:, :0], v[:, :0]),
         r"^q and k must have at least one head each \(H, Hkv >= 1\), got H=2 and Hkv=0$"),
        (lambda q, k, v: posenc.attention(q, k, v, "rope"), r"^encoding must be a module from posenc.build, one at "
         r"positions \(encoding.at\) or None, got str: build it first, posenc.build\('rope', ...\)$"),
        (lambda q, k, v: posenc.attention_weights(q, k, scale=-1.0), r"scale must be None .* > 0, got -1.0"),
        (lambda q, k, v: posenc.build("rotary"), r"unknown encoding 'rotary'; valid names: none, sinusoidal"),
        (lambda q, k, v: posenc.build("alibi", heads=4), r"unknown kwargs \['heads'\]"),
        (lambda q, k, v: posenc.build("alibi"), r"encoding 'alibi': .*num_heads"),
    ],
    ids=lambda value: re.sub(r"[^A-Za-z0-9]+", "_", value).strip("_") if isinstance(value, str) else "bad",
)
def test_bad_input_raises_value_error_naming_the_parameter(call, message):
    with pytest.raises(ValueError, match=message):
        call(*qkv())


def test_compiled_flex_agrees_with_eager(monkeypatch):
    monkeypatch.setenv("POSENC_FLEX_COMPILE", "1")
    enc = posenc.build("alibi", num_heads=HEADS)
    q, k, v = qkv(q_len=8, k_len=16, dtype=torch.float32)
    with torch.no_grad():
        got = posenc.attention(q, k, v, enc, backend="flex")
        expected = posenc.attention(q, k, v, enc, backend="eager")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key, q_len, dtype, forms", [
    ("t5", 16, torch.float32, ["flex", "mask"]),
    ("t5", 1, torch.float32, ["mask"]),  # a KV-cache step: flex would compile for every new shape
    ("t5", 16, torch.float64, ["mask"]),  # no compiled flex kernel in float64
    ("alibi", 16, torch.bfloat16, ["channels", "flex", "mask"]),
    ("transformer_xl", 16, torch.float32, ["channels"]),  # the mask form would keep (B, H, Tq, Tk) logits
    ("cope", 16, torch.float32, ["mask"]),
    ("fire", 16, torch.float32, ["mask"]),  # its dense bias captured by flex crashed a compiled backward
])
def test_the_forms_timed_on_a_gpu_without_triton(monkeypatch, key, q_len, dtype, forms):
    """What sdpa offers its timing on a GPU where the Triton tiles do not serve (read here on CPU tensors, the CPU
    kernels switched off; tests/test_cuda.py runs them on one)."""
    monkeypatch.setattr(offset_lookup, "serves", lambda q: False)
    monkeypatch.setattr(gated_counts, "serves", lambda q: False)
    enc = make_encoding(key, dtype=torch.float32)
    at = enc.at(torch.arange(16 - q_len, 16)[None], torch.arange(16)[None], contiguous=True)
    if key == "fire":  # past its threshold: the bias reads the query's position
        at = enc.at(torch.arange(2000, 2016)[None], torch.arange(2000, 2016)[None], contiguous=True)
    q = torch.empty(1, 2, q_len, 4, dtype=dtype)
    assert list(gpu_score_forms(q, at, True, None, True)) == forms


@pytest.mark.parametrize("key, q_len, forms", [
    ("t5", 16, ["tiles"]),
    ("t5", 1, ["tiles"]),  # a KV-cache step too: nothing compiles per shape
    ("alibi", 16, ["tiles", "channels"]),  # both linear in T: timed
    ("alibi_symmetric", 16, ["tiles"]),  # no exact channels for a symmetric bias
    ("fire", 16, ["tiles", "mask"]),  # a formula not yet checked on a GPU: the dense form beside it
])
def test_the_tiles_are_offered_where_triton_serves(monkeypatch, key, q_len, forms):
    """With Triton serving q's device, a bias of offsets is offered the tiles (and the channels where exact),
    never a form that builds a (B, H, Tq, Tk) tensor; a mask leaves the tiles out."""
    monkeypatch.setattr(pytest.importorskip("posenc.kernels.tiles_triton"), "serves", lambda q: True)
    enc = make_encoding(key, dtype=torch.float32)
    at = enc.at(torch.arange(16 - q_len, 16)[None], torch.arange(16)[None], contiguous=True)
    q = torch.empty(1, 2, q_len, 4, dtype=torch.bfloat16)
    assert list(gpu_score_forms(q, at, True, None, True)) == forms
    assert "tiles" not in gpu_score_forms(q, at, True, torch.ones(1, 1, q_len, 16, dtype=torch.bool), True)


def test_a_gpu_never_times_foxs_token_bias(monkeypatch):
    """FoX's bias comes from the tokens: a timing's stand-in backward would reach into the caller's graph. Without
    Triton the mask alone is offered; with it the tiles alone, given the gates at the model's own positions."""
    fox = posenc.build("fox", num_heads=2, dim=16)
    at = fox.at(torch.arange(16)[None], torch.arange(16)[None], contiguous=True)
    gated = at.with_gates(torch.zeros(1, 2, 16))
    q = torch.empty(1, 2, 16, 4)
    assert list(gpu_score_forms(q, gated, True, None, True)) == ["mask"]
    monkeypatch.setattr(pytest.importorskip("posenc.kernels.tiles_triton"), "serves", lambda q: True)
    assert list(gpu_score_forms(q, gated, True, None, True)) == ["tiles"]
    explicit = fox.at(torch.arange(16)[None], torch.arange(16)[None], contiguous=False).with_gates(torch.zeros(1, 2, 16))
    assert list(gpu_score_forms(q, explicit, True, None, False)) == ["mask"]


def test_flex_builds_the_plain_causal_block_mask_once_per_length(monkeypatch):
    """Causal attention at the model's own positions shares one block mask per length across calls, batches and
    heads (built per call it cost more than the attention on a GPU); other calls still build their own, and both
    equal eager."""
    from torch.nn.attention import flex_attention as flex_module

    flex._plain_causal_block_mask.cache_clear()
    built = []
    original = flex_module.create_block_mask
    monkeypatch.setattr(flex_module, "create_block_mask", lambda *a, **kw: built.append(a[3:5]) or original(*a, **kw))
    enc = posenc.build("alibi", num_heads=HEADS)
    for batch in (1, 2, 2):
        q, k, v = qkv(batch=batch, q_len=140, k_len=140, dtype=torch.float32)
        with torch.no_grad():
            got = posenc.attention(q, k, v, enc, backend="flex")
        torch.testing.assert_close(got, posenc.attention(q, k, v, enc, backend="eager"), rtol=1e-5, atol=1e-5)
    assert built == [(140, 140)]
    q, k, v = qkv(batch=2, q_len=8, k_len=140, dtype=torch.float32)  # a KV-cache step: positions decide
    with torch.no_grad():
        got = posenc.attention(q, k, v, enc, backend="flex")
    torch.testing.assert_close(got, posenc.attention(q, k, v, enc, backend="eager"), rtol=1e-5, atol=1e-5)
    assert built == [(140, 140), (8, 140)]


@settings(max_examples=30, deadline=None)
@given(
    key=st.sampled_from([k for k in ATTENTION_ENCODINGS if k != "rope_dynamic"]),
    total=st.integers(2, 14),
    data=st.data(),
)
def test_chunked_decoding_equals_full_pass_for_any_split(key, total, data):
    """Prefill any prefix, then decode chunks of any sizes: the outputs equal one full pass."""
    enc = make_encoding(key)
    q, k, v = qkv(batch=1, q_len=total, k_len=total)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, total - 1), max_size=4)))) + [total]
    with torch.no_grad():
        full = posenc.attention(q, k, v, enc)
        pieces, start = [], 0
        for end in cuts:
            pieces.append(posenc.attention(q[:, :, start:end], k[:, :, :end], v[:, :, :end], enc))
            start = end
    torch.testing.assert_close(torch.cat(pieces, dim=2), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("key, backend", cases())
def test_output_keeps_the_input_dtype(key, backend):
    enc = make_encoding(key, dtype=torch.bfloat16)
    q, k, v = qkv(q_len=6, k_len=6, dtype=torch.bfloat16)
    with torch.no_grad():
        out = posenc.attention(q, k, v, enc, backend=backend)
        # The same bf16-rounded inputs and tables, in float64 (module.double() converts in place).
        reference = posenc.attention(q.double(), k.double(), v.double(), enc.double(), backend="eager")
    assert out.dtype == torch.bfloat16
    assert (out.double() - reference).abs().max() < 5e-2


@pytest.mark.parametrize("key, backend", [c for c in cases() if c.values[0] != "rope_dynamic"])
def test_left_padding_equals_the_unpadded_row(key, backend):
    """Row 0 has 3 pad tokens on the left: per-row positions start at its first real token,
    pad keys are masked, and its real outputs equal those of the row run alone.

    (Dynamic RoPE is excluded by design: its length is the batch's largest position, so a
    row's frequencies depend on the longest row, as in transformers.)"""
    enc = make_encoding(key)
    q, k, v = qkv(batch=2, q_len=10, k_len=10)
    pads = 3
    positions = torch.stack((torch.cat((torch.zeros(pads, dtype=torch.long), torch.arange(10 - pads))),
                             torch.arange(10)))  # (B, T)
    real = torch.ones(2, 10, dtype=torch.bool)
    real[0, :pads] = False
    mask = real[:, None, None, :]  # (B, 1, 1, Tk): no query attends to a pad key
    with torch.no_grad():
        padded = posenc.attention(q, k, v, enc, q_positions=positions, k_positions=positions, mask=mask,
                                  backend=backend)
        alone = posenc.attention(q[:1, :, pads:], k[:1, :, pads:], v[:1, :, pads:], enc, backend=backend)
    torch.testing.assert_close(padded[:1, :, pads:], alone, rtol=1e-10, atol=1e-10)
    assert torch.isfinite(padded).all()  # pad queries see no key: zeros, never NaN


@pytest.mark.parametrize("key, backend", cases())
def test_a_query_with_no_allowed_key_returns_zeros(key, backend):
    enc = make_encoding(key)
    q, k, v = qkv(batch=1, q_len=4, k_len=4)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 2, :] = False
    with torch.no_grad():
        out = posenc.attention(q, k, v, enc, mask=mask, backend=backend)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("key, backend", cases())
def test_grouped_query_attention_equals_repeated_keys_and_values(key, backend):
    """Several key/value heads, so a wrong head mapping shows: query head h reads kv head
    h // (H / Hkv), as transformers' repeat_kv and SDPA's enable_gqa do."""
    heads, kv_heads = 6, 3
    enc = make_encoding(key, heads=heads)
    q = torch.randn(2, heads, 6, HEAD_DIM, dtype=torch.float64)
    k, v = torch.randn(2, kv_heads, 9, HEAD_DIM, dtype=torch.float64), torch.randn(2, kv_heads, 9, HEAD_DIM, dtype=torch.float64)
    mapping = torch.arange(heads) // (heads // kv_heads)  # [0, 0, 1, 1, 2, 2]
    with torch.no_grad():
        grouped = posenc.attention(q, k, v, enc, backend=backend)
        repeated = posenc.attention(q, k[:, mapping], v[:, mapping], enc, backend=backend)
        weights = posenc.attention_weights(q, k, enc)
        repeated_weights = posenc.attention_weights(q, k[:, mapping], enc)
    torch.testing.assert_close(grouped, repeated, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(weights, repeated_weights, rtol=1e-10, atol=1e-10)
    assert weights.shape == (2, heads, 6, 9)


def test_compiled_flex_masks_each_head_with_its_own_mask(monkeypatch):
    """Compiled (as on a GPU; here by the CPU's compiler), FlexAttention skips the mask inside a block its block mask
    calls full. 300 tokens (three 128-token blocks) and a first head that keeps every pair: a block mask built for
    one head and shared by all lets the other heads read keys their masks drop (0.65 off; the code is within 1e-5).
    Uncompiled, FlexAttention applies every mask densely and cannot tell."""
    monkeypatch.setenv("POSENC_FLEX_COMPILE", "1")
    enc = make_encoding("alibi")
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, HEADS, 300, HEAD_DIM, generator=generator) for _ in range(3))
    mask = mask_per_head(HEADS, 300)
    with torch.no_grad():
        expected = posenc.attention(q.double(), k.double(), v.double(), enc, causal=False, mask=mask, backend="eager")
        got = posenc.attention(q, k, v, enc.float(), causal=False, mask=mask, backend="flex")
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("setting, on_gpu, compiles", [
    (None, False, False), (None, True, True), ("auto", False, False), ("auto", True, True), ("1", False, True),
    ("0", True, False), ("yes", True, False)])
def test_posenc_flex_compile_compiles_on_a_gpu_unless_told(monkeypatch, setting, on_gpu, compiles):
    """Unset or "auto": compiled on CUDA only; "1": always; "0" (or anything else): never."""
    if setting is None:
        monkeypatch.delenv("POSENC_FLEX_COMPILE", raising=False)
    else:
        monkeypatch.setenv("POSENC_FLEX_COMPILE", setting)
    assert flex._flex_compiles(SimpleNamespace(is_cuda=on_gpu)) is compiles


def test_compiled_flex_bfloat16_with_biases(monkeypatch):
    """Compiled flex on CPU with bf16 inputs and a bias stays within bf16 tolerance of a
    float64 oracle (a variant that added a float32 table and cast back gave errors ~2.5)."""
    monkeypatch.setenv("POSENC_FLEX_COMPILE", "1")
    q, k, v = qkv(batch=1, q_len=32, k_len=32, dtype=torch.bfloat16)
    for key in ("alibi", "t5"):
        enc = make_encoding(key, dtype=torch.float32)
        with torch.no_grad():
            got = posenc.attention(q, k, v, enc, backend="flex")
            expected = posenc.attention(q.double(), k.double(), v.double(), enc.double(), backend="eager")
        assert (got.double() - expected).abs().max() < 5e-2, key
