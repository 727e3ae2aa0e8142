"""Transformer-XL's position terms in Triton tiles (``kernels.lookups_triton``) against float64 attention written
out pair by pair, forward and backward, under TRITON_INTERPRET=1 on CPU tensors; and when ``forms`` offers it.

The interpreter is switched on when Triton is imported, so the checks run in a child process. Its tiles are 16 × 16,
so the shapes here (up to 40 keys) cross tiles, the diagonal, the window's two halves and ragged edges.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (the test extra)")

CHECK = textwrap.dedent(
    """
    import torch
    from posenc.kernels.lookups_triton import lookup_attention

    def reference(q, k, v, table, content_shift, lookup_shift, scale):
        '''softmax(scale·((q + u)·k_j + (q + v)·table[i − j]))·v, causal, queries the last Tq keys, pair by pair.'''
        heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
        k, v = (x.repeat_interleave(heads // x.shape[1], 1) for x in (k, v))
        offset = torch.arange(k_len - q_len, k_len)[:, None] - torch.arange(k_len)[None, :]  # (Tq, Tk)
        looked_up = table[:, offset.clamp_min(0)]  # (H, Tq, Tk, Dh)
        content = (q + content_shift[None, :, None]) @ k.transpose(-1, -2)
        position = torch.einsum("bhqd,hqkd->bhqk", q + lookup_shift[None, :, None], looked_up)
        logits = ((content + position) * scale).masked_fill(offset < 0, float("-inf"))
        return logits.softmax(-1) @ v

    torch.manual_seed(0)
    cases = 0
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 5e-3)):
        for batch, heads, kv_heads, q_len, k_len, width, value_width in (
                (2, 2, 1, 37, 37, 8, 8), (1, 2, 2, 5, 40, 16, 12), (1, 1, 1, 33, 33, 12, 20), (1, 1, 1, 1, 1, 4, 4)):
            q = torch.randn(batch, heads, q_len, width)
            k = torch.randn(batch, kv_heads, k_len, width)
            v = torch.randn(batch, kv_heads, k_len, value_width)
            table = torch.randn(heads, k_len + 3, width)  # rows past Tk are never read
            shifts = [torch.randn(heads, width) for _ in range(2)]
            exact = [x.to(dtype).double().requires_grad_() for x in (q, k, v)] + [
                x.double().requires_grad_() for x in (table, *shifts)]
            fast = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [x.clone().requires_grad_()
                                                                         for x in (table, *shifts)]
            expected = reference(*exact, 0.3)
            got = lookup_attention(*fast[:4], content_shift=fast[4], lookup_shift=fast[5], scale=0.3)
            assert got.dtype == dtype and got.shape == expected.shape
            upstream = torch.randn_like(expected)
            wanted = torch.autograd.grad(expected, exact, upstream)
            grads = torch.autograd.grad(got, fast, upstream.to(dtype))
            names = ("out", "dq", "dk", "dv", "dtable", "dcontent_shift", "dlookup_shift")
            for name, a, b in zip(names, (got, *grads), (expected.detach(), *wanted)):
                assert a.dtype == (dtype if name in names[:4] else torch.float32), name
                error = float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-12))
                assert error < tolerance, (name, error, dtype, tuple(q.shape), tuple(k.shape))
            assert float(grads[3][:, k_len:].abs().max()) == 0.0
            cases += 1
    assert cases == 12
    print("ok")
    """
)


def test_lookup_tiles_equal_float64_values_and_gradients():
    """Grouped-query heads, a KV-cache step (Tq < Tk), head and value widths that are no power of two, one token;
    the gradients of q, k, v, the table and both shifts; float32 to 1e-5 of the reference's largest magnitude,
    bfloat16 to 3e-2, float16 to 5e-3."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok"), result.stdout


def gpu_tensor(dtype=torch.bfloat16):
    return SimpleNamespace(is_cuda=True, device=torch.device("meta"), dtype=dtype)


def test_a_gpu_is_offered_the_kernel_only_once_checked_there_or_asked(monkeypatch):
    from posenc.kernels import lookups_triton

    monkeypatch.delenv("POSENC_LOOKUPS_TRITON", raising=False)
    monkeypatch.setattr(lookups_triton, "CHECKED_ON_GPU", False)
    assert not lookups_triton.offered(gpu_tensor())
    monkeypatch.setenv("POSENC_LOOKUPS_TRITON", "1")
    assert lookups_triton.offered(gpu_tensor()) and not lookups_triton.offered(gpu_tensor(torch.float64))
    monkeypatch.delenv("POSENC_LOOKUPS_TRITON")
    monkeypatch.setattr(lookups_triton, "CHECKED_ON_GPU", True)
    assert lookups_triton.offered(gpu_tensor())


def test_the_kernel_refuses_shapes_it_cannot_serve_in_one_line():
    from posenc.kernels.lookups_triton import lookup_attention

    q, k = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    shift = torch.zeros(2, 8)
    with pytest.raises(ValueError, match=r"table must be \(H, N >= Tk, Dh\)"):
        lookup_attention(q, k, k, torch.zeros(2, 3, 8), content_shift=shift, lookup_shift=shift, scale=1.0)
    with pytest.raises(ValueError, match="lookup_shift must be"):
        lookup_attention(q, k, k, torch.zeros(2, 4, 8), content_shift=shift, lookup_shift=shift[:1], scale=1.0)
    with pytest.raises(ValueError, match="Tq <= Tk"):
        lookup_attention(torch.zeros(1, 2, 5, 8), k, k, torch.zeros(2, 5, 8), content_shift=shift,
                         lookup_shift=shift, scale=1.0)
