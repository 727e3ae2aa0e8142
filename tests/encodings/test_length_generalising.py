"""Kerple, Sandwich, FIRE, xPos and CoPE against float64 loops written from their papers'
equations (tests/oracles.py), and the relations between them and older schemes."""

import math

import pytest
import torch

import posenc
from posenc.attention import serves
from tests.oracles import (cope_logits_loop, fire_bias_loop, kerple_bias_loop, naive_attention,
                           sandwich_bias_loop, xpos_logits_loop)

HEADS, HEAD_DIM, LENGTH = 3, 8, 9


def qkv(length=LENGTH, heads=HEADS, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, heads, length, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(3))


def assert_attention_equals_oracle(enc, bias, q, k, v, causal=True, atol=1e-10, **kwargs):
    """posenc's attention (every backend that serves) = softmax(q·kᵀ/√Dh + bias)·v one query at a time."""
    length = q.shape[2]
    allowed = torch.ones(length, length).tril().bool() if causal else None
    for backend in ("eager", "sdpa", "flex"):
        if not serves(backend, enc, q, k, v):
            continue
        with torch.no_grad():
            got = posenc.attention(q, k, v, enc, causal=causal, backend=backend, **kwargs)
        for h in range(q.shape[1]):
            want = naive_attention(q[0, h], k[0, h], v[0, h], bias=bias[h], allowed=allowed)
            torch.testing.assert_close(got[0, h], want, rtol=atol, atol=atol, msg=f"{backend}, head {h}")


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_equals_the_papers_kernels(variant):
    enc = posenc.build("kerple", num_heads=HEADS, variant=variant).double()
    with torch.no_grad():
        enc.scale.copy_(torch.tensor([0.5, 1.5, -1.0], dtype=torch.float64))  # the last clamps to 0.01
        enc.shape.copy_(torch.tensor([0.3, 1.0, 3.0], dtype=torch.float64))  # power: 3 clamps to 2
    r1, r2 = [0.5, 1.5, 0.01], [0.3, 1.0, 3.0 if variant == "log" else 2.0]
    bias = kerple_bias_loop(LENGTH, r1, r2, variant)
    for causal in (True, False):
        assert_attention_equals_oracle(enc, bias, *qkv(), causal=causal)


def test_kerple_power_with_unit_exponent_is_alibi():
    alibi = posenc.build("alibi", num_heads=4)
    kerple = posenc.build("kerple", num_heads=4, variant="power").double()
    with torch.no_grad():
        kerple.scale.copy_(torch.tensor(alibi.slope_values, dtype=torch.float64))
        kerple.shape.fill_(1.0)
    positions = torch.arange(20)[None]
    kept = slice(0, 3)  # the fourth slope, 2^-8, is below Kerple's clamp at 0.01
    torch.testing.assert_close(kerple.score_bias(positions, positions, torch.float64)[:, kept],
                               alibi.score_bias(positions, positions, torch.float64).abs().neg()[:, kept])


def test_sandwich_equals_the_papers_bias_at_any_offset():
    enc = posenc.build("sandwich", num_heads=HEADS, sinusoid_dim=16)
    q, k, v = qkv()
    bias = sandwich_bias_loop(list(range(LENGTH)), HEADS, 16)
    for causal in (True, False):
        assert_attention_equals_oracle(enc, bias, q, k, v, causal=causal)
        far = torch.arange(2**20, 2**20 + LENGTH)  # angle addition about the last query: exact far out
        assert_attention_equals_oracle(enc, bias, q, k, v, causal=causal, q_positions=far, k_positions=far)
    positions = torch.arange(LENGTH)[None]
    assert enc.score_bias(positions, positions, torch.float64)[0, :, 4, 4].abs().max() < 1e-12  # 0 at distance 0


def test_fire_equals_the_papers_formula_and_interpolates_into_the_unit_interval():
    torch.manual_seed(0)
    enc = posenc.build("fire", num_heads=HEADS, width=5, init_threshold=4.0).double()
    with torch.no_grad():
        for parameter in enc.mlp.parameters():
            parameter.normal_(0, 1.0)
    first, second = enc.mlp[0], enc.mlp[2]
    for start in (0, 2**20):
        positions = list(range(start, start + LENGTH))
        weights = [p.detach() for p in (first.weight, first.bias, second.weight, second.bias)]
        bias = fire_bias_loop(positions, float(enc.log_scale.detach()), 4.0, *weights)
        p = torch.tensor(positions)
        assert_attention_equals_oracle(enc, bias, *qkv(), causal=True, q_positions=p, k_positions=p)
    # every distance a query sees maps into [0, 1]; the farthest key of a late query to exactly 1
    queries = torch.arange(100, 120)[None]
    x = enc.interpolated_distance(queries, torch.arange(120)[None], torch.float64)
    seen = x[0][torch.arange(120)[None, :] <= queries[0][:, None]].detach()
    assert seen.min() == 0 and seen.max() == pytest.approx(1.0)


