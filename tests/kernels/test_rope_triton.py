"""The Triton RoPE kernel equals the PyTorch rotation, forward and backward, under TRITON_INTERPRET=1.

The interpreter runs the kernel on CPU tensors. It is switched on when Triton is
imported, so the check runs in a child process and leaves this one untouched.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

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


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernel_equals_the_reference_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cases 9" in result.stdout
