"""Fused paths: operations the encodings need, written to move as few bytes as possible.

Each kernel here has a plain formula elsewhere in the package that it must equal
(tests compare them in float64, gradients included).
"""

import functools
import importlib.util

from . import rope_cpu
from .rope import rope_angles, rope_cos_sin, rotate_pairs, rotate_pairs_


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def rope_qk_triton(*args, **kwargs):
    """``rope_triton.rope_qk_triton``, imported on first use (Triton is optional)."""
    from .rope_triton import rope_qk_triton as kernel

    return kernel(*args, **kwargs)


def rope_qk_triton_(*args, **kwargs):
    """``rope_triton.rope_qk_triton_`` (in place), imported on first use."""
    from .rope_triton import rope_qk_triton_ as kernel

    return kernel(*args, **kwargs)


__all__ = ["rope_angles", "rope_cos_sin", "rope_cpu", "rope_qk_triton", "rope_qk_triton_", "rotate_pairs", "rotate_pairs_",
           "triton_available"]
