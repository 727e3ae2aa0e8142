"""RoPE's documented math dtype, its memo per dtype, every head rotating, and its repr: what the rotary tests left
unpinned. A float32 input rotates in float32 (the speed the kernels are built for), a float64 input in float64 (the
oracle's precision at position 2^20), and one positioned object serves both without handing one the other's
tables."""

import pytest
import torch

from posenc.encodings import apply_rope
from posenc.encodings.rotary import RoPE
from posenc.kernels import rope_cos_sin, rotate_pairs

FAR = 2**20


def _inputs(dtype, heads=2, kv_heads=2):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, 12, 16, generator=generator, dtype=torch.float64).to(dtype)
    k = torch.randn(1, kv_heads, 12, 16, generator=generator, dtype=torch.float64).to(dtype)
    positions = torch.arange(FAR, FAR + 12)[None]
    return q, k, positions


def _by_math(x, positions, inv_freq, math):
    return rotate_pairs(x, *rope_cos_sin(positions, inv_freq, 1.0, math))


def test_a_float32_input_rotates_in_float32_math_and_a_float64_one_in_float64():
    rope = RoPE(16)
    inv_freq, _ = rope.frequencies()
    q32, k32, positions = _inputs(torch.float32)
    in_float32 = _by_math(q32, positions, inv_freq, torch.float32)
    assert not torch.equal(_by_math(q32, positions, inv_freq, torch.float64), in_float32)  # the math shows
    assert torch.equal(apply_rope(q32, positions, inv_freq), in_float32)
    assert torch.equal(rope.rotate(q32, k32, positions, positions)[0], in_float32)
    keys_elsewhere = rope.rotate(q32, k32, positions, positions + 5)[1]  # keys' own tables, also float32 math
    assert torch.equal(keys_elsewhere, _by_math(k32, positions + 5, inv_freq, torch.float32))
    q64, _, _ = _inputs(torch.float64)
    assert torch.equal(apply_rope(q64, positions, inv_freq), _by_math(q64, positions, inv_freq, torch.float64))


def test_one_positioned_object_keeps_separate_tables_per_math_dtype():
    """A float32 pass first, then a float64 pass on the same positions: the second must not reuse the first's
    float32 tables (at 2^20 their rounding, ~1e-7, is far above float64's)."""
    rope = RoPE(16)
    inv_freq, _ = rope.frequencies()
    q32, k32, positions = _inputs(torch.float32)
    q64, k64, _ = _inputs(torch.float64)
    at = rope.at(positions, positions + 3)
    rope.rotate_positioned(at, q32, k32)
    q_rotated, k_rotated = rope.rotate_positioned(at, q64, k64)
    torch.testing.assert_close(q_rotated, _by_math(q64, positions, inv_freq, torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(k_rotated, _by_math(k64, positions + 3, inv_freq, torch.float64), rtol=0, atol=1e-12)
    assert rope.rotate_positioned(at, q32, k32)[0].dtype == torch.float32


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_rotary_heads_equal_to_every_head_is_plain_rope(kv_heads):
    q, k, positions = _inputs(torch.float64, heads=4, kv_heads=kv_heads)
    every = RoPE(16, rotary_heads=4).rotate(q, k, positions, positions)
    plain = RoPE(16).rotate(q, k, positions, positions)
    for got, want in zip(every, plain):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_repr_names_rotary_heads_only_when_some_heads_are_nope():
    scaling = "{'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 1.0}"
    assert repr(RoPE(8)) == f"RoPE(head_dim=8, layout='half', scaling={scaling})"
    assert repr(RoPE(8, rotary_heads=2)) == f"RoPE(head_dim=8, layout='half', scaling={scaling}, rotary_heads=2)"
