"""posenc: positional encodings for transformers, every scheme once, correct and measurable.

Shape alphabet used throughout: B batch, T sequence, Tq/Tk query/key lengths, H heads,
D model width, Dh head width, F = rotated Dh / 2 frequency pairs, V vocabulary.
Positions are explicit int64 tensors, (T,) or (B, T); ``offset = q_position - k_position``.
"""

from .attention import BACKENDS, attention, attention_weights, choose_backend
from .encodings import (
    ENCODINGS,
    SCALINGS,
    Entry,
    PositionalEncoding,
    alibi_slopes,
    apply_rope,
    build,
    layer_scalings,
    register,
    rope_frequencies,
    sinusoidal_table,
    t5_bucket,
)
from .positions import (cross_attention_positions, document_mask, document_positions, grid_positions,
                        multimodal_positions, patch_positions, randomized_positions, skipwise_positions)

__version__ = "0.1.0"

__all__ = [
    "BACKENDS", "ENCODINGS", "SCALINGS", "Entry", "PositionalEncoding", "alibi_slopes", "apply_rope", "attention",
    "attention_weights",
    "build", "choose_backend", "cross_attention_positions", "document_mask", "document_positions",
    "grid_positions", "layer_scalings", "multimodal_positions", "patch_positions", "randomized_positions",
    "register", "rope_frequencies", "skipwise_positions", "sinusoidal_table", "t5_bucket",
]
