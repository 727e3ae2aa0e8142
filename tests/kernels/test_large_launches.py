"""Every Triton kernel on launches past the limits of int32 offsets and of CUDA's grid, under TRITON_INTERPRET=1 on
CPU tensors.

- **Rows past 2^31 elements.** A token-major (B, T, H, Dh) tensor passes 2^31 elements once T·H·Dh does: 2^20
  tokens of 32 heads of 64. Its rows are addressed as row·stride; in int32 that product wraps and the kernel reads
  or writes other memory. Here q, k and v are views of one float16 storage of 5.3 GB whose token rows lie 2^25
  elements apart, so tokens 64 to 79 start past 2^31; only the rows' own pages are ever touched. Each kernel must
  give, bit for bit, what it gives on the same values laid out densely: outputs, and the gradients of q, k, v and
  its parameters.
- **More batch rows than a grid axis holds.** CUDA caps a grid's second and third axes at 65,535 programs; a batch
  of many short sequences passes that. Every launch for a batch of 70,000 must keep those axes within it.
"""

import importlib.util
import textwrap

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
                (shaw, (torch.randn(1, 9, width), torch.randn(1, 9, width))), (cope, (torch.randn(tokens + 1, width),)))

    def rope_tables(tokens, width):
        # cos and sin (1, 1, T, Dh / 2) of RoPE at positions 0 .. T - 1, for q and for k
        inv_freq = 10000.0 ** (-torch.arange(width // 2, dtype=torch.float64) / (width // 2))
        angles = torch.arange(tokens, dtype=torch.float64)[None, None, :, None] * inv_freq
        return (angles.cos().float(), angles.sin().float()) * 2
    """
)

WIDE_ROWS = KERNELS + textwrap.dedent(
    """
    TOKENS, HEADS, WIDTH = 80, 2, 16
    STRIDE = 1 << 25  # elements between token rows: row 64 starts at 2^31
    storage = torch.empty((TOKENS - 1) * STRIDE + 3 * HEADS * WIDTH, dtype=torch.float16)  # untouched but for rows
    assert (TOKENS - 1) * STRIDE >= 1 << 31

    def wide(*dense):
        # each (1, H, T, D) tensor copied into storage token-major (row t at t * STRIDE, the tensors side by side),
        # as a leaf that requires grad
        views, column = [], 0
        for x in dense:
            view = torch.empty(0, dtype=x.dtype).set_(storage.untyped_storage(), column, x.shape,
                                                      (0, x.shape[3], STRIDE, 1))
            view.copy_(x)
            views.append(view.requires_grad_())
            column += x.shape[1] * x.shape[3]
        return views

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, TOKENS, WIDTH, dtype=torch.float16) for _ in range(3))
    for run, values in runners(HEADS, TOKENS, WIDTH):
        results = []
        for tensors in (wide(q, k, v), [x.clone().requires_grad_() for x in (q, k, v)]):
            own = [p.clone().requires_grad_() for p in values]
            out = run(*tensors, *own)
            results.append((out, *torch.autograd.grad(out, (*tensors, *own), torch.ones_like(out))))
        for name, a, b in zip(("out", "dq", "dk", "dv", "dparam"), *results):
            assert torch.equal(a, b), (run.__name__, name, float((a.float() - b.float()).abs().max()))

    # RoPE in place on the wide rows, against the out-of-place rotation of dense copies
    wide_q, wide_k = (x.detach() for x in wide(q, k))
    rope_qk_triton_(wide_q, wide_k, *rope_tables(TOKENS, WIDTH))
    for a, b in zip((wide_q, wide_k), rope_qk_triton(q, k, *rope_tables(TOKENS, WIDTH))):
        assert torch.equal(a, b), float((a.float() - b.float()).abs().max())
    print("ok")
    """
)

MANY_ROWS = KERNELS + textwrap.dedent(
    """
    from triton.runtime.interpreter import InterpretedFunction

    grids = []

    def launch_only(self, *args, grid, warmup, **kwargs):  # records the grid: 70,000 programs would take an hour
        grids.append((self.fn.__name__, tuple(grid)))

    InterpretedFunction.run = launch_only
    BATCH, HEADS, TOKENS, WIDTH = 70_000, 2, 1, 16
    q, k, v = (torch.randn(BATCH, HEADS, TOKENS, WIDTH, requires_grad=True) for _ in range(3))
    for run, values in runners(HEADS, TOKENS, WIDTH):
        out = run(q, k, v, *values)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    rope_qk_triton(q, k, *rope_tables(TOKENS, WIDTH))
    assert len(grids) == 15, grids
    for name, grid in grids:
        assert grid[0] >= BATCH and all(size <= 65_535 for size in grid[1:]), (name, grid)
    print("ok")
    """
)


def test_rows_past_two_to_the_31_elements_are_addressed_in_int64():
    assert run_interpreted(WIDE_ROWS).strip().endswith("ok")


def test_a_batch_past_the_grid_axes_limit_rides_on_the_first_axis():
    assert run_interpreted(MANY_ROWS).strip().endswith("ok")
