"""CoPE's C++ kernel alone against SDPA's causal call, forward and backward, round-robin (one call of each per round,
medians and quartiles over rounds): the timing benchmarks/history.md quotes for the kernel's loops.

    python benchmarks/scripts/cpu_cope_kernel.py [--spread 1.0] [--rounds 9]

q and k are N(0, spread²) of width 32 with gates at 1/√32, so ``--spread 1`` gives gates σ(N(0, 1)) spread over
(0, 1), as a trained CoPE's are, and ``--spread 0.05`` gates near ½, as the tiny LM's at initialisation. The
shape is the default model's at 2,048 tokens: (2, 4, 2,048, 32), a table of 2,048 rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from posenc import checks
from posenc.bench.machine import describe, one_line
from posenc.kernels import gated_counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spread", type=float, default=1.0, help="the standard deviation of q and k's entries")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    try:
        checks.positive_float("--spread", args.spread)
        checks.positive_int("--rounds", args.rounds, minimum=2)  # quartiles need two
    except ValueError as error:
        parser.error(str(error))
    extension = gated_counts.extension()
    if extension is None:
        raise SystemExit("CoPE's kernel could not be built here")
    torch.manual_seed(0)
    batch, heads, length, width, rows = 2, 4, 2048, 32, 2048
    q, k, v = (torch.randn(batch, heads, length, width) * args.spread for _ in range(3))
    table = torch.randn(rows, width) * 0.02
    scale = gate_scale = width ** -0.5
    out, lse = extension.gated_counts_forward(q, k, v, table, scale, gate_scale)
    upstream = torch.randn_like(out)
    row_terms = (upstream * out).sum(-1).contiguous()
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def sdpa_both():
        F.scaled_dot_product_attention(*leaves, is_causal=True).backward(upstream)

    contenders = {
        "kernel forward": lambda: extension.gated_counts_forward(q, k, v, table, scale, gate_scale),
        "kernel backward": lambda: extension.gated_counts_backward(upstream, q, k, v, table, lse, row_terms, scale,
                                                                   gate_scale),
        "SDPA forward": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "SDPA forward + backward": sdpa_both,
    }
    times = {name: [] for name in contenders}
    for _ in range(args.rounds + 1):  # the first round warms up and is dropped
        for name, call in contenders.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    ratios = [(f + b) / s for f, b, s in zip(times["kernel forward"][1:], times["kernel backward"][1:],
                                             times["SDPA forward + backward"][1:])]
    print(f"{one_line(describe())}; q, k spread {args.spread}, {args.rounds} rounds")
    for name, values in times.items():
        print(f"{name}: {statistics.median(values[1:]) * 1e3:.1f} ms")
    low, middle, high = statistics.quantiles(ratios, n=4)
    print(f"kernel forward + backward / SDPA's: {middle:.2f} ({low:.2f}–{high:.2f})")


if __name__ == "__main__":
    main()
