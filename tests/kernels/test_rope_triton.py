"""The Triton RoPE kernel equals the PyTorch rotation, forward and backward, under TRITON_INTERPRET=1.

The interpreter runs the kernel on CPU tensors. It is switched on when Triton is
imported, so the check runs in a child process and leaves this one untouched.
"""

import importlib.util
import textwrap

import pytest

from tests.kernels.interpreted import run_interpreted

CHECK = textwrap.dedent(
    """
    import torch
    from posenc.kernels import rope_cos_sin, rotate_pairs
    from posenc.kernels.rope_triton import rope_qk_triton

    torch.manual_seed(0)
    cases = 0
    for layout in ("half", "interleaved"):
        for head_dim, pairs in ((8, 4), (10, 3)):  # full and partial rotary
            for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
                q_pos = torch.tensor([[3, 4, 5], [0, 9, 1 << 20]])  # per-batch positions
                k_pos = torch.arange(6)[None]  # keys at other positions (a KV cache)
                inv_freq = 10000.0 ** (-torch.arange(pairs, dtype=torch.float64) / pairs)
                q_cos, q_sin = rope_cos_sin(q_pos, inv_freq, 1.2)
                k_cos, k_sin = rope_cos_sin(k_pos, inv_freq, 1.2)
                q = torch.randn(2, 3, 6, head_dim).to(dtype)[:, :, :3].requires_grad_()  # strided
                k = torch.randn(2, 6, 2, head_dim).to(dtype).transpose(1, 2).requires_grad_()  # (B, Hk, Tk, Dh)
                got = rope_qk_triton(q, k, q_cos, q_sin, k_cos, k_sin, layout)
                expected = (rotate_pairs(q, q_cos, q_sin, layout), rotate_pairs(k, k_cos, k_sin, layout))
                upstream = [torch.randn_like(t) for t in expected]
                got_grads = torch.autograd.grad(got, (q, k), upstream)
                expected_grads = torch.autograd.grad(expected, (q, k), upstream)
                for a, b in zip(got + got_grads, expected + expected_grads):
                    assert a.dtype == b.dtype and a.shape == b.shape
                    torch.testing.assert_close(a.float(), b.float(), rtol=tolerance, atol=tolerance)
                cases += 1
    # positions spanning several tiles of 64, the last one partial; fewer key than query heads
    q_cos, q_sin = rope_cos_sin(torch.arange(130)[None] * 7, inv_freq)
    q, k = torch.randn(2, 4, 130, 10), torch.randn(2, 2, 130, 10)
    for a, b in zip(rope_qk_triton(q, k, q_cos, q_sin, q_cos, q_sin), (rotate_pairs(q, q_cos, q_sin),
                                                                         rotate_pairs(k, q_cos, q_sin))):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    cases += 1
    print("cases", cases)
    """
)


