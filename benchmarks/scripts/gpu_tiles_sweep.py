"""The Triton tiles' terms apart, and their block sizes, on a lent GPU: forward + backward of
``kernels.tiles_triton`` at (1, 16, 16,384, 64) bf16 causal with no term, ALiBi's and Kerple's formulas (Kerple's
parameters learned), an offset table read per pair (fixed: Sandwich; learned: its gradient by diagonal sums), the
same learned table flat past offset 128 (T5's last bucket, one read per tile there), FoX's token values and FIRE's
MLP as segments (the query's position in every pair; its parameters learned, the segment table rebuilt per call as
a model rebuilds it per forward), under each tile setting, beside SDPA without positions, round-robin.

    python3 benchmarks/scripts/gpu_tiles_sweep.py [B H T Dh]

Prints one line per (setting, contender): median ms over rounds and the ratio to SDPA's median. Each setting
compiles its kernels once (a few seconds); the whole sweep is about a minute and a half on an H200.
"""

from __future__ import annotations

import statistics
import sys

import torch
import torch.nn.functional as F

from posenc.encodings import FIRE
from posenc.kernels import tiles_triton

#: ``tiles_triton.Tiles`` as ``tiles_triton._blocks`` returns them: the timed setting, the one FIRE and explicit
#: positions take (chosen by compiling: no spills), and the timed tiles with 8 warps
SETTINGS = (tiles_triton.TIMED, tiles_triton.UNTIMED, tiles_triton.Tiles(128, 64, 8, 64, 8, 3))
ROUNDS = 10


def main(batch: int = 1, heads: int = 16, length: int = 16384, width: int = 64) -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, width, device=device, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    upstream = torch.randn(batch, heads, length, width, device=device, dtype=torch.bfloat16)
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, device=device) / heads)
    fixed = -slopes[:, None] * torch.arange(length, device=device)[None, :]  # ALiBi's table of offsets 0..T-1
    learned = torch.randn(heads, length, device=device, requires_grad=True)
    flat = torch.randn(heads, length, device=device)
    flat[:, 128:] = flat[:, 128:129]
    flat.requires_grad_()
    alibi = tiles_triton.Formula("linear", torch.stack([-slopes, torch.zeros_like(slopes)], 1))
    kerple = tiles_triton.Formula("kerple_log", (torch.rand(heads, 2, device=device) + 0.1).requires_grad_())
    tokens = torch.nn.functional.logsigmoid(torch.randn(batch, heads, length, device=device) + 3).cumsum(-1)
    tokens.requires_grad_()
    fire = FIRE(heads).to(device)
    scale = width ** -0.5
    contenders = {
        "sdpa (no positions)": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), []),
        "tiles, no term": (lambda: tiles_triton.tiled_attention(q, k, v, scale=scale), []),
        "tiles, alibi formula": (lambda: tiles_triton.tiled_attention(q, k, v, scale=scale, formula=alibi), []),
        "tiles, kerple formula": (lambda: tiles_triton.tiled_attention(q, k, v, scale=scale, formula=kerple),
                                  [kerple.params]),
        "tiles, fixed table": (lambda: tiles_triton.tiled_attention(q, k, v, scale=scale, table=fixed), []),
        "tiles, learned table": (lambda: tiles_triton.tiled_attention(q, k, v, scale=scale, table=learned),
                                 [learned]),
        "tiles, flat learned table": (lambda: tiles_triton.tiled_attention(q, k, v, scale=scale, table=flat,
                                                                          flat=(-1, 128)), [flat]),
        "tiles, token values": (lambda: tiles_triton.tiled_attention(q, k, v, scale=scale, token_values=tokens),
                                [tokens]),
        "tiles, fire segments": (lambda: tiles_triton.tiled_attention(
            q, k, v, scale=scale, formula=tiles_triton.Formula(*fire.offset_formula())), list(fire.parameters())),
    }
    original = tiles_triton._blocks
    for setting in SETTINGS:
        tiles_triton._blocks = lambda x, value_dim, kind, contiguous, s=setting: s
        runs = {name: (lambda f=f, w=[q, k, v, *extra]: torch.autograd.grad(f(), w, upstream))
                for name, (f, extra) in contenders.items()}
        try:
            times = _round_robin(runs)
        except Exception as error:  # a setting the chip cannot hold (shared memory): say so, try the next
            print(f"setting {tuple(setting)}: failed: {str(error).splitlines()[0][:200]}", flush=True)
            continue
        base = times["sdpa (no positions)"]
        for name, ms in times.items():
            print(f"setting {tuple(setting)} | {name:26s} | {ms:8.3f} ms | {ms / base:5.2f}x sdpa", flush=True)
    tiles_triton._blocks = original


def _round_robin(runs: dict) -> dict[str, float]:
    for run in runs.values():  # compile and warm up
        run()
    samples = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            samples[name].append(start.elapsed_time(end))
    return {name: statistics.median(values) for name, values in samples.items()}


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
