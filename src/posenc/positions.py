"""Explicit positions and the masks that come from them.

Positions are int64 tensors (T,) or (B, T), never "the index in this batch": KV-cache
decoding, packed documents, left padding and cross-attention are then choices of
positions and masks rather than special cases.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import checks

CROSS_ATTENTION_MODES = ("none", "query_only", "separate", "unified")


def default_positions(q_len: int, k_len: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """Keys at 0..Tk-1 and queries at the last Tq of them (prefill and KV-cache decoding).

    Returns:
        q_pos (1, Tq), k_pos (1, Tk), int64.
    """
    if q_len > k_len:
        raise ValueError(
            f"with default positions the queries are the last Tq of the Tk keys, so Tq ({q_len}) must be "
            f"<= Tk ({k_len}); pass q_positions and k_positions explicitly (e.g. for cross-attention)"
        )
    k_pos = torch.arange(k_len, device=device).unsqueeze(0)
    return k_pos[:, k_len - q_len :], k_pos


def document_positions(document_ids: Tensor) -> Tensor:
    """Positions that restart at 0 at every document boundary of a packed row.

    Args:
        document_ids: (..., T) integer id of each token's document, equal ids contiguous (a ValueError otherwise:
            ``document_mask`` would join a document's two parts that these positions number apart).
    Returns:
        (..., T) int64 positions.
    """
    document_ids = torch.as_tensor(document_ids)
    if document_ids.dtype.is_floating_point or document_ids.is_complex() or document_ids.dim() == 0:
        raise ValueError(f"document_ids must be an integer tensor of shape (..., T), got {document_ids.dtype} "
                         f"{tuple(document_ids.shape)}")
    index = torch.arange(document_ids.shape[-1], device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[..., 1:] = document_ids[..., 1:] != document_ids[..., :-1]
    ordered = document_ids.sort(dim=-1).values
    distinct = 1 + (ordered[..., 1:] != ordered[..., :-1]).sum(dim=-1)
    if document_ids.numel() and not torch.equal(starts.sum(dim=-1), distinct):
        raise ValueError("document_ids must keep each document's tokens together (equal ids contiguous): an id "
                         "returns after another document")
    start_index = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - start_index


def document_mask(q_document_ids: Tensor, k_document_ids: Tensor | None = None) -> Tensor:
    """True where query and key belong to the same document.

    Args:
        q_document_ids: (T,) or (B, Tq); k_document_ids: same form, (B, Tk); defaults to the queries'.
    Returns:
        (B or 1, 1, Tq, Tk) bool, ready for attention(mask=...).
    """
    k_document_ids = q_document_ids if k_document_ids is None else k_document_ids
    q_ids, k_ids = (_document_ids(name, ids) for name, ids in (("q_document_ids", q_document_ids),
                                                                ("k_document_ids", k_document_ids)))
    if q_ids.shape[0] != k_ids.shape[0] and 1 not in (q_ids.shape[0], k_ids.shape[0]):
        raise ValueError(f"q_document_ids and k_document_ids must share the batch B (or one of them be 1), got "
                         f"{q_ids.shape[0]} and {k_ids.shape[0]}")
    return (q_ids[:, :, None] == k_ids[:, None, :]).unsqueeze(1)


def _document_ids(name: str, ids) -> Tensor:
    """Integer document ids of shape (T,) or (B, T), as (B or 1, T)."""
    ids = torch.as_tensor(ids)
    if ids.dtype.is_floating_point or ids.is_complex() or ids.dim() not in (1, 2):
        raise ValueError(f"{name} must be an integer tensor of shape (T,) or (B, T), got {ids.dtype} "
                         f"{tuple(ids.shape)}")
    return torch.atleast_2d(ids)


def cross_attention_positions(mode: str, q_len: int, k_len: int) -> tuple[Tensor | None, Tensor | None]:
    """Query and key positions for cross-attention with a relative encoding (seed 004, Part VII).

    Decoder queries attend to encoder keys from another sequence. Call
    ``attention(q, k, v, encoding, q_positions=..., k_positions=..., causal=False)`` with:

    - ``"none"``: position-free cross-attention; returns (None, None): pass ``encoding=None``.
    - ``"query_only"``: queries rotated by their own positions 0..Tq-1, keys left unrotated
      (position 0 is the identity rotation): position information from the query side only.
    - ``"separate"``: decoder 0..Tq-1 and encoder 0..Tk-1 indexed independently;
      relative offsets across the two sequences carry no meaning.
    - ``"unified"``: one timeline, encoder first: keys 0..Tk-1, queries Tk..Tk+Tq-1.

    Returns:
        (q_pos (Tq,), k_pos (Tk,)) int64, or (None, None) for ``"none"``.
    """
    checks.choice("mode", mode, CROSS_ATTENTION_MODES)
    checks.positive_int("q_len", q_len)
    checks.positive_int("k_len", k_len)
    decoder, encoder = torch.arange(q_len), torch.arange(k_len)
    if mode == "none":
        return None, None
    if mode == "query_only":
        return decoder, torch.zeros(k_len, dtype=torch.long)
    if mode == "separate":
        return decoder, encoder
    return decoder + k_len, encoder


def grid_positions(frames: int, height: int, width: int, start: int = 0, time_interval: int = 1) -> Tensor:
    """M-RoPE positions of a (frames × height × width) grid of patches, row-major: (3, frames·height·width)
    int64 as (temporal, height, width), each axis counted from ``start`` (frames ``time_interval`` apart),
    as transformers' Qwen2-VL lays out an image or a video."""
    for name, value in (("frames", frames), ("height", height), ("width", width), ("time_interval", time_interval)):
        checks.positive_int(name, value)
    checks.positive_int("start", start, minimum=0)
    t, h, w = torch.meshgrid(torch.arange(frames) * time_interval, torch.arange(height), torch.arange(width),
                             indexing="ij")
    return torch.stack((t, h, w)).reshape(3, -1) + start


