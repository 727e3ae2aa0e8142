"""Values wider than a Triton kernel's tiles fit a GPU's shared memory (``WIDEST``) run by blocks of columns
(``tiles_triton.by_value_columns``), under TRITON_INTERPRET=1 on CPU tensors: each kernel with ``WIDEST`` narrowed
equals itself with v whole, in its output and every gradient, in float32 and bfloat16 (each its own limit).
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
    # WIDEST narrowed to (16-bit, float32) = (16, 32): blocks of 16, 16 and 8 columns in bf16, of 32 and 8 in float32
    for dtype, tolerance, blocks_seen in ((torch.float32, 1e-5, [8, 32]), (torch.bfloat16, 3e-2, [8, 16])):
        for name, (module, attend, terms) in calls.items():
            results, launched, seen = [], [], []
            module.widths = lambda q, value_dim, widths=tiles_triton.widths: launched.append(value_dim) or widths(
                q, value_dim)
            kept = module.WIDEST
            for widest in (kept, (16, 32)):
                module.WIDEST = widest
                launched.clear()
                inputs = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [x.clone().requires_grad_()
                                                                              for x in terms]
                out = attend(*inputs)
                assert out.shape == (1, heads, length, value_width), (name, out.shape)
                upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
                results.append((out.detach(), *torch.autograd.grad(out, inputs, upstream)))
                seen.append(sorted(set(launched)))
            assert seen == [[value_width], blocks_seen], (name, dtype, seen)  # each launch's value width
            module.WIDEST, module.widths = kept, tiles_triton.widths
            whole, blocks = results
            assert blocks[0].transpose(1, 2).is_contiguous(), name  # token-major, as the kernels return it
            # the output is v whole's; a 16-bit gradient sums blocks each rounded to bf16
            for index, (a, b) in enumerate(zip(whole, blocks)):
                error = float((a.double() - b.double()).abs().max() / a.double().abs().max())
                assert error < (1e-6 if index == 0 else tolerance), (name, dtype, index, error)
    print("ok")
    """))
