"""``attention``'s flex backend: FlexAttention with the score bias as a ``score_mod`` and the masks as a block
mask, so no (B, H, Tq, Tk) tensor is built. Compiled on CUDA (``POSENC_FLEX_COMPILE=1`` compiles on CPU too,
with the system compiler; ``0`` never compiles); it has no backward pass on CPU.

Shapes: B batch, H heads, Tq/Tk query/key lengths, Dh head width, Dv value width.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
from torch import Tensor

from .blockwise import compute_dtype

FLEX_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what its compiled kernels take


def flex_backend(q: Tensor, k: Tensor, v: Tensor, at, causal: bool, mask: Tensor | None, scale: float,
                 plain_causal: bool = False) -> Tensor:
    """``attention``'s flex backend: q (B, H, Tq, Dh) and k (B, Hkv, Tk, Dh) already rotated, v (B, Hkv, Tk, Dv);
    ``at``: the encoding at its positions (``PositionedEncoding``). Returns (B, H, Tq, Dv)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    encoding, q_pos, k_pos = at.encoding, at.q_pos, at.k_pos
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    q_pos, k_pos = q_pos.expand(batch, q_len), k_pos.expand(batch, k_len)
    score_mod = None
    if encoding.has_bias and encoding.bias_from_offset:
        lowest, table = at.memo(("flex_table", q.dtype), lambda: _offset_table(at, q.dtype))

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + table[h, q_pos[b, q_idx] - k_pos[b, kv_idx] - lowest]
    elif encoding.has_bias:  # the bias reads query positions too: look the dense one up per pair
        dense = at.score_bias(compute_dtype(q.dtype)).to(q.dtype).expand(batch, heads, q_len, k_len)

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + dense[b, h, q_idx, kv_idx]

    block_mask = None
    if plain_causal and mask is None:
        block_mask = _plain_causal_block_mask(q_len, q.device)
    elif causal or mask is not None:
        full_mask = None if mask is None else mask.expand(batch, heads, q_len, k_len)

        def mask_mod(b, h, q_idx, kv_idx):
            keep = k_pos[b, kv_idx] <= q_pos[b, q_idx] if causal else q_idx >= 0
            return keep if full_mask is None else keep & full_mask[b, h, q_idx, kv_idx]

        mask_heads = None if mask is None or mask.shape[1] == 1 else heads
        build = functools.partial(create_block_mask, mask_mod, batch, mask_heads, q_len, k_len, device=q.device)
        block_mask = build() if mask is not None else at.memo(("flex_block_mask", causal, batch), build)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        kernel = _compiled_flex() if _flex_compiles(q) else flex_attention
        return kernel(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                      enable_gqa=k.shape[1] != q.shape[1])


@functools.lru_cache(maxsize=16)
def _plain_causal_block_mask(length: int, device: torch.device):
    """The block mask of causal attention at contiguous positions (as many queries as keys), one per (length,
    device), shared by every batch, head and call: built per call it cost ~7 ms on an H200, more than the attention
    it served."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx

    return create_block_mask(mask_mod, None, None, length, length, device=device)


def _offset_table(at, dtype: torch.dtype) -> tuple[int, Tensor]:
    """The bias depends only on (head, offset): (lowest offset, (H, N) table over every offset in range),
    N <= Tq + Tk - 1 for contiguous positions, looked up per pair by the score_mod."""
    lowest, highest = int(at.q_pos.min() - at.k_pos.max()), int(at.q_pos.max() - at.k_pos.min())
    table = at.encoding.offset_table(lowest, highest, int(at.q_pos.max()), at.q_pos.device, compute_dtype(dtype))
    # The table is in q's dtype: with bf16 inputs, torch 2.13's compiled CPU kernel
    # mis-computed a float32 table added to the score and cast back (errors ~2.5).
    return lowest, table.to(dtype)  # (H, N)


def _flex_compiles(q: Tensor) -> bool:
    """POSENC_FLEX_COMPILE: "1" always compile, "0" never, unset/"auto": compile on CUDA only.

    On CPU a compile costs ~20 s per new shape (e.g. per KV-cache step), while the
    uncompiled form gives the same numbers; auto never picks flex on CPU anyway.
    """
    setting = os.environ.get("POSENC_FLEX_COMPILE", "auto")
    return setting == "1" or (setting == "auto" and q.is_cuda)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)
