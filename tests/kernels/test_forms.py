"""``kernels.forms`` directly: which forms a call offers under each name (on CPU, inside a compiled graph, on
another device), and the mask form's values and dtypes where ``attention()`` seldom sends it: Transformer-XL's
logits (on CPU its channels always serve), an encoding with both a bias and content-position logits, grouped heads
whose lengths equal head counts, a logit scale other than 1/√Dh, and bf16."""

import pytest
import torch

import posenc
from posenc.encodings.alibi import ALiBi
from posenc.encodings.base import PositionalEncoding
from posenc.encodings.cope import CoPE
from posenc.encodings.relative import TransformerXL
from posenc.kernels import forms, gated_counts, offset_bias, offset_lookup, triton_available
from posenc.kernels.flex import flex_backend
from tests.helpers import seeded_randn as randn


def own_positions(q_len, k_len):
    return torch.arange(k_len - q_len, k_len)[None], torch.arange(k_len)[None]


class SlopedTransformerXL(TransformerXL):
    """Transformer-XL's logits plus an ALiBi-like bias −m_h·|i − j|: both doors at once, which the protocol allows
    and no built-in encoding uses; no channel or lookup form, so the mask form serves it."""

    has_bias = True
    has_score_channels = False

    def bias_at(self, offset, head, dtype=torch.float32):
        return -(0.5 ** (head.to(dtype) + 1)) * offset.abs().to(dtype)


def eager(q, k, v, encoding, **kwargs):
    return posenc.attention(q, k, v, encoding, backend="eager", **kwargs)


# -- which forms are offered, under which names ---------------------------------------------------------------

@pytest.mark.parametrize(("from_keys", "offered"), [(0, {"channels": forms._channel_form}),
                                                    (float("inf"), {"mask": forms._mask_form})])
def test_a_compiled_graph_is_offered_one_form_by_rule(monkeypatch, from_keys, offered):
    """Inside ``torch.compile`` nothing is timed: the channels where they serve (exact in the dtype and past the
    encoding's key count), else the mask."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(ALiBi, "cpu_channels_from_keys", from_keys)
    q = torch.zeros(1, 2, 8, 4)
    at = posenc.build("alibi", num_heads=2).at(*own_positions(8, 8), contiguous=True)
    assert forms.score_forms(q, at, True, None, True) == offered


@pytest.mark.parametrize(("name", "q_len", "dtype", "offered"), [
    ("alibi", 16, torch.float32, {"channels": forms._channel_form, "flex": flex_backend, "mask": forms._mask_form}),
    ("alibi", 1, torch.float32, {"channels": forms._channel_form, "mask": forms._mask_form}),
    ("kerple", 16, torch.float64, {"mask": forms._mask_form}),
    ("transformer_xl", 16, torch.float32, {"channels": forms._channel_form}),
])
def test_another_device_is_offered_the_gpu_forms(name, q_len, dtype, offered):
    """q on another device (``meta`` here) is offered ``gpu_score_forms``: flex for a bias over a whole sequence in
    a dtype its kernels take, never for a KV-cache step."""
    kwargs = {"head_dim": 4} if name == "transformer_xl" else {}
    at = posenc.build(name, num_heads=2, **kwargs).at(*own_positions(q_len, 16), contiguous=True)
    q = torch.empty(1, 2, q_len, 4, dtype=dtype, device="meta")
    assert forms.score_forms(q, at, True, None, True) == offered


@pytest.mark.skipif(not triton_available(), reason="needs triton (the test extra)")
def test_a_gpu_offers_transformer_xl_its_triton_lookups_once_they_are_offered(monkeypatch):
    """On another device (``meta`` here) the lookups form joins the channels where ``lookups_triton.offered``
    says so (once checked on a GPU), for causal calls at the model's own positions only."""
    from posenc.kernels import lookups_triton

    q = torch.empty(1, 2, 16, 4, device="meta")
    at = posenc.build("transformer_xl", head_dim=4, num_heads=2).at(*own_positions(16, 16), contiguous=True)
    monkeypatch.setattr(lookups_triton, "offered", lambda q: True)
    assert forms.score_forms(q, at, True, None, True) == {"lookups": forms._lookup_form,
                                                          "channels": forms._channel_form}
    assert forms.score_forms(q, at, False, None, False) == {"channels": forms._channel_form}
    monkeypatch.setattr(lookups_triton, "offered", lambda q: False)
    assert forms.score_forms(q, at, True, None, True) == {"channels": forms._channel_form}


