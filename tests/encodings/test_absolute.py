import math

import pytest
import torch

import posenc
from tests.oracles import sinusoid_loop


def test_seed_worked_example_pe5_d4():
    # Seed 001/004: PE(5) for d=4.
    table = posenc.sinusoidal_table(torch.tensor([5]), 4)[0]
    torch.testing.assert_close(table, torch.tensor([-0.9589, 0.2837, 0.0500, 0.9988], dtype=torch.float64), atol=1e-4, rtol=0)


def test_seed_003_pe1_d128_follows_the_formula_not_the_printed_d512_values():
    row = posenc.sinusoidal_table(torch.tensor([1]), 128)[0, :4]
    torch.testing.assert_close(row, torch.tensor([0.8415, 0.5403, 0.7617, 0.6479], dtype=torch.float64), atol=1e-4, rtol=0)
    # The seed prints 0.8218, 0.5697: those are the d=512 values.
    row512 = posenc.sinusoidal_table(torch.tensor([1]), 512)[0, 2:4]
    torch.testing.assert_close(row512, torch.tensor([0.8218, 0.5697], dtype=torch.float64), atol=1e-4, rtol=0)


@pytest.mark.parametrize("dim", [2, 8, 64])
@pytest.mark.parametrize("position", [0, 1, 37, 1000, 2**20 - 1])
def test_sinusoidal_table_matches_formula_loop(dim, position):
    got = posenc.sinusoidal_table(torch.tensor([position]), dim)[0]
    torch.testing.assert_close(got, torch.tensor(sinusoid_loop(position, dim), dtype=torch.float64), atol=1e-9, rtol=0)  # angle ~1e6 rad: float64 ulp ~1e-10


def solve_shift_map(positions, dim, shift):
    p = posenc.sinusoidal_table(positions, dim)  # (N, d)
    shifted = posenc.sinusoidal_table(positions + shift, dim)
    m_t = torch.linalg.lstsq(p, shifted, driver="gelsd").solution  # (d, d), P·Mᵀ = P_shifted
    return m_t.t(), (p @ m_t - shifted).abs().max()


def test_shift_is_a_linear_map_made_of_2x2_rotations():
    # Seed 003's exercise: PE(p + 7) = M_7 PE(p) for the first 100 positions, by least squares.
    dim, shift = 16, 7
    _, residual = solve_shift_map(torch.arange(100), dim, shift)
    assert residual < 1e-10
    # Over 0..99 the slowest pairs barely turn (0.03 rad), so their columns are nearly
    # collinear and least squares cannot pin M down; positions spread to 10^4 can.
    m, residual = solve_shift_map(torch.arange(100) * 101, dim, shift)
    assert residual < 1e-10
    expected = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        w = shift / 10000 ** (2 * i / dim)
        expected[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]], dtype=torch.float64
        )
    assert (m - expected).abs().max() < 1e-6


def test_sinusoidal_embed_adds_table():
    enc = posenc.build("sinusoidal", dim=8)
    x = torch.zeros(2, 5, 8)
    out = enc.embed(x, torch.arange(3, 8).unsqueeze(0))
    torch.testing.assert_close(out[1], posenc.sinusoidal_table(torch.arange(3, 8), 8).float())


def test_learned_beyond_error_names_position_and_table_size():
    enc = posenc.build("learned", max_positions=16, dim=4)
    with pytest.raises(ValueError, match=r"position 20 .*max_positions=16"):
        enc.embed(torch.zeros(1, 21, 4), torch.arange(21).unsqueeze(0))


def test_learned_interpolate_resamples_the_table_keeping_endpoints():
    enc = posenc.build("learned", max_positions=16, dim=4, beyond="interpolate")
    rows = enc.rows(torch.arange(31))
    assert rows.shape == (31, 4)
    torch.testing.assert_close(rows[0], enc.table[0])
    torch.testing.assert_close(rows[30], enc.table[15])
    torch.testing.assert_close(rows[2], enc.table[1])  # 31 rows over 16: row 2k sits on old row k
    assert enc.table.shape == (16, 4)  # no new parameters


def test_learned_extend_grows_new_rows_and_keeps_old_ones():
    enc = posenc.build("learned", max_positions=8, dim=4, beyond="extend")
    old = enc.table.detach().clone()
    rows = enc.rows(torch.arange(12))
    assert enc.table.shape == (12, 4)
    torch.testing.assert_close(rows[:8], old)


def test_odd_dim_is_rejected():
    with pytest.raises(ValueError, match="dim must be an even integer"):
        posenc.build("sinusoidal", dim=7)


def test_negative_positions_rejected():
    with pytest.raises(ValueError, match="positions must be >= 0"):
        posenc.sinusoidal_table(torch.tensor([-1, 2]), 4)
