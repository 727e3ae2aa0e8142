"""The Triton RoPE kernel's device time against its host launch cost, beside ``copy_`` of the same bytes (CUDA).

`posenc bench --tables rope` times each call synchronised, which at small shapes measures the host. This splits
the two: a call's synchronised wall time; 100 calls back to back timed by CUDA events (device throughput, in GB/s
of q and k read and written); and the host time to queue one call. Run by ``benchmarks/scripts/gpu.sh``.
"""

import time

import torch

from posenc.encodings.scaling import rope_frequencies
from posenc.kernels import rope_cos_sin, rope_qk_triton, rotate_pairs

SHAPES = ((4, 16, 2048, 64), (8, 32, 8192, 128))  # the bench's shape, and one large enough to hide the launch


def probe(call, moved_bytes: int, calls: int = 100) -> str:
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    walls = []
    for _ in range(31):
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    for _ in range(calls):
        call()
    last.record()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    device = first.elapsed_time(last) / calls  # ms
    return (f"synced wall {sorted(walls)[15] * 1e3:.3f} ms, back-to-back {device:.3f} ms/call "
            f"({moved_bytes / 1e6 / device:.0f} GB/s), host launch {host * 1e3:.3f} ms")


def main() -> None:
    for shape in SHAPES:
        q, k = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        cos, sin = rope_cos_sin(torch.arange(shape[2], device="cuda")[None], rope_frequencies(shape[3])[0])
        moved = 4 * q.numel() * q.element_size()  # q and k, each read once and written once
        print(shape, "copy_:", probe(lambda: (q_out.copy_(q), k_out.copy_(k)), moved))
        print(shape, "triton:", probe(lambda: rope_qk_triton(q, k, cos, sin, cos, sin, "half"), moved))
        rotated = rope_qk_triton(q, k, cos, sin, cos, sin, "half")[0].float()
        print("max |triton - rotate_pairs|", (rotated - rotate_pairs(q, cos, sin).float()).abs().max().item())


if __name__ == "__main__":
    main()