@pytest.mark.skipif(not triton_available(), reason="needs triton (the test extra)")
def test_a_gpu_offers_cope_its_triton_counts_alone_once_they_are_offered(monkeypatch):
    """CoPE on another device (``meta`` here): its counts alone where ``counts_triton.offered`` says so, for causal
    calls at the model's own positions; else the mask (by query blocks past their budget)."""
    from posenc.kernels import counts_triton

    q = torch.empty(1, 2, 16, 4, device="meta")
    at = posenc.build("cope", head_dim=4).at(*own_positions(16, 16), contiguous=True)
    monkeypatch.setattr(counts_triton, "offered", lambda q: True)
    assert forms.score_forms(q, at, True, None, True) == {"counts": forms._counts_form}
    assert forms.score_forms(q, at, False, None, False) == {"mask": forms._mask_form}
    monkeypatch.setattr(counts_triton, "offered", lambda q: False)
    assert forms.score_forms(q, at, True, None, True) == {"mask": forms._mask_form}


@pytest.mark.skipif(not triton_available(), reason="needs triton (the test extra)")
def test_a_gpu_runs_a_bias_in_its_tiles_at_head_widths_they_fit():
    """``tiles_serve`` for ALiBi and FoX on a GPU: up to head width 256 in bf16 and 128 in float32, where the
    tiles fit an H100's shared memory (compiled for sm_90); wider heads are left to the other forms."""
    from tests.kernels.interpreted import gpu_tensor

    alibi = posenc.build("alibi", num_heads=1).at(*own_positions(16, 16), contiguous=True)
    fox = posenc.build("fox", dim=8, num_heads=1).at(*own_positions(16, 16), contiguous=True)
    for at in (alibi, fox.with_gates(torch.zeros(1, 1, 16))):
        name = type(at.encoding).__name__
        for dtype, widest in ((torch.bfloat16, 256), (torch.float16, 256), (torch.float32, 128)):
            assert forms.tiles_serve(gpu_tensor(dtype, widest), at, True), (name, dtype)
            assert not forms.tiles_serve(gpu_tensor(dtype, widest + 1), at, True), (name, dtype)


@pytest.mark.skipif(offset_lookup.extension() is None, reason="no C++ toolchain to build the kernels")
def test_transformer_xl_is_offered_its_lookups_and_channels_and_never_the_mask():
    """Content-position logits as a mask would keep a (B, H, Tq, Tk) tensor for the backward: where the channels
    serve they spare it; bidirectionally the lookups do not serve, and a bias would bring the mask back."""
    q = torch.zeros(1, 2, 8, 4)
    at = posenc.build("transformer_xl", head_dim=4, num_heads=2).at(*own_positions(8, 8), contiguous=True)
    assert forms.score_forms(q, at, True, None, True) == {"lookups": forms._lookup_form,
                                                          "channels": forms._channel_form}
    assert forms.score_forms(q, at, False, None, False) == {"channels": forms._channel_form}
    sloped = SlopedTransformerXL(4, 2).at(*own_positions(8, 8), contiguous=True)
    assert forms.score_forms(q, sloped, True, None, True) == {"mask": forms._mask_form}


class CountsByAnotherName(PositionalEncoding):
    """CoPE's term in an encoding that is no CoPE: it only has the method ``gated_counts.GatedCounts`` reads."""

    has_relative_logits = True
    relative_logits_scaled = False

    def __init__(self, head_dim):
        super().__init__()
        self.cope = CoPE(head_dim)

    def gated_counts_parts(self):
        return self.cope.embeddings, self.cope.gate_scale

    def relative_logits(self, q, k, q_pos, k_pos, allowed=None):
        return self.cope.relative_logits(q, k, q_pos, k_pos, allowed)


