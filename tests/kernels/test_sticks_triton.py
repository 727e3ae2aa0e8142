"""Stick-breaking attention in Triton tiles (``kernels.sticks_triton``) against float64 stick-breaking, forward and
backward, under TRITON_INTERPRET=1 on CPU tensors; and when ``forms`` offers it.

The interpreter is switched on when Triton is imported, so the checks run in a child process. Its tiles are 16 × 16,
so the shapes here (up to 40 keys) cross tiles, the diagonal and ragged edges.
"""

import importlib.util
import textwrap

import pytest
import torch

from tests.kernels.interpreted import gpu_tensor, run_interpreted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (the test extra)")

REFERENCE = textwrap.dedent(
    """
    import torch
    from posenc.encodings.stick_breaking import StickBreaking
    from posenc.kernels.sticks_triton import stick_breaking_attention

    def reference(q, k, v, scale, current):
        '''float64 stick-breaking (the encoding's own weights), queries the last Tq keys, GQA by repeating k, v.'''
        heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
        k, v = (x.repeat_interleave(heads // x.shape[1], 1) for x in (k, v))
        q_pos, k_pos = torch.arange(k_len - q_len, k_len), torch.arange(k_len)
        allowed = (k_pos[None, :] <= q_pos[:, None]) if current else (k_pos[None, :] < q_pos[:, None])
        return StickBreaking(current).weights((q @ k.transpose(-1, -2)) * scale, allowed[None, None]) @ v

    def compare(dtype, tolerance, current, batch, heads, kv_heads, q_len, k_len, width, value_width):
        '''The kernel against the reference on random q, k and v: the output and the gradients of q, k and v, each
        relative to the reference's largest magnitude.'''
        q = torch.randn(batch, heads, q_len, width) * 2
        k = torch.randn(batch, kv_heads, k_len, width) * 2
        v = torch.randn(batch, kv_heads, k_len, value_width)
        exact = [x.to(dtype).double().requires_grad_() for x in (q, k, v)]
        fast = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        expected = reference(*exact, 0.4, current)
        got = stick_breaking_attention(*fast, scale=0.4, attend_current=current)
        assert got.dtype == dtype and got.shape == expected.shape
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact, upstream)
        grads = torch.autograd.grad(got, fast, upstream.to(dtype))
        for name, a, b in zip(("out", "dq", "dk", "dv"), (got, *grads), (expected, *wanted)):
            error = float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-12))
            assert error < tolerance, (name, error, dtype, current, tuple(q.shape), tuple(k.shape))
    """
)

CHECK = REFERENCE + textwrap.dedent(
    """
    torch.manual_seed(0)
    cases = 0
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 5e-3)):
        for current in (False, True):
            for shape in ((2, 2, 1, 37, 37, 8, 8), (1, 2, 2, 5, 40, 16, 12), (1, 1, 1, 33, 33, 12, 20),
                          (1, 1, 1, 1, 1, 4, 4)):
                compare(dtype, tolerance, current, *shape)
                cases += 1
    assert cases == 24
    print("ok")
    """
)

EVERY_SHIFT = REFERENCE + textwrap.dedent(
    """
    torch.manual_seed(1)
    for shift in range(16):  # the interpreter's tiles are 16 × 16 (a GPU's are square too)
        for current in (False, True):
            compare(torch.float32, 1e-5, current, 1, 2, 1, 18, 18 + shift, 8, 8)
    print("ok")
    """
)


def test_stick_breaking_tiles_equal_float64_values_and_gradients():
    """With and without the query's own key, grouped-query heads, a KV-cache step (Tq < Tk), head and value widths
    that are no power of two, one token (its only key refused without the current key: zeros, zero gradients);
    float32 to 1e-5 of the reference's largest magnitude, bfloat16 to 3e-2 (1.3e-2 seen), float16 to 5e-3
    (6.7e-4 seen)."""
    assert run_interpreted(CHECK).strip().endswith("ok")


