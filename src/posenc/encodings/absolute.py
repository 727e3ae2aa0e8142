"""Input-door encodings: a vector per position added to the token embedding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import checks
from .base import PositionalEncoding


def sinusoidal_table(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al. 2017 (arXiv:1706.03762), interleaved sin/cos.

    PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(p / base^(2i/dim)).

    Args:
        positions: (...,) integer positions >= 0 (any shape).
        dim: even encoding width.
        base: wavelength base.
    Returns:
        (..., dim) float64 table; cast it where you use it.
    """
    checks.even_int("dim", dim)
    checks.positive_float("base", base, minimum=1.0)
    positions = torch.as_tensor(positions)
    if positions.dtype.is_floating_point:
        raise ValueError(f"positions must be an integer tensor, got dtype {positions.dtype}")
    if not torch.compiler.is_compiling() and positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0, got minimum {int(positions.min())}")  # eager only, as in checks
    return sinusoid(positions.to(torch.float64), dim, base)


def sinusoid(values: Tensor, dim: int, base: float) -> Tensor:
    """Interleaved sin/cos of any real values (negative ones too). values: (...,) -> (..., dim)."""
    exponent = torch.arange(0, dim, 2, dtype=values.dtype, device=values.device) / dim  # (dim/2,)
    angles = values[..., None] * base ** -exponent  # (..., dim/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., dim)


class Sinusoidal(PositionalEncoding):
    """Fixed sinusoidal encoding added at the input; defined for every position.

    ``scale`` multiplies the table: 1.0 is the paper's, which pairs it with token
    embeddings multiplied by √D; a model with small embeddings passes a matching scale.
    """

    has_input = True

    def __init__(self, dim: int, base: float = 10000.0, scale: float = 1.0):
        super().__init__()
        self.dim = checks.even_int("dim", dim)
        self.base = checks.positive_float("base", base, minimum=1.0)
        self.scale = checks.positive_float("scale", scale)

    def embed(self, x: Tensor, positions: Tensor, seq_len: int | None = None) -> Tensor:
        """x: (B, T, D); positions: (T,) or (B or 1, T). Returns x + scale·PE(positions), (B, T, D)."""
        table = sinusoidal_table(checks.embedded_tensor(x, positions, self.dim), self.dim, self.base)  # (B or 1, T, D)
        return x + (self.scale * table).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, scale={self.scale:g}"


class Learned(PositionalEncoding):
    """A trained table of ``max_positions`` rows (GPT-2, BERT).

    ``beyond`` says what happens at positions >= max_positions:
      - ``"error"``: raise (the table has no such row);
      - ``"interpolate"``: resample the trained table linearly to the length needed
        (position interpolation for a learned table; no new parameters);
      - ``"extend"``: grow the table with freshly initialised rows (they are new
        parameters: rebuild the optimizer after the first call that grows it).
    """

    has_input = True

    def __init__(self, max_positions: int, dim: int, beyond: str = "error", init_std: float = 0.02):
        super().__init__()
        self.max_positions = checks.positive_int("max_positions", max_positions)
        self.dim = checks.positive_int("dim", dim)
        self.beyond = checks.choice("beyond", beyond, ("error", "interpolate", "extend"))
        self.init_std = checks.positive_float("init_std", init_std, inclusive=True)
        self.table = nn.Parameter(torch.randn(max_positions, dim) * init_std)  # (P, D)

    def rows(self, positions: Tensor, seq_len: int | None = None) -> Tensor:
        """positions: any integer shape (...,); seq_len: their maximum + 1 if known. Returns (..., D) rows."""
        if seq_len is not None:
            needed = seq_len
        elif not positions.numel():
            needed = 0
        else:
            low, high = torch.stack(torch.aminmax(positions)).tolist()  # one read back
            if low < 0:  # an index from the table's end otherwise
                raise ValueError(f"positions must be >= 0, got minimum {low}")
            needed = high + 1
        table = self.table
        if needed > table.shape[0]:
            if self.beyond == "error":
                raise ValueError(
                    f"position {needed - 1} is beyond the learned table: positions must be < "
                    f"max_positions={table.shape[0]} (or build with beyond='interpolate' or 'extend')"
                )
            if self.beyond == "extend":
                self._grow(needed)
                table = self.table
            else:
                table = resample_table(table, needed)
        return table[positions]

    def _grow(self, rows: int) -> None:
        extra = torch.randn(rows - self.table.shape[0], self.dim, device=self.table.device) * self.init_std
        grown = torch.cat((self.table.detach(), extra.to(self.table.dtype)))
        self.table = nn.Parameter(grown)

    def embed(self, x: Tensor, positions: Tensor, seq_len: int | None = None) -> Tensor:
        """x: (B, T, D); positions: (T,) or (B or 1, T). Returns x + table[positions], (B, T, D)."""
        return x + self.rows(checks.embedded_tensor(x, positions, self.dim), seq_len).to(x.dtype)

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, dim={self.dim}, beyond={self.beyond!r}"


def resample_table(table: Tensor, rows: int) -> Tensor:
    """Linearly resample a (P, D) table to (rows, D), keeping its first and last rows."""
    resized = F.interpolate(
        table.t().unsqueeze(0), size=rows, mode="linear", align_corners=True
    )  # (1, D, rows)
    return resized.squeeze(0).t()
