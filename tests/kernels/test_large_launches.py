"""Every Triton kernel on launches past the limits of int32 offsets and of CUDA's grid, under TRITON_INTERPRET=1 on
CPU tensors.

- **Offsets past 2^31 elements.** A token-major (B, T, H, Dh) tensor passes 2^31 elements once T·H·Dh does (2^20
  tokens of 32 heads of 64), a head-major one once H·T·Dh does (32 heads of 2^20 tokens of 64). Its rows, heads
  and batch rows are addressed as index·stride; in int32 that product wraps and the kernel reads or writes other
  memory. Here q, k, v and the gradient flowing back are views of one float16 storage of 5.3 GB laid out three
  ways: token rows 2^25 elements apart (tokens 64 to 79 start past 2^31), heads 2^30 apart, batch rows 2^30
  apart; only the rows' own pages are ever touched. Each kernel must give, bit for bit, what it gives on the same
  values laid out densely: outputs, and the gradients of q, k, v and its parameters. The outputs and gradients a
  kernel allocates itself are dense and small here; ``test_every_row_offset_is_taken_in_int64`` holds their offsets
  to the same int64 form.
- **More programs than a grid's second axis holds.** CUDA caps a grid's second and third axes at 65,535; batch
  rows times heads pass that at 4,096 sequences of 16 heads. Every launch has one axis, over (batch row, head,
  tile).
"""

import importlib.util
import re
import textwrap
from pathlib import Path

import pytest

from tests.kernels.interpreted import run_interpreted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (the test extra)")

KERNELS = textwrap.dedent(
    """
    import torch
    from posenc.kernels.counts_triton import counts_attention
    from posenc.kernels.lookups_triton import lookup_attention
    from posenc.kernels.rope_triton import rope_qk_triton, rope_qk_triton_
    from posenc.kernels.sticks_triton import stick_breaking_attention
    from posenc.kernels.tiles_triton import Formula, tiled_attention

    def alibi(q, k, v, slopes):
        return tiled_attention(q, k, v, scale=0.25, formula=Formula("linear", slopes))
    def t5(q, k, v, table):
        return tiled_attention(q, k, v, scale=0.25, causal=False, table=table, lowest=1 - q.shape[2])
    def sticks(q, k, v):
        return stick_breaking_attention(q, k, v, scale=0.25, attend_current=False)
    def transformer_xl(q, k, v, table, content_shift, lookup_shift):
        return lookup_attention(q, k, v, table, content_shift=content_shift, lookup_shift=lookup_shift, scale=0.25)
    def shaw(q, k, v, table, values):
        return lookup_attention(q, k, v, table, values=values, scale=0.25)
    def cope(q, k, v, table):
        return counts_attention(q, k, v, table, scale=0.25, gate_scale=1.0)

    def runners(heads, tokens, width):
        # each runner with its parameters' values, for q (B, heads, tokens, width)
        return ((alibi, (torch.rand(heads, 2),)), (t5, (torch.randn(heads, 2 * tokens - 1),)), (sticks, ()),
                (transformer_xl, (torch.randn(heads, tokens, width), torch.randn(heads, width),
                                  torch.randn(heads, width))),
                (shaw, (torch.randn(1, 9, width), torch.randn(1, 9, width))),
                (cope, (torch.randn(tokens + 1, width),)))

    def rope_tables(tokens, width):
        # cos and sin (1, 1, T, Dh / 2) of RoPE at positions 0 .. T - 1, for q and for k
        inv_freq = 10000.0 ** (-torch.arange(width // 2, dtype=torch.float64) / (width // 2))
        angles = torch.arange(tokens, dtype=torch.float64)[None, None, :, None] * inv_freq
        return (angles.cos().float(), angles.sin().float()) * 2
    """
)

