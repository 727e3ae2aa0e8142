"""``posenc verify`` fails where the code it checks is wrong: each check family is run against a deliberately broken
version of what it checks (the bugs the seeds warn of: angles formed in float32, a KV cache one position off, an
encoding that ignores positions), and its rows, and only those, fail. tests/test_verify.py: every row passes on the
code as it is."""

import torch

from posenc import attention as posenc_attention
from posenc import verify
from posenc.encodings import ALiBi
from posenc.kernels import rotate_pairs

CPU, FLOAT32 = torch.device("cpu"), torch.float32


def _failed(rows) -> set[tuple[str, str]]:
    return {(row.check, row.encoding) for row in rows if not row.passed}


def test_an_encoding_that_ignores_positions_breaks_no_symmetry_and_is_caught(monkeypatch):
    def alibi_ignored(q, k, v, encoding=None, **kwargs):
        return posenc_attention(q, k, v, None if isinstance(encoding, ALiBi) else encoding, **kwargs)

    monkeypatch.setattr(verify, "attention", alibi_ignored)
    assert _failed(verify.check_permutation(CPU, FLOAT32)) == {("permutation changes outputs", "alibi")}
    assert _failed(verify.check_dog_bites_man(CPU, FLOAT32)) == {("dog bites man != man bites dog", "alibi")}


def test_a_kv_cache_one_position_off_is_caught_for_every_encoding_that_reads_positions(monkeypatch):
    def one_off(q, k, v, encoding=None, *, q_positions=None, **kwargs):
        return posenc_attention(q, k, v, encoding, q_positions=None if q_positions is None else q_positions + 1,
                                **kwargs)

    monkeypatch.setattr(verify, "attention", one_off)
    failed = _failed(verify.check_backends_and_cache(CPU, FLOAT32))
    assert {check.split(" (")[0] for check, _ in failed} == {"KV-cache decoding = full pass"}
    for name in ("rope", "xpos", "t5", "shaw", "transformer_xl", "fire", "kerple", "sandwich", "stick-breaking"):
        assert ("KV-cache decoding = full pass (eager)", name) in failed, name
    # right either way, so rightly passed: NoPE and CoPE read no positions, and ALiBi's bias -m(i - j) moves a
    # query's every score alike when i moves, which softmax cannot see
    assert not {name for _, name in failed} & {"none", "cope", "alibi"}


def test_a_backend_that_drifts_from_eager_is_caught(monkeypatch):
    def sdpa_drifts(q, k, v, encoding=None, *, backend="auto", **kwargs):
        out = posenc_attention(q, k, v, encoding, backend=backend, **kwargs)
        return out * 1.001 if backend == "sdpa" else out

    served = {row.encoding for row in verify.check_backends_and_cache(CPU, FLOAT32) if row.check.startswith("sdpa")}
    monkeypatch.setattr(verify, "attention", sdpa_drifts)
    failed = _failed(verify.check_backends_and_cache(CPU, FLOAT32))
    assert {check for check, _ in failed} == {"sdpa agrees with eager"}  # its decoding drifts alike: that row passes
    assert {name for _, name in failed} == served and {"none", "rope", "alibi", "t5"} <= served


def test_rope_angles_formed_in_float32_are_caught_at_two_to_the_twenty(monkeypatch):
    """The seeds' numerics rule: at position 2^20 a float32 product position × frequency is off by ~0.06 rad."""
    def float32_angles(x, positions, inv_freq, attention_factor=1.0, layout="half"):
        angles = positions[:, None, :, None].float() * inv_freq.float()  # (B, 1, T, F), rounded to float32
        return rotate_pairs(x, angles.cos(), angles.sin(), layout)

    monkeypatch.setattr(verify, "apply_rope", float32_angles)
    rows = {row.check: row for row in verify.check_rope(CPU, FLOAT32)}
    assert not rows["scores depend only on offsets (shift 2^20, relative)"].passed
    assert rows["norms preserved (relative)"].passed and rows["interleaved = permuted half"].passed


def test_score_channels_without_their_key_side_are_caught(monkeypatch):
    real = verify.attend_with_channels
    monkeypatch.setattr(verify, "attend_with_channels",
                        lambda content, k, v, query_side, key_side, **kw: real(content, k, v, query_side,
                                                                               torch.zeros_like(key_side), **kw))
    assert {name for _, name in _failed(verify.check_score_channels(CPU, FLOAT32))} == {
        "alibi", "sandwich", "transformer_xl"}


def test_a_scaling_that_differs_from_transformers_is_caught_for_its_type_alone(monkeypatch):
    real = verify.rope_frequencies

    def yarn_off(head_dim, params=None, **kwargs):
        inv_freq, factor = real(head_dim, params, **kwargs)
        return inv_freq, factor * (1 + 1e-6) if params and params["rope_type"] == "yarn" else factor

    monkeypatch.setattr(verify, "rope_frequencies", yarn_off)
    assert _failed(verify.check_transformers()) == {("frequencies and attention factor = transformers", "rope+yarn")}


def test_a_sinusoid_table_of_another_base_is_not_the_seeds_rotation(monkeypatch):
    """Seed 003's M_7 is rotation blocks of angles 7 / 10000^(2i/d): a table of base 10001 still shifts linearly
    (the residual passes) but by other rotations."""
    monkeypatch.setattr(verify, "sinusoidal_table", lambda positions, dim: _sinusoids(positions, dim, 10001.0))
    failed = _failed(verify.check_sinusoid_shift())
    assert {check for check, _ in failed} == {"M_7 distance from 2x2 rotation blocks, positions 0..9999 step 101"}


def _sinusoids(positions: torch.Tensor, dim: int, base: float) -> torch.Tensor:
    """(T, dim) float64: sin and cos interleaved, as posenc's table, of any base (tested at 10000 against it)."""
    angles = positions.double()[:, None] / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)


def test_the_sinusoids_above_are_posencs_at_its_base():
    positions = torch.arange(0, 10000, 101)
    torch.testing.assert_close(_sinusoids(positions, 16, 10000.0), verify.sinusoidal_table(positions, 16),
                               rtol=0, atol=1e-12)
