"""Values wider than a Triton kernel's tiles fit a GPU's shared memory (``WIDEST``) run by blocks of columns
(``tiles_triton.by_value_columns``), under TRITON_INTERPRET=1 on CPU tensors: each kernel with ``WIDEST`` narrowed
to 16 in float32 equals itself with v whole, in its output and every gradient (values of 40 columns: blocks of 16,
16 and 8).
Compiled for sm_90, heads of 64 with values of 512 asked for 232–416 KiB of shared memory (a block has 227)."""

import textwrap

from tests.kernels.interpreted import run_interpreted


def test_each_kernel_by_blocks_of_value_columns_equals_it_with_v_whole():
    run_interpreted(textwrap.dedent("""
    import torch
    from posenc.kernels import counts_triton, lookups_triton, sticks_triton, tiles_triton

    torch.manual_seed(0)
    heads, kv_heads, length, width, value_width = 4, 2, 24, 8, 40
    q, k, v = torch.randn(1, heads, length, width), torch.randn(1, kv_heads, length, width), torch.randn(
        1, kv_heads, length, value_width)
    gates = torch.randn(1, heads, length, dtype=torch.float64).cumsum(-1) * 0.1
    calls = {
        "tiles, a learned table": (tiles_triton, lambda q, k, v, table: tiles_triton.tiled_attention(
            q, k, v, scale=0.3, table=table), [torch.randn(heads, length)]),
        "tiles, token values": (tiles_triton, lambda q, k, v, gates: tiles_triton.tiled_attention(
            q, k, v, scale=0.3, token_values=gates), [gates]),
        "stick-breaking": (sticks_triton, lambda q, k, v: sticks_triton.stick_breaking_attention(
            q, k, v, scale=0.3, attend_current=True), []),
        "lookups with values": (lookups_triton, lambda q, k, v, table, values, floor, shift:
                                lookups_triton.lookup_attention(q, k, v, table, values=values, value_floor=floor,
                                                                content_shift=shift, scale=0.3),
                                [torch.randn(heads, 6, width), torch.randn(heads, 6, value_width),
                                 torch.randn(value_width), torch.randn(heads, width)]),
        "counts": (counts_triton, lambda q, k, v, table: counts_triton.counts_attention(
            q, k, v, table, scale=0.3, gate_scale=0.35), [torch.randn(5, width)]),
    }
    for name, (module, attend, terms) in calls.items():
        results, launched, seen = [], [], []
        module.widths = lambda q, value_dim, widths=tiles_triton.widths: launched.append(value_dim) or widths(
            q, value_dim)
        kept = module.WIDEST
        for widest in (kept, (32, 16)):  # float32's limit is the second
            module.WIDEST = widest
            launched.clear()
            inputs = [x.clone().requires_grad_() for x in (q, k, v, *terms)]
            out = attend(*inputs)
            assert out.shape == (1, heads, length, value_width), (name, out.shape)
            upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
            results.append((out.detach(), *torch.autograd.grad(out, inputs, upstream)))
            seen.append(sorted(set(launched)))
        assert seen == [[value_width], [8, 16]], (name, seen)  # each launch's value width: v whole, then blocks
        module.WIDEST, module.widths = kept, tiles_triton.widths
        whole, blocks = results
        for index, (a, b) in enumerate(zip(whole, blocks)):
            error = float((a - b).abs().max() / a.abs().max())
            assert error < 1e-5, (name, index, error)
    print("ok")
    """))