@pytest.mark.skipif(gated_counts.extension() is None, reason="no C++ toolchain to build the kernels")
def test_a_kernel_serves_any_encoding_with_the_members_it_reads_and_no_term_it_would_drop():
    """Forms choose by trait, never by name: an unrelated class with CoPE's kernel method runs in CoPE's kernel
    (equal to eager in float64); given a bias too, which the kernel would drop, it is offered the mask instead."""
    torch.manual_seed(0)
    enc = CountsByAnotherName(4).double()
    with torch.no_grad():
        enc.cope.embeddings.normal_()
    q, k, v = (randn(1, 2, 9, 4, seed=seed) for seed in range(3))
    at = enc.at(*own_positions(9, 9), contiguous=True)
    assert forms.score_forms(q, at, True, None, True) == {"counts": forms._counts_form}
    torch.testing.assert_close(posenc.attention(q, k, v, enc, backend="sdpa"), eager(q, k, v, enc))
    enc.has_bias = True
    assert forms.score_forms(q, at, True, None, True) == {"mask": forms._mask_form}


@pytest.mark.skipif(gated_counts.extension() is None or offset_bias.extension() is None,
                    reason="no C++ toolchain to build the kernels")
def test_cope_and_fox_are_offered_their_kernel_alone_at_their_own_positions():
    q = torch.zeros(1, 2, 8, 4)
    cope = posenc.build("cope", head_dim=4).at(*own_positions(8, 8), contiguous=True)
    assert forms.score_forms(q, cope, True, None, True) == {"counts": forms._counts_form}
    fox = posenc.build("fox", num_heads=2, dim=4).at(*own_positions(8, 8), contiguous=True)
    assert forms.score_forms(q, fox, True, None, True) == {"gates": forms._gate_form}
    assert "counts" not in forms.score_forms(q, cope, False, None, False)  # bidirectional: the mask form


@pytest.mark.skipif(offset_bias.extension() is None, reason="no C++ toolchain to build the kernel")
@pytest.mark.parametrize("causal", [True, False])
def test_the_table_checked_when_offering_is_the_table_the_form_runs(monkeypatch, causal):
    """Offering the table form builds the offset table in the form's own dtype and mask, so running it builds no
    second one; and the form's output equals eager's."""
    encoding = posenc.build("kerple", num_heads=2).double()
    built = []
    original = type(encoding).offset_table
    monkeypatch.setattr(type(encoding), "offset_table", lambda self, *args: built.append(args) or original(self, *args))
    q, k, v = (randn(1, 2, 6, 4, seed=s) for s in range(3))
    at = encoding.at(*own_positions(6, 6), contiguous=True)
    offered = forms.score_forms(q, at, causal, None, causal)
    assert offered["table"] is forms._table_form
    out = offered["table"](q, k, v, at, causal, None, 0.5, causal)
    assert len(built) == 1 and built[0][-1] == torch.float64
    torch.testing.assert_close(out, eager(q, k, v, encoding, causal=causal, scale=0.5), rtol=1e-12, atol=1e-12)


# -- the mask form's values ----------------------------------------------------------------------------------

def mask_form(q, k, v, encoding, *, causal=True, mask=None, scale=0.4):
    """The mask form at the model's own positions; SDPA's causal fast path where attention() would take it."""
    at = encoding.at(*own_positions(q.shape[2], k.shape[2]), contiguous=mask is None)
    plain_causal = causal and mask is None and q.shape[2] == k.shape[2]
    return forms._mask_form(q, k, v, at, causal, mask, scale, plain_causal)


