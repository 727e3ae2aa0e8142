"""CoPE, FIRE and Kerple against plain re-implementations of their papers' published code (the same parameters
loaded into both, attention compared in float64), at the parameter values training can reach; and no backend
turns an encoding's NaN into a silent zero."""

import math

import pytest
import torch

import posenc
from posenc.attention import serves

HEADS, HEAD_DIM, LENGTH = 3, 8, 11


def qkv(seed=0, length=LENGTH):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, HEADS, length, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(3))


def papers_cope_attention(q, k, v, pos_emb):
    """The CoPE paper's listing, batched over heads: gates from the scaled, masked logits, counts by a reversed
    cumulative sum, q·pos_emb at the integers, interpolated, added to the scaled logits. q, k, v: (H, T, Dh);
    pos_emb: (1, Dh, P)."""
    length = q.shape[-2]
    mask = torch.ones(length, length, dtype=q.dtype).tril()
    attn_logits = q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1]) + mask.log()
    gates = torch.sigmoid(attn_logits)
    pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=pos_emb.shape[-1] - 1)
    logits_int = q @ pos_emb
    ceil, floor = logits_int.gather(-1, pos.ceil().long()), logits_int.gather(-1, pos.floor().long())
    w = pos - pos.floor()
    attn_logits = attn_logits + ceil * w + floor * (1 - w)
    return torch.softmax(attn_logits, -1) @ v


def papers_fire_bias(length, mlp, c, threshold, eps=1e-6):
    """The FIRE paper's listing: log(|c·(i − j)| + 1) over log(|c·max(i, |L|)| + 1) + eps, through the MLP.
    -> (1, H, T, T)."""
    positions = torch.arange(length, dtype=torch.float64)
    distance = positions[:, None] - positions[None, :]
    normalizer = torch.maximum(positions, torch.tensor(abs(threshold), dtype=torch.float64))[:, None]
    x = torch.log(torch.abs(c * distance) + 1) / (torch.log(torch.abs(c * normalizer) + 1) + eps)
    return mlp(x.unsqueeze(-1)).unsqueeze(0).permute(0, 3, 1, 2)


def posenc_attention(enc, q, k, v, backend):
    with torch.no_grad():
        return posenc.attention(q, k, v, enc, causal=True, backend=backend)


def test_cope_loads_the_papers_table_as_it_is_and_attends_as_its_code():
    torch.manual_seed(0)
    pos_emb = torch.randn(1, HEAD_DIM, 6, dtype=torch.float64)  # the paper's parameter layout
    enc = posenc.build("cope", head_dim=HEAD_DIM, max_positions=6).double()
    with torch.no_grad():
        enc.embeddings.copy_(pos_emb[0].T)
    q, k, v = qkv()
    q = q * 2  # counts spread over the table and reach its clamp
    want = papers_cope_attention(q[0], k[0], v[0], pos_emb)
    for backend in ("eager", "sdpa"):
        torch.testing.assert_close(posenc_attention(enc, q, k, v, backend)[0], want, rtol=1e-10, atol=1e-10)
    # the term scaled with q·kᵀ (posenc before) is a different model: the probabilities move visibly
    with torch.no_grad():
        enc.embeddings.mul_(HEAD_DIM**-0.5)
    assert (posenc_attention(enc, q, k, v, "eager")[0] - want).abs().max() > 1e-2


@pytest.mark.parametrize("c", [0.1, 0.0, -0.3, 1e-30])
def test_fire_equals_its_papers_code_at_every_scale_training_can_reach(c):
    torch.manual_seed(1)
    enc = posenc.build("fire", num_heads=HEADS, width=6, init_threshold=4.0).double()
    with torch.no_grad():
        for parameter in enc.mlp.parameters():
            parameter.normal_(0, 1.0)
        enc.log_scale.fill_(c)
    want_bias = papers_fire_bias(LENGTH, enc.mlp, c, 4.0).detach()
    positions = torch.arange(LENGTH)[None]
    got_bias = enc.score_bias(positions, positions, torch.float64).detach()
    assert torch.isfinite(got_bias).all()
    torch.testing.assert_close(got_bias, want_bias, rtol=1e-10, atol=1e-10)
    q, k, v = qkv(seed=2)
    scores = (q @ k.transpose(-1, -2)) * HEAD_DIM**-0.5 + want_bias
    want = torch.softmax(scores.masked_fill(~torch.ones(LENGTH, LENGTH).tril().bool(), -math.inf), -1) @ v
    for backend in ("eager", "sdpa", "flex"):
        if serves(backend, enc, q, k, v):
            torch.testing.assert_close(posenc_attention(enc, q, k, v, backend), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant, multiplier, inner", [("log", 2.0, 1.0), ("power", 1.0, 2.0)])
def test_kerple_starts_in_its_papers_code_ranges(variant, multiplier, inner):
    """The code draws the log kernel's multiplier from (0, 2) and its inner scale from (0, 1); the power
    kernel's multiplier from (0, 1) and its exponent from (0, 2)."""
    torch.manual_seed(0)
    enc = posenc.build("kerple", num_heads=4000, variant=variant)
    for parameter, top in ((enc.scale, multiplier), (enc.shape, inner)):
        assert parameter.min() > 0 and parameter.max() < top and parameter.max() > 0.99 * top


@pytest.mark.parametrize("name, kwargs, spoil", [
    ("fire", dict(num_heads=HEADS), lambda e: e.log_scale.fill_(float("nan"))),
    ("kerple", dict(num_heads=HEADS), lambda e: e.scale.fill_(float("nan"))),
    ("t5", dict(num_heads=HEADS), lambda e: e.table.fill_(float("nan"))),
    ("cope", dict(head_dim=HEAD_DIM), lambda e: e.embeddings.fill_(float("nan"))),
])
def test_a_nan_from_an_encoding_is_an_error_naming_it_on_every_backend(name, kwargs, spoil):
    enc = posenc.build(name, **kwargs).double()
    with torch.no_grad():
        spoil(enc)
    q, k, v = qkv()
    for backend in ("eager", "sdpa"):
        if serves(backend, enc, q, k, v):
            with pytest.raises(ValueError, match=f"{type(enc).__name__} gave a NaN"):
                posenc_attention(enc, q, k, v, backend)


def test_a_row_with_no_allowed_key_still_attends_to_nothing():
    q, k, v = qkv()
    mask = torch.ones(1, 1, LENGTH, LENGTH, dtype=torch.bool)
    mask[..., 3, :] = False  # query 3 may see nothing
    out = posenc.attention(q, k, v, posenc.build("alibi", num_heads=HEADS), mask=mask, backend="eager")
    assert (out[0, :, 3] == 0).all() and torch.isfinite(out).all()
