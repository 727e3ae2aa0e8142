"""RoPE apply vs ``copy_`` of the same bytes, beside other libraries' RoPE, in one run.

A rotation reads q and k once and writes them once: the bytes of one copy. So the
baseline is ``copy_`` into existing tensors (the physical floor), and ``clone`` (the
same copy into freshly allocated memory, as any out-of-place op must) shows what the
allocation alone costs on this machine: on Linux, tensors this large are fresh pages
from the kernel, and their first touch costs about two copies' time. The in-place
rotation, which the model uses, allocates nothing. Every contender gets its cos/sin (or
frequencies) precomputed where its API allows, and rotates q and k of one shape.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch

from ..encodings.scaling import rope_frequencies
from ..kernels import rope_cos_sin, rope_qk_triton, rope_qk_triton_, rotate_pairs, rotate_pairs_, triton_available
from .timing import round_robin

BASELINE = "copy_ (baseline)"  # the contender every other is a ratio to


def _peers(q: torch.Tensor, k: torch.Tensor) -> dict[str, Callable[[], object]]:
    """Other implementations, each called as its documentation shows, when installed."""
    head_dim, length = q.shape[-1], q.shape[-2]
    peers = {}
    if importlib.util.find_spec("transformers"):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply

        angles = torch.arange(length, device=q.device, dtype=torch.float32)[:, None] * rope_frequencies(head_dim)[0].to(q.device)
        emb = torch.cat((angles, angles), dim=-1)[None]  # (1, T, Dh), as LlamaRotaryEmbedding returns
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        peers["transformers (Llama formula)"] = lambda: llama_apply(q, k, cos, sin)
    if importlib.util.find_spec("rotary_embedding_torch"):
        from rotary_embedding_torch import RotaryEmbedding

        rotary = RotaryEmbedding(dim=head_dim).to(q.device)
        peers["rotary-embedding-torch"] = lambda: (rotary.rotate_queries_or_keys(q), rotary.rotate_queries_or_keys(k))
    if importlib.util.find_spec("x_transformers"):
        from x_transformers.x_transformers import RotaryEmbedding as XRotary
        from x_transformers.x_transformers import apply_rotary_pos_emb as x_apply

        freqs, _ = XRotary(head_dim).to(q.device).forward_from_seq_len(length)  # (1, T, Dh)
        peers["x-transformers"] = lambda: (x_apply(q, freqs), x_apply(k, freqs))
    return peers


@torch.no_grad()
def bench_rope_apply(device: str = "cpu", dtype: torch.dtype = torch.float32, shape=(4, 16, 2048, 64),
                     rounds: int = 9) -> list[dict]:
    """Rows {contender, shape, ms, ratio (to copy_), ratio_low, ratio_high} for q and k of ``shape``."""
    device = torch.device(device)
    q, k = (torch.randn(*shape, device=device, dtype=dtype) for _ in range(2))
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    cos, sin = rope_cos_sin(torch.arange(shape[-2], device=device)[None], rope_frequencies(shape[-1])[0])
    contenders = {
        BASELINE: lambda: (q_out.copy_(q), k_out.copy_(k)),
        "clone (copy into new memory)": lambda: (q.clone(), k.clone()),
        "posenc rotate_pairs": lambda: (rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)),
        # What the model runs on CPU: q and k rotated inside their own storage (rotating back and
        # forth would keep values bounded, but any drift is irrelevant to a timing).
        "posenc rotate_pairs_ (in place)": lambda: (rotate_pairs_(q, cos, sin), rotate_pairs_(k, cos, sin)),
        **_peers(q, k),
    }
    if device.type == "cuda" and triton_available():
        contenders["posenc Triton (q and k, one launch)"] = lambda: rope_qk_triton(q, k, cos, sin, cos, sin, "half")
        # what the model runs on CUDA: the same launch, written into q and k
        contenders["posenc Triton in place (q and k, one launch)"] = (
            lambda: rope_qk_triton_(q, k, cos, sin, cos, sin, "half"))
    timed = round_robin(contenders, baseline=BASELINE, rounds=rounds, device=device, label="rope apply")
    return [{"contender": name, "shape": list(shape), **numbers} for name, numbers in timed.items()]