WIDE = KERNELS + textwrap.dedent(
    """
    WIDTH, FAR = 16, 1 << 30
    storage = torch.empty(79 * (1 << 25) + 8 * WIDTH, dtype=torch.float16)  # untouched but for the rows written
    # (B, H, T) and the strides of b, h and t: rows, heads or batch rows reaching past 2^31 elements
    LAYOUTS = {"token rows": ((1, 2, 80), (0, 4 * WIDTH, 1 << 25)), "heads": ((1, 3, 20), (0, FAR, 4 * WIDTH)),
               "batch rows": ((3, 1, 20), (FAR, 20 * 4 * WIDTH, 4 * WIDTH))}

    def wide(strides, *dense):
        # each (B, H, T, D) tensor copied into storage with the layout's strides, the tensors side by side in each
        # row, as leaves that require grad
        views = []
        for column, x in enumerate(dense):
            view = storage.as_strided(x.shape, (*strides, 1), column * WIDTH)  # (set_ would touch every page)
            view.copy_(x)
            views.append(view.detach().requires_grad_())
        return views

    torch.manual_seed(0)
    for layout, (shape, strides) in LAYOUTS.items():
        assert max(size - 1 for size in shape) * max(strides) >= 1 << 31
        q, k, v, upstream = (torch.randn(*shape, WIDTH, dtype=torch.float16) for _ in range(4))
        for run, values in runners(shape[1], shape[2], WIDTH):
            results = []
            for tensors in (wide(strides, q, k, v, upstream), [x.clone().requires_grad_() for x in (q, k, v, upstream)]):
                own = [p.clone().requires_grad_() for p in values]
                out = run(*tensors[:3], *own)
                grad = tensors[3].detach()
                results.append((out, *torch.autograd.grad(out, (*tensors[:3], *own), grad)))
            for name, a, b in zip(("out", "dq", "dk", "dv", "dparam"), *results):
                assert torch.equal(a, b), (layout, run.__name__, name, float((a.float() - b.float()).abs().max()))

        # RoPE in place on the wide rows, against the out-of-place rotation of dense copies
        wide_q, wide_k = (x.detach() for x in wide(strides, q, k))
        rope_qk_triton_(wide_q, wide_k, *rope_tables(shape[2], WIDTH))
        for a, b in zip((wide_q, wide_k), rope_qk_triton(q, k, *rope_tables(shape[2], WIDTH))):
            assert torch.equal(a, b), (layout, float((a.float() - b.float()).abs().max()))
    print("ok")
    """
)

GRIDS = KERNELS + textwrap.dedent(
    """
    import triton
    from triton.runtime.interpreter import InterpretedFunction
    from tests.kernels.triton_targets import gpu_sizes

    launches = []

    def launch_only(self, *args, grid, warmup, **kwargs):  # records the launch; 70,000 programs would take an hour
        launches.append((self.fn.__name__, tuple(grid), kwargs))

    InterpretedFunction.run = launch_only
    gpu_sizes()  # the tile sizes of an H100/H200
    for batch, tokens in ((70_000, 1), (3, 200)):
        launches.clear()
        heads, width = 2, 16
        q, k, v = (torch.randn(batch, heads, tokens, width, requires_grad=True) for _ in range(3))
        for run, values in runners(heads, tokens, width):
            out = run(q, k, v, *values)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        rope_qk_triton(q, k, *rope_tables(tokens, width))
        assert len(launches) == 15, [name for name, _, _ in launches]
        for name, grid, constants in launches:
            block = constants.get("BLOCK_T") or constants.get("BLOCK") or constants[
                "BLOCK_N" if name == "backward_keys" else "BLOCK_M"]
            rows = heads * 2 // constants["HEADS"] if name == "_rope_tiles" else heads  # RoPE: q's and k's groups
            assert grid == (triton.cdiv(tokens, block) * batch * rows,), (name, grid, block)
    print("ok")
    """
)


def test_offsets_past_two_to_the_31_elements_are_taken_in_int64():
    assert run_interpreted(WIDE).strip().endswith("ok")


def test_every_launch_has_one_grid_axis_over_batch_rows_heads_and_tiles():
    assert run_interpreted(GRIDS).strip().endswith("ok")


def test_every_row_offset_is_taken_in_int64():
    """No kernel multiplies an index vector by a stride itself: ``along`` does it in int64."""
    kernels = Path(__file__).resolve().parents[2] / "src" / "posenc" / "kernels"
    int32_products = [(path.name, line) for path in sorted(kernels.glob("*.py")) for line in path.read_text().splitlines()
                      if re.search(r"\]\s*\*\s*s_\w+", line)]
    assert not int32_products, int32_products
    assert "along(" in (kernels / "tiles_jit.py").read_text()
