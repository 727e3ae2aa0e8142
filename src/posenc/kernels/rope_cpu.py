"""RoPE's C++ kernel for CPU tensors (``rope_cpu.cpp``): one read and one write of every byte.

PyTorch's elementwise kernels run the rotation as four or more passes over half-width
strided views (5–6× a ``copy_`` of the same bytes on the 2-core EPYC); this kernel
walks each (batch, head, position) row once, with cos/sin from a table that stays in
cache. It is built as ``native`` builds every C++ kernel; where it
cannot be built (no C++ compiler or ninja) or ``POSENC_CPU_KERNELS=0``, callers use the
PyTorch form in ``rope.py``, which stays the reference the tests compare it with.

Shapes: B batch, H heads, T positions, Dh head width, F rotated pairs (2F <= Dh).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from torch import Tensor

from . import native

SOURCE = Path(__file__).with_name("rope_cpu.cpp")
MATH_DTYPES = (torch.float32, torch.float64)
ACTIVATION_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


PREFIX = "posenc_rope_cpu"


def build_name(source: bytes, torch_version: str = torch.__version__) -> str:
    """The extension's name for this source and torch: what was built decides where it is cached."""
    return native.build_name(PREFIX, source, torch_version)


@functools.cache
def extension():
    """The compiled module, or None where it is switched off or cannot be built (warned once)."""
    return native.load(PREFIX, SOURCE, "RoPE's C++ CPU kernel")


def serves(x: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Whether the kernel takes these tensors: CPU, eager, 4-D x with unit stride along Dh, and
    cos/sin of shape (1 or B, 1, T, F) in float32/float64."""
    if x.device.type != "cpu" or torch.compiler.is_compiling() or x.dim() != 4 or x.stride(-1) != 1:
        return False
    if x.dtype not in ACTIVATION_DTYPES or cos.dtype not in MATH_DTYPES or sin.dtype != cos.dtype:
        return False
    table = (cos.shape[0] if cos.shape[0] in (1, x.shape[0]) else -1, 1, x.shape[2], cos.shape[-1])
    if cos.dim() != 4 or tuple(cos.shape) != table or tuple(sin.shape) != table or 2 * cos.shape[-1] > x.shape[-1]:
        return False
    return extension() is not None


def rotate_into(x: Tensor, out: Tensor, cos: Tensor, sin: Tensor, layout: str, inverse: bool = False) -> Tensor:
    """Write the rotation of x into out (which may be x); ``inverse`` rotates by −angle. Returns out."""
    extension().rotate_pairs_cpu(x, out, cos.contiguous(), sin.contiguous(), layout == "interleaved", inverse)
    return out