@pytest.mark.parametrize("encoding", [
    lambda: posenc.build("transformer_xl", num_heads=2, head_dim=4).double(),
    lambda: SlopedTransformerXL(head_dim=4, num_heads=2).double(),
], ids=["transformer_xl", "bias and logits"])
@pytest.mark.parametrize("masked", [False, True])
def test_the_mask_form_carries_content_position_logits_and_a_bias(encoding, masked):
    encoding = encoding()
    with torch.no_grad():
        for parameter in encoding.parameters():
            parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(5))
    q, k, v = (randn(2, 2, 7, 4, seed=s) for s in range(3))
    mask = (randn(2, 1, 7, 7, seed=4) > -0.5) | torch.eye(7, dtype=torch.bool) if masked else None
    torch.testing.assert_close(mask_form(q, k, v, encoding, mask=mask, scale=0.4),
                               eager(q, k, v, encoding, mask=mask, scale=0.4), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["alibi", "kerple"])
def test_the_mask_form_with_grouped_heads_whose_lengths_equal_head_counts(name):
    """Four query heads on two key heads, a KV-cache step of Tq = 2 = Hkv queries over Tk = 4 = H keys; a bias in
    float64 to the last digit (Kerple's is no float32 number)."""
    encoding = posenc.build(name, num_heads=4).double()
    q, k, v = randn(1, 4, 2, 8, seed=0), randn(1, 2, 4, 8, seed=1), randn(1, 2, 4, 8, seed=2)
    torch.testing.assert_close(mask_form(q, k, v, encoding, scale=0.9), eager(q, k, v, encoding, scale=0.9),
                               rtol=1e-13, atol=1e-13)


def test_the_mask_form_in_bf16_computes_its_terms_in_float32(monkeypatch):
    """Terms and bias are asked for in float32 (never bf16), and the float mask reaches SDPA in q's dtype."""
    encoding = SlopedTransformerXL(head_dim=8, num_heads=2)
    asked = []
    original_logits, original_bias = TransformerXL.relative_logits, TransformerXL.score_bias
    monkeypatch.setattr(SlopedTransformerXL, "relative_logits", lambda self, q, k, *a: asked.append(
        ("logits", q.dtype, k.dtype)) or original_logits(self, q, k, *a))
    monkeypatch.setattr(SlopedTransformerXL, "score_bias", lambda self, q_pos, k_pos, dtype: asked.append(
        ("bias", dtype)) or original_bias(self, q_pos, k_pos, dtype))
    q, k, v = (randn(1, 2, 6, 8, seed=s, dtype=torch.bfloat16) for s in range(3))
    out = mask_form(q, k, v, encoding)
    assert out.dtype == torch.bfloat16
    assert asked == [("logits", torch.float32, torch.float32), ("bias", torch.float32)]
    expected = eager(*(t.double() for t in (q, k, v)), encoding.double(), scale=0.4)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=0.05)


@pytest.mark.parametrize("masked", [False, True])
def test_the_static_mask_in_bf16_reaches_sdpa_in_bf16(masked):
    encoding = posenc.build("kerple", num_heads=2)
    q, k, v = (randn(1, 2, 6, 8, seed=s, dtype=torch.bfloat16) for s in range(3))
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril() if masked else None
    out = mask_form(q, k, v, encoding, causal=not masked, mask=mask)
    assert out.dtype == torch.bfloat16
    expected = eager(*(t.double() for t in (q, k, v)), encoding.double(), scale=0.4)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=0.05)


def test_the_static_mask_is_built_in_float64_for_float64_inputs():
    """Kerple's bias in float64 to the last digit, through the memoized mask (no mask) and a caller's mask."""
    encoding = posenc.build("kerple", num_heads=2).double()
    q, k, v = (randn(1, 2, 9, 4, seed=s) for s in range(3))
    mask = torch.ones(1, 1, 9, 9, dtype=torch.bool).tril()
    for kwargs in ({"causal": True}, {"causal": False, "mask": mask}):
        torch.testing.assert_close(mask_form(q, k, v, encoding, **kwargs), eager(q, k, v, encoding, scale=0.4, **kwargs),
                                   rtol=1e-14, atol=1e-14)
