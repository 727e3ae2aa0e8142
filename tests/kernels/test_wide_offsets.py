"""Every Triton kernel on tensors whose rows lie past 2^31 elements, under TRITON_INTERPRET=1 on CPU tensors.

A token-major (B, T, H, Dh) tensor passes 2^31 elements once T·H·Dh does: 2^20 tokens of 32 heads of 64. Its rows
are addressed as row·stride; in int32 that product wraps and the kernel reads or writes other memory. Here q, k and v
are views of one float16 storage of 5.3 GB whose token rows lie 2^25 elements apart, so tokens 64 to 79 start past
2^31; only the rows' own pages are ever touched. Each kernel must give, bit for bit, what it gives on the same
values laid out densely: outputs, and the gradients of q, k, v and its parameters.
"""

import importlib.util
import textwrap

import pytest

from tests.kernels.interpreted import run_interpreted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (the test extra)")

CHECK = textwrap.dedent(
    """
    import torch
    from posenc.kernels.counts_triton import counts_attention
    from posenc.kernels.lookups_triton import lookup_attention
    from posenc.kernels.rope_triton import rope_qk_triton, rope_qk_triton_
    from posenc.kernels.sticks_triton import stick_breaking_attention
    from posenc.kernels.tiles_triton import Formula, tiled_attention

    TOKENS, HEADS, WIDTH = 80, 2, 16
    STRIDE = 1 << 25  # elements between token rows: row 64 starts at 2^31
    storage = torch.empty((TOKENS - 1) * STRIDE + 3 * HEADS * WIDTH, dtype=torch.float16)  # untouched but for rows
    assert (TOKENS - 1) * STRIDE >= 1 << 31

    def wide(*dense):
        '''Each (1, H, T, D) tensor copied into ``storage`` token-major: row t of every tensor at t·STRIDE, the tensors
        side by side in it; leaves that require grad.'''
        views, column = [], 0
        for x in dense:
            view = torch.empty(0, dtype=x.dtype).set_(storage.untyped_storage(), column, x.shape,
                                                      (0, x.shape[3], STRIDE, 1))
            view.copy_(x)
            views.append(view.requires_grad_())
            column += x.shape[1] * x.shape[3]
        return views

    def same(run, dense, parameters=()):
        '''run(q, k, v, *parameters) on wide and on dense copies of ``dense``: equal outputs and gradients.'''
        results = []
        for tensors in (wide(*dense), [x.clone().requires_grad_() for x in dense]):
            own = [p.clone().requires_grad_() for p in parameters]
            out = run(*tensors, *own)
            results.append((out, *torch.autograd.grad(out, (*tensors, *own), torch.ones_like(out))))
        for name, a, b in zip(("out", "dq", "dk", "dv", "dparam"), *results):
            assert torch.equal(a, b), (run.__name__, name, float((a.float() - b.float()).abs().max()))

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, TOKENS, WIDTH, dtype=torch.float16) for _ in range(3))

    def alibi(q, k, v, slopes):
        return tiled_attention(q, k, v, scale=0.25, formula=Formula("linear", slopes))
    def t5(q, k, v, table):
        return tiled_attention(q, k, v, scale=0.25, causal=False, table=table, lowest=-TOKENS)
    def sticks(q, k, v):
        return stick_breaking_attention(q, k, v, scale=0.25, attend_current=False)
    def transformer_xl(q, k, v, table, content_shift, lookup_shift):
        return lookup_attention(q, k, v, table, content_shift=content_shift, lookup_shift=lookup_shift, scale=0.25)
    def shaw(q, k, v, table, values):
        return lookup_attention(q, k, v, table, values=values, scale=0.25)
    def cope(q, k, v, table):
        return counts_attention(q, k, v, table, scale=0.25, gate_scale=1.0)

    same(alibi, (q, k, v), (torch.rand(HEADS, 2),))
    same(t5, (q, k, v), (torch.randn(HEADS, 2 * TOKENS),))
    same(sticks, (q, k, v))
    same(transformer_xl, (q, k, v), (torch.randn(HEADS, TOKENS, WIDTH), torch.randn(HEADS, WIDTH),
                                     torch.randn(HEADS, WIDTH)))
    same(shaw, (q, k, v), (torch.randn(1, 9, WIDTH), torch.randn(1, 9, WIDTH)))
    same(cope, (q, k, v), (torch.randn(TOKENS, WIDTH),))

    # RoPE in place on the wide rows, against the out-of-place rotation of dense copies
    inv_freq = 10000.0 ** (-torch.arange(WIDTH // 2, dtype=torch.float64) / (WIDTH // 2))
    angles = torch.arange(TOKENS, dtype=torch.float64)[None, None, :, None] * inv_freq  # (1, 1, T, F)
    tables = (angles.cos().float(), angles.sin().float()) * 2
    wide_q, wide_k = (x.detach() for x in wide(q, k))
    rope_qk_triton_(wide_q, wide_k, *tables)
    for a, b in zip((wide_q, wide_k), rope_qk_triton(q, k, *tables)):
        assert torch.equal(a, b), float((a.float() - b.float()).abs().max())
    print("ok")
    """
)


def test_rows_past_two_to_the_31_elements_are_addressed_in_int64():
    assert run_interpreted(CHECK).strip().endswith("ok")
