"""Argument checks that raise a ValueError naming the parameter and the valid range.

Every public entry point validates its input here, before any tensor work, so a
user sees "head_dim must be an even integer >= 2, got 7" instead of a shape error
from deep inside a matmul.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def even_int(name: str, value: object) -> int:
    if positive_int(name, value, minimum=2) % 2:
        raise ValueError(f"{name} must be an even integer >= 2, got {value!r}")
    return int(value)


def positive_float(name: str, value: object, *, minimum: float = 0.0, inclusive: bool = False) -> float:
    """A finite number above ``minimum`` (or at it, ``inclusive``): infinity is refused too (an infinite base,
    factor or rate yields NaN downstream, not an answer)."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        number = float(value) if is_number else float("nan")
    except OverflowError:  # an int past float's range
        number = float("inf")
    if not (number >= minimum if inclusive else number > minimum) or not math.isfinite(number):
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return number


def each_once(flag: str, names) -> None:
    """A ValueError naming ``flag`` and the first value it gives twice: a repeat would be one row run twice, or
    dropped without a word."""
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{flag} names {name!r} twice; give each once")
        seen.add(name)


def choice(name: str, value: object, options: tuple[str, ...] | list[str]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {sorted(options)}, got {value!r}")
    return value


def batched_positions(name: str, value: Tensor) -> Tensor:
    """Positions of shape (T,) or (B or 1, T), the one convention of the public API, as (B or 1, T)."""
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value)
    if value.dim() == 1:
        return value.unsqueeze(0)
    if value.dim() != 2:
        raise ValueError(f"{name} must have shape (T,) or (B or 1, T), got {tuple(value.shape)}")
    return value


def positions(name: str, value: Tensor, length: int, batch: int) -> Tensor:
    """Validate explicit positions and return them as int64 (B or 1, T)."""
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value)
    if value.dtype.is_floating_point or value.dtype == torch.bool or value.is_complex():
        raise ValueError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    value = integer_positions(name, value, length, batch, "the tensors")
    if value.dim() == 1:
        value = value.unsqueeze(0)
    if not torch.compiler.is_compiling() and value.numel() and int(value.min()) < 0:
        # Reading values would break a torch.compile graph: eager calls check them, compiled
        # ones (where positions are almost always the model's own arange) only their shape.
        raise ValueError(f"{name} must be >= 0, got minimum {int(value.min())}")
    return value.long()


def integer_positions(name: str, value: Tensor, length: int, batch: int, against: str) -> Tensor:
    """``value``, integer positions of shape (T,) or (B or 1, T) matching ``length`` and ``batch`` (of the tensor
    ``against`` names); their values are not read (compiled graphs and GPUs pay for that)."""
    if not isinstance(value, Tensor) or value.dtype.is_floating_point or value.dtype == torch.bool \
            or value.is_complex():
        raise ValueError(f"{name} must be an integer tensor, got {getattr(value, 'dtype', type(value).__name__)}")
    if value.dim() not in (1, 2) or value.shape[-1] != length \
            or (value.dim() == 2 and value.shape[0] not in (1, batch)):
        raise ValueError(f"{name} must have shape ({length},) or ({batch}, {length}) to match {against}, "
                         f"got {tuple(value.shape)}")
    return value