def multimodal_positions(segments: list, spatial_merge_size: int = 1) -> Tensor:
    """M-RoPE positions (3, T) of interleaved text and images, as transformers' ``get_rope_index``.

    ``segments``: in order, an int n for n text tokens, or a (frames, height, width) patch grid for
    an image or video (before ``spatial_merge_size`` merges height and width). Text counts on from
    where the last segment left off, on all three axes; a grid starts there and moves the count
    on by max(height, width) / spatial_merge_size.
    """
    checks.positive_int("spatial_merge_size", spatial_merge_size)
    pieces, current = [], 0
    for segment in segments:
        if isinstance(segment, int):
            pieces.append(torch.arange(checks.positive_int("text segment", segment)).expand(3, -1) + current)
            current += segment
        elif isinstance(segment, (tuple, list)) and len(segment) == 3:
            frames, height, width = segment
            if height % spatial_merge_size or width % spatial_merge_size:
                raise ValueError(f"image grid {tuple(segment)}: height and width must be multiples of "
                                 f"spatial_merge_size={spatial_merge_size}")
            pieces.append(grid_positions(frames, height // spatial_merge_size, width // spatial_merge_size, current))
            current += max(height, width) // spatial_merge_size
        else:
            raise ValueError(f"segments holds ints (text lengths) and (frames, height, width) grids, got {segment!r}")
    if not pieces:
        raise ValueError("segments is empty")
    return torch.cat(pieces, dim=1)


def patch_positions(height: int, width: int) -> Tensor:
    """2-D positions (2, height·width) int64, (row, column) of each patch in row-major order."""
    rows, columns = torch.meshgrid(torch.arange(checks.positive_int("height", height)),
                                   torch.arange(checks.positive_int("width", width)), indexing="ij")
    return torch.stack((rows, columns)).reshape(2, -1)


def randomized_positions(batch: int, length: int, max_position: int, generator: torch.Generator | None = None
                         ) -> Tensor:
    """Randomized positions (Ruoss et al. 2023, arXiv:2305.16843): per row, a sorted random subset
    of ``length`` distinct positions from [0, max_position). Training on them shows a model the
    positions (and distances) of sequences up to ``max_position`` long while it sees ``length``
    tokens; it is then evaluated on plain positions 0..T-1. (B, length) int64."""
    checks.positive_int("length", length)
    if checks.positive_int("max_position", max_position) < length:
        raise ValueError(f"max_position ({max_position}) must be at least the length ({length})")
    scores = torch.rand(checks.positive_int("batch", batch), max_position, generator=generator)
    return scores.topk(length, dim=-1).indices.sort(-1).values


def skipwise_positions(batch: int, window: int, target: int, chunks: int = 2,
                       generator: torch.Generator | None = None) -> Tensor:
    """PoSE's position ids (Zhu et al. 2023, arXiv:2309.10400): a ``window``-token sequence whose ids cover
    a ``target``-token context. Per row, the window is cut at ``chunks - 1`` random points into chunks
    c_0..c_{N-1} (each at least one token; lengths sum to ``window``); chunk i keeps consecutive ids,
    shifted by a skip u_i with u_0 = 0 and u_i drawn uniformly from [u_{i-1}, target - window], so ids
    increase, start at 0 and stay below ``target``. (B, window) int64.

    With ``target == window`` every skip is 0: the plain ids 0..window-1 (PoSE's control).
    """
    checks.positive_int("batch", batch)
    checks.positive_int("window", window)
    checks.positive_int("chunks", chunks)
    if chunks > window:
        raise ValueError(f"chunks ({chunks}) must be at most the window ({window}): every chunk holds a token")
    if checks.positive_int("target", target) < window:
        raise ValueError(f"target ({target}) must be at least the window ({window})")
    rows = []
    for _ in range(batch):
        cuts = (torch.randperm(window - 1, generator=generator)[: chunks - 1] + 1).sort().values
        lengths = torch.diff(torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([window])]))
        skips = [0]
        for _ in range(chunks - 1):
            low = skips[-1]
            skips.append(low + int(torch.randint(0, target - window - low + 1, (1,), generator=generator)))
        rows.append(torch.arange(window) + torch.tensor(skips).repeat_interleave(lengths))
    return torch.stack(rows)
