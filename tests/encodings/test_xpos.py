"""xPos against a float64 loop written from the paper's absolute form (tests/oracles.py) and its decay; its
rotation's dtypes and settings."""

import pytest
import torch

import posenc
from posenc.encodings.xpos import XPos
from tests.encodings.oracle_attention import HEAD_DIM, HEADS, LENGTH, assert_attention_equals_oracle, qkv
from tests.oracles import xpos_logits_loop

FAR = 2**40  # a position whose float64 angles carry an ulp of 2^-12


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


def test_xpos_rotates_in_the_inputs_dtype_and_its_tables_in_float64():
    xpos = XPos(8, scale_base=16.0)
    assert xpos.decay().dtype == torch.float64 and xpos.decay(torch.float32).dtype == torch.float32
    q = torch.randn(1, 2, 5, 8)
    turned_q, turned_k = xpos.rotate(q, q, torch.arange(5)[None], torch.arange(5)[None])
    assert turned_q.dtype == turned_k.dtype == torch.float32
    # far out the tables are formed in float64 and only then rounded: float32 keeps its own precision
    wide = xpos.rotate(q.double(), q.double(), torch.arange(FAR, FAR + 5)[None], torch.arange(FAR, FAR + 5)[None])
    narrow = xpos.rotate(q, q, torch.arange(FAR, FAR + 5)[None], torch.arange(FAR, FAR + 5)[None])
    for a, b in zip(narrow, wide):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=2e-6)


def test_xpos_keys_are_recomputed_per_call_and_its_repr_names_its_settings():
    xpos = XPos(8, base=500.0, layout="interleaved", scale_base=16.0)
    assert xpos.length_dependent is True  # its origin moves with the queries: caches keep keys unrotated
    assert repr(xpos) == "XPos(head_dim=8, layout='interleaved', base=500.0, scale_base=16.0)"


def test_a_bad_constructor_argument_names_the_parameter():
    with pytest.raises(ValueError, match="scale_base must be"):
        posenc.build("xpos", head_dim=8, scale_base=-1.0)