IN_PLACE = textwrap.dedent(
    """
    import torch
    from posenc.kernels import rope_cos_sin, rotate_pairs
    from posenc.kernels.rope_triton import Tiling, rope_qk_triton, rope_qk_triton_

    torch.manual_seed(0)
    SMALL = Tiling(pairs=16, heads=3, warps=1)  # 2 position tiles; head groups the heads do not fill


    def shape(case, head_dim):
        return {"model": (2, 5, 3, 4, head_dim), "cache": (2, 6, 7, head_dim), "columns": (2, 4, 6, 2 * head_dim),
                "mixed": (2, 4, 6, 3 * head_dim)}[case]


    def views(case, base):
        \"\"\"q (B, H, Tq, Dh) and k (B, Hk, Tk, Dh): disjoint views of base, neither contiguous.\"\"\"
        if case == "model":  # slices of one qkv projection (B, T, 3, H, Dh), as the model rotates them
            qkv = base.permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
            return qkv[0], qkv[1]
        if case == "cache":  # 3 queries and a cache of 7 keys at other positions, 2 key heads
            return base[:, :4, :3], base[:, 4:]
        if case == "mixed":  # q's rows contiguous, k's channels strided: both rotated through copies
            return base[:, :, :3, :head_dim], base[:, :2, :, head_dim::2]
        return base[:, :, :3, ::2], base[:, :2, :, 1::2]  # "columns": strided last dim, rotated through a copy


    cases = 0
    for layout in ("half", "interleaved"):
        for head_dim, pairs in ((8, 4), (10, 3)):  # full and partial rotary
            inv_freq = 10000.0 ** (-torch.arange(pairs, dtype=torch.float64) / pairs)
            for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float64, 1e-12)):
                compute = torch.float64 if dtype == torch.float64 else torch.float32
                for case, tiling in (("model", SMALL), ("model", Tiling()), ("cache", SMALL), ("columns", SMALL),
                                     ("mixed", SMALL)):
                    leaf = torch.randn(shape(case, head_dim), dtype=torch.float64).to(dtype).requires_grad_()
                    base = leaf.clone()  # not a leaf, so it may be rotated in place
                    q, k = views(case, base)
                    q_pos = torch.tensor([[3, 4, 5, 6, 7], [0, 9, 1 << 20, 2, 1]])[:, : q.shape[2]]  # per batch row
                    k_pos = q_pos if case == "model" else torch.arange(k.shape[2])[None]
                    q_tables = rope_cos_sin(q_pos, inv_freq, 1.2, compute)
                    k_tables = rope_cos_sin(k_pos, inv_freq, 1.2, compute)
                    pointers = q.data_ptr(), k.data_ptr()
                    got = rope_qk_triton_(q, k, *q_tables, *k_tables, layout, tiling)
                    assert got[0] is q and got[1] is k and (q.data_ptr(), k.data_ptr()) == pointers

                    twin = leaf.detach().clone().requires_grad_()
                    q2, k2 = views(case, twin)
                    expected = rotate_pairs(q2, *q_tables, layout), rotate_pairs(k2, *k_tables, layout)
                    out_of_place = rope_qk_triton(q2, k2, *q_tables, *k_tables, layout, tiling)
                    wanted = leaf.detach().clone()
                    for view, value in zip(views(case, wanted), expected):
                        view.copy_(value.detach())
                    # q and k rotated inside base, and nothing else in base touched (v, the cache's other parts)
                    torch.testing.assert_close(base.detach().double(), wanted.double(), rtol=tolerance,
                                               atol=tolerance)

                    if tiling == Tiling():  # a gradient autograd expands: ones for q (from a sum), zeros for k
                        grads = [torch.autograd.grad(out[0].sum(), wrt) for out, wrt in
                                 ((got, leaf), (expected, twin), (out_of_place, twin))]
                    else:
                        upstream = [torch.randn_like(t) for t in expected]
                        kept = [u.clone() for u in upstream]
                        grads = [torch.autograd.grad(out, wrt, upstream) for out, wrt in
                                 ((got, leaf), (expected, twin), (out_of_place, twin))]
                        assert all(torch.equal(u, v) for u, v in zip(upstream, kept))  # the caller's, untouched
                    (got_grad,), (expected_grad,), (out_of_place_grad,) = grads
                    for grad in (got_grad, out_of_place_grad):
                        torch.testing.assert_close(grad.double(), expected_grad.double(), rtol=tolerance,
                                                   atol=tolerance)
                    cases += 1
    print("cases", cases)
    """
)




@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernel_equals_the_reference_in_the_interpreter():
    assert "cases 9" in run_interpreted(CHECK)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_in_place_triton_kernel_rotates_its_inputs_as_the_reference_in_the_interpreter():
    """``rope_qk_triton_`` on q and k views (the model's qkv slices, a KV cache, strided columns, one of each): the
    values of ``rotate_pairs`` written into the inputs' own storage, and gradients equal to the reference's and to
    the out-of-place kernel's, in float32, bfloat16 and float64, full and partial rotary, both layouts."""
    assert "cases 60" in run_interpreted(IN_PLACE)