def test_xpos_equals_the_papers_absolute_form_and_decays():
    enc = posenc.build("xpos", head_dim=HEAD_DIM, scale_base=16.0)
    q, k, v = qkv()
    theta = enc.frequencies()[0].tolist()  # RoPE's float32 frequencies, as transformers has them
    logits = torch.stack([xpos_logits_loop(q[0, h], k[0, h], list(range(LENGTH)), theta, 16.0) for h in range(HEADS)])
    bias = logits * HEAD_DIM**-0.5 - torch.einsum("hid,hjd->hij", q[0], k[0]) * HEAD_DIM**-0.5  # what xPos adds
    assert_attention_equals_oracle(enc, bias, q, k, v)
    far = torch.arange(2**20, 2**20 + LENGTH)  # the paper's absolute scales overflow there; the offsets do not
    # angles near 2^20 carry float64's ulp there, 2^-32
    assert_attention_equals_oracle(enc, bias, q, k, v, q_positions=far, k_positions=far, atol=1e-8)
    # the same unit vector at distance d scores ζ^(d/γ)-weighted cosines: the score decays with d
    ones = torch.ones(1, 1, 64, HEAD_DIM, dtype=torch.float64)
    turned_q, turned_k = enc.rotate(ones, ones, torch.arange(64)[None], torch.arange(64)[None])
    scores = (turned_q[0, 0, -1] * turned_k[0, 0]).sum(-1).flip(0)  # distance 0..63
    envelope = torch.tensor([sum(enc.decay()[c] ** (d / 16.0) for c in range(HEAD_DIM // 2)) * 2 for d in range(64)])
    assert scores.abs().le(envelope + 1e-9).all() and envelope[-1] < envelope[0] / 4


@pytest.mark.parametrize("causal", [True, False])
def test_cope_equals_the_papers_counting(causal):
    torch.manual_seed(0)
    enc = posenc.build("cope", head_dim=HEAD_DIM, max_positions=5).double()
    with torch.no_grad():
        enc.embeddings.normal_(0, 1.0)
    q, k, v = qkv()
    q = q * 2  # gates far from 1/2, so counts spread over the table and reach its clamp
    bias = torch.stack([cope_logits_loop(q[0, h], k[0, h], enc.embeddings.detach(), causal) for h in range(HEADS)])
    if causal:
        bias = bias.nan_to_num(neginf=0.0)  # masked pairs: the oracle's allowed mask removes them
    assert_attention_equals_oracle(enc, bias, q, k, v, causal=causal)


def test_cope_counts_only_what_each_query_may_see():
    """Counting stops at document edges and padding, so packed rows equal separate ones (the
    attention tests check that for every encoding); and counts never exceed the keys seen."""
    enc = posenc.build("cope", head_dim=HEAD_DIM)
    q, k, _ = qkv(length=12)
    positions = torch.arange(12)[None]
    counts = enc.contextual_positions(q, k, positions, positions, torch.ones(12, 12).tril().bool())
    seen = torch.arange(12)[:, None] - torch.arange(12)[None, :] + 1  # keys from j to i
    for head in counts[0]:
        assert (head <= seen.clamp(min=0)).all() and (head[seen <= 0] == 0).all() and (head[seen > 0] > 0).all()


def test_cope_counts_in_its_inputs_dtype_under_autocast():
    """Under bf16 autocast the counts (and the logits) are the float32 ones: bf16 holds no integer past 256, and
    CUDA's autocast summed in float32 beside bf16 products (lerp refused the mix)."""
    torch.manual_seed(0)
    enc = posenc.build("cope", head_dim=HEAD_DIM, max_positions=400)
    q, k = (torch.randn(1, 2, 300, HEAD_DIM).abs() for _ in range(2))  # gates near 1: counts near 300
    positions = torch.arange(300)[None]
    plain = enc.relative_logits(q, k, positions, positions)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        counts = enc.contextual_positions(q, k, positions, positions)
        autocast = enc.relative_logits(q, k, positions, positions)
    assert counts.dtype == autocast.dtype == torch.float32 and counts.max() > 256
    assert torch.equal(autocast, plain)


def test_bad_arguments_name_the_parameter():
    for build, message in [
        (lambda: posenc.build("kerple", num_heads=2, variant="cubic"), "variant must be one of"),
        (lambda: posenc.build("sandwich", num_heads=2, sinusoid_dim=7), "sinusoid_dim must be an even integer"),
        (lambda: posenc.build("fire", num_heads=2, init_c=0.0), "init_c must be"),
        (lambda: posenc.build("xpos", head_dim=8, scale_base=-1.0), "scale_base must be"),
        (lambda: posenc.build("cope", head_dim=8, max_positions=1), "max_positions must be an integer >= 2"),
    ]:
        with pytest.raises(ValueError, match=message):
            build()
    assert math.isinf(posenc.build("sandwich", num_heads=2).cpu_channels_from_keys)
