"""Fused paths: operations the encodings need, written to move as few bytes as possible.

Each kernel here has a plain formula elsewhere in the package that it must equal
(tests compare them in float64, gradients included).
"""

from .rope import rope_angles, rope_cos_sin, rotate_pairs, rotate_pairs_

__all__ = ["rope_angles", "rope_cos_sin", "rotate_pairs", "rotate_pairs_"]
