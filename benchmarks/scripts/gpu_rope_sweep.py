"""The Triton RoPE kernels against ``copy_`` of the same bytes, at a few tilings, on one GPU (issue #53, item 2).

q (8, 32, 4096, 128) and k (8, 8, 4096, 128) in bf16, cos/sin (1, 1, 4096, 64) in float32. Contenders: ``copy_``
of q and k into existing tensors (the floor: a rotation reads and writes the same bytes), the out-of-place kernel
and the in-place kernel at each tiling, the interleaved layout at the default tiling, the backward pass's two
gradient launches, and the model's case (q and k slices of one qkv projection, 32 heads each) against ``copy_``
of as many bytes. Device time by CUDA events over REPS back-to-back calls; every round times each contender once, in
turn; medians over rounds of the time and of the per-round ratio to the baseline. Each tiling is first checked
against ``rotate_pairs``. Finishes in well under a minute on an H200.

    PYTHONPATH=src python3 benchmarks/scripts/gpu_rope_sweep.py
"""

import statistics

import torch

from posenc.encodings.scaling import rope_frequencies
from posenc.kernels import rope_cos_sin, rotate_pairs
from posenc.kernels.rope_triton import TILING, Tiling, _rotated, rope_qk_triton, rope_qk_triton_

BATCH, LENGTH, HEADS, KV_HEADS, HEAD_DIM = 8, 4096, 32, 8, 128
TILINGS = (Tiling(pairs=2048, heads=1, warps=4), Tiling(pairs=2048, heads=4, warps=4), TILING,
           Tiling(pairs=1024, heads=4, warps=2))
ROUNDS, REPS = 25, 10


def timed(contenders: dict, baseline: str) -> dict[str, tuple[float, float]]:
    """{name: (median ms per call, median ratio to the baseline's time in the same round)}."""
    for call in contenders.values():  # compile and warm up
        call()
    torch.cuda.synchronize()
    ms = {name: [] for name in contenders}
    for _ in range(ROUNDS):
        for name, call in contenders.items():
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(REPS):
                call()
            stop.record()
            stop.synchronize()
            ms[name].append(start.elapsed_time(stop) / REPS)
    return {name: (statistics.median(samples), statistics.median(s / b for s, b in zip(samples, ms[baseline])))
            for name, samples in ms.items()}


def main() -> None:
    cuda = torch.device("cuda")
    q = torch.randn(BATCH, HEADS, LENGTH, HEAD_DIM, device=cuda, dtype=torch.bfloat16)
    k = torch.randn(BATCH, KV_HEADS, LENGTH, HEAD_DIM, device=cuda, dtype=torch.bfloat16)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    positions = torch.arange(LENGTH, device=cuda)[None]
    cos, sin = rope_cos_sin(positions, rope_frequencies(HEAD_DIM)[0].to(cuda))  # (1, 1, T, F) float32
    tables = (cos, sin, cos, sin)

    for tiling in TILINGS:  # every tiling gives rotate_pairs' values, in place and out of place
        for layout in ("half", "interleaved"):
            want = rotate_pairs(q[:1], cos, sin, layout), rotate_pairs(k[:1], cos, sin, layout)
            got = rope_qk_triton(q[:1], k[:1], *tables, layout, tiling)
            got_ = rope_qk_triton_(q[:1].clone(), k[:1].clone(), *tables, layout, tiling)
            for a, b in zip((*got, *got_), want * 2):
                torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)

    # In-place contenders rotate the same tensors again and again: a rotation keeps norms, so values stay bounded.
    contenders = {"copy_ (baseline)": lambda: (q_out.copy_(q), k_out.copy_(k))}
    for tiling in TILINGS:
        name = f"pairs={tiling.pairs} heads={tiling.heads} warps={tiling.warps}"
        contenders[f"out of place {name}"] = lambda t=tiling: rope_qk_triton(q, k, *tables, "half", t)
        contenders[f"in place     {name}"] = lambda t=tiling: rope_qk_triton_(q, k, *tables, "half", t)
    contenders["in place interleaved (default tiling)"] = lambda: rope_qk_triton_(q, k, *tables, "interleaved")
    contenders["backward: q's then k's gradient, new tensors"] = lambda: (
        _rotated(q, q[:, :0], tables, "half", -1.0, TILING), _rotated(k, k[:, :0], tables, "half", -1.0, TILING))

    qkv = torch.randn(BATCH, LENGTH, 3, HEADS, HEAD_DIM, device=cuda, dtype=torch.bfloat16).permute(2, 0, 3, 1, 4)
    same_bytes = torch.empty_like(qkv[:2].contiguous()), torch.empty_like(qkv[:2].contiguous())  # (2, B, H, T, Dh)
    model = {  # (3, B, H, T, Dh) views, as the model's projection gives them; copy_ of views is slower: not the floor
        "copy_ of q and k's bytes, contiguous (baseline)": lambda: same_bytes[1].copy_(same_bytes[0]),
        "in place on the qkv views (default tiling)": lambda: rope_qk_triton_(qkv[0], qkv[1], *tables, "half")}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; q {tuple(q.shape)}, k {tuple(k.shape)} bf16; "
          f"default {TILING}; {ROUNDS} rounds of {REPS} calls")
    with torch.no_grad():
        for group, baseline in ((contenders, "copy_ (baseline)"), (model, next(iter(model)))):
            for name, (ms, ratio) in timed(group, baseline).items():
                print(f"{name:54s} {ms:7.3f} ms  {ratio:5.2f}x copy_")


if __name__ == "__main__":
    main()