def rotated_tensors(q: Tensor, k: Tensor, head_dim: int) -> None:
    """q (B, H, Tq, Dh) and k (B, Hkv, Tk, Dh) of a rotation: 4-D floating tensors of one batch, Dh ``head_dim``."""
    for name, tensor in (("q", q), ("k", k)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 4 or not tensor.dtype.is_floating_point:
            raise ValueError(f"{name} must be a 4-D floating-point tensor (B, H, T, Dh), got "
                             f"{getattr(tensor, 'dtype', type(tensor).__name__)} {tuple(getattr(tensor, 'shape', ()))}")
        if tensor.shape[3] != head_dim:
            raise ValueError(f"the encoding was built for head_dim={head_dim} but {name} has Dh={tensor.shape[3]}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must share the batch B, got {q.shape[0]} and {k.shape[0]}")


def embedded_tensor(x: Tensor, positions: Tensor, dim: int) -> Tensor:
    """x (B, T, D) of an input-door encoding of width ``dim`` and its positions, (T,) or (B or 1, T), returned."""
    if not isinstance(x, Tensor) or x.dim() != 3 or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a 3-D floating-point tensor (B, T, D), got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if x.shape[2] != dim:
        raise ValueError(f"the encoding was built for dim={dim} but x has D={x.shape[2]}")
    return integer_positions("positions", positions, x.shape[1], x.shape[0], "x")


def attention_tensors(q: Tensor, k: Tensor, v: Tensor, encoding) -> None:
    """q, k, v of ``attention()``: 4-D, of one dtype, shapes that agree with each other and with the encoding."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 4:
            shape = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, H, T, D), got {shape}")
    one_dtype(q, k, v)
    if not hasattr(encoding, "num_heads"):
        hint = f": build it first, posenc.build({encoding!r}, ...)" if isinstance(encoding, str) else ""
        raise ValueError(f"encoding must be a module from posenc.build, one at positions (encoding.at) or None, got "
                         f"{type(encoding).__name__}{hint}")
    if q.shape[1] == 0 or k.shape[1] == 0:
        raise ValueError(f"q and k must have at least one head each (H, Hkv >= 1), got H={q.shape[1]} and "
                         f"Hkv={k.shape[1]}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q, k and v must be floating-point tensors (float16, bfloat16, float32 or float64), "
                         f"got {q.dtype}")
    if k.shape[:2] != v.shape[:2] or k.shape[0] != q.shape[0] or q.shape[1] % k.shape[1]:
        raise ValueError(
            "q, k, v must share the batch B, and k, v the heads Hkv, with the query heads H a multiple of "
            f"Hkv (grouped-query attention): got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"q and k must have the same head width Dh: got {q.shape[3]} and {k.shape[3]}")
    if v.shape[2] != k.shape[2]:
        raise ValueError(f"k and v must have the same length Tk: got {k.shape[2]} and {v.shape[2]}")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"q and k must hold at least one position each (Tq, Tk >= 1), got Tq={q.shape[2]} and "
                         f"Tk={k.shape[2]}")
    if encoding.num_heads is not None and encoding.num_heads != q.shape[1]:
        raise ValueError(
            f"the encoding was built for num_heads={encoding.num_heads} but the tensors have H={q.shape[1]} heads"
        )
    head_dim = getattr(encoding, "head_dim", None)
    if head_dim is not None and head_dim != q.shape[3]:
        raise ValueError(f"the encoding was built for head_dim={head_dim} but the tensors have Dh={q.shape[3]}")


def one_dtype(q: Tensor, k: Tensor, v: Tensor) -> None:
    """q, k and v of one dtype: attention's kernels read all three in q's."""
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype} and {v.dtype}")


def attention_scale(scale: object) -> None:
    """None (1/√Dh) or a finite number > 0: a NaN or infinite logit scale makes every weight NaN or a hard max."""
    if scale is not None and not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
                                  and 0 < float(scale) < float("inf")):
        raise ValueError(f"scale must be None (1/sqrt(Dh)) or a finite number > 0, got {scale!r}")


def attention_mask(mask: Tensor, shape: tuple[int, int, int, int]) -> None:
    """A bool mask broadcastable to (B, H, Tq, Tk)."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = may attend), got {getattr(mask, 'dtype', type(mask))}")
    if mask.dim() != 4 or any(m not in (1, s) for m, s in zip(mask.shape, shape)):
        raise ValueError(f"mask must be 4-D, each dim 1 or that of (B, H, Tq, Tk) = {tuple(shape)}, got "
                         f"{tuple(mask.shape)}")


def sink_logits(sink, heads: int) -> None:
    """A ValueError unless ``sink`` is None or a tensor of one logit per query head, shape (heads,)."""
    if sink is not None and (not isinstance(sink, torch.Tensor) or sink.shape != (heads,)):
        raise ValueError(f"sink must be a tensor of one logit per query head, shape ({heads},), "
                         f"got {tuple(sink.shape) if isinstance(sink, torch.Tensor) else type(sink).__name__}")