def test_a_kv_cache_step_at_every_shift_of_the_diagonal_equals_float64():
    """Two query tiles at every shift Tk − Tq modulo the tiles: where the diagonal falls decides the last key tile a
    query tile walks back from. A walk one tile short at some shifts passed the test above."""
    assert run_interpreted(EVERY_SHIFT).strip().endswith("ok")


def test_a_gpu_is_offered_the_kernel_only_once_checked_there_or_asked_and_where_its_tiles_fit(monkeypatch):
    """Up to head width 256 in bf16 and 128 in float32, where its 32 × 32 tiles fit (its 64 × 64 asked for 320 KiB
    of shared memory at 256)."""
    from posenc.kernels import sticks_triton, tiles_triton

    monkeypatch.delenv("POSENC_STICKS_TRITON", raising=False)
    monkeypatch.setattr(sticks_triton, "CHECKED_ON_GPU", False)
    assert tiles_triton.serves(gpu_tensor()) and not sticks_triton.offered(gpu_tensor())
    assert not tiles_triton.serves(gpu_tensor(torch.float64))
    monkeypatch.setenv("POSENC_STICKS_TRITON", "1")
    assert sticks_triton.offered(gpu_tensor())
    monkeypatch.delenv("POSENC_STICKS_TRITON")
    monkeypatch.setattr(sticks_triton, "CHECKED_ON_GPU", True)
    assert sticks_triton.offered(gpu_tensor())
    assert sticks_triton.offered(gpu_tensor(width=256)) and not sticks_triton.offered(gpu_tensor(width=257))
    assert sticks_triton.offered(gpu_tensor(torch.float32, 128))
    assert not sticks_triton.offered(gpu_tensor(torch.float32, 129))


def test_a_gpu_runs_64_by_64_tiles_up_to_width_128_and_32_by_32_past_it():
    """Float32 past width 64 too: compiled for sm_90, 64 × 64 asked for 320 KiB of shared memory at 256 in bf16 and
    spilled 4,544 bytes a thread at 128 in float32; the suite compiles neither (``make gpu-compile`` does). The
    width is the wider of the heads and the values (narrow heads with values of 512 asked for 416 KiB)."""
    from posenc.kernels import sticks_triton

    for dtype, widest in ((torch.bfloat16, 128), (torch.float16, 128), (torch.float32, 64)):
        assert sticks_triton._blocks(gpu_tensor(dtype, widest), widest) == (64, 64, 8), dtype
        assert sticks_triton._blocks(gpu_tensor(dtype, widest + 1), widest + 1) == (32, 32, 4), dtype
        assert sticks_triton._blocks(gpu_tensor(dtype, 16), widest + 1) == (32, 32, 4), dtype
        assert sticks_triton._blocks(gpu_tensor(dtype, widest + 1), 16) == (32, 32, 4), dtype


def test_the_kernel_refuses_shapes_it_cannot_serve_in_one_line():
    from posenc.kernels.sticks_triton import stick_breaking_attention

    q, k = torch.zeros(1, 3, 4, 8), torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="H a multiple of Hkv"):
        stick_breaking_attention(q, k, k, scale=1.0, attend_current=False)
    with pytest.raises(ValueError, match="Tq <= Tk"):
        stick_breaking_attention(torch.zeros(1, 2, 5, 8), k[:, :, :4], k, scale=1.0, attend_current=False)
    with pytest.raises(ValueError, match="q, k and v must share one dtype, got torch.float32, torch.float32 and "
                                         "torch.bfloat16"):  # under the interpreter, mixed dtypes ran and were wrong
        stick_breaking_attention(k, k, k.bfloat16(), scale=1.0, attend_current=False)
    wide = torch.zeros(1, 2, 4, 129)
    with pytest.raises(ValueError, match=r"q's head width must be at most 128 in torch.float32 .* got 129"):
        stick_breaking_attention(wide, wide, wide, scale=1.0, attend_current=False)
