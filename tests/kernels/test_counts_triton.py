"""CoPE's attention in Triton tiles (``kernels.counts_triton``) against float64 CoPE (the encoding's own counts and
lookups), forward and backward, under TRITON_INTERPRET=1 on CPU tensors; and when ``forms`` offers it.

The interpreter is switched on when Triton is imported, so the checks run in a child process. Its tiles and table
windows are 16 × 16, so the shapes here (up to 64 keys) cross tiles, windows, the diagonal and ragged edges; tables
of 3 and 6 rows fill every row's count within a tile or two, so the tiles past them run without gates, tables of 64
rows never fill, and in one case rows whose gates differ drift apart until a tile's pairs read table rows with a
window between them that no pair reads (which the kernel skips).
"""

import importlib.util
import textwrap

import pytest
import torch

from tests.kernels.interpreted import gpu_tensor, run_interpreted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (the test extra)")

CHECK = textwrap.dedent(
    """
    import torch
    from posenc.encodings.cope import CoPE
    from posenc.kernels.counts_triton import counts_attention

    def reference(q, k, v, table, scale):
        '''float64 CoPE attention (the encoding's relative logits), causal, queries the last Tq keys, GQA by
        repeating k and v.'''
        heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
        k, v = (x.repeat_interleave(heads // x.shape[1], 1) for x in (k, v))
        cope = CoPE(q.shape[-1], table.shape[0])
        del cope.embeddings
        cope.embeddings = table  # the test's tensor, so that its gradient is the reference's
        q_pos, k_pos = torch.arange(k_len - q_len, k_len)[None], torch.arange(k_len)[None]
        allowed = (k_pos[:, None, :] <= q_pos[:, :, None])[:, None]
        logits = scale * q @ k.transpose(-1, -2) + cope.relative_logits(q, k, q_pos, k_pos, allowed)
        return logits.masked_fill(~allowed, float("-inf")).softmax(-1) @ v, cope.gate_scale

    def skipped_windows(q, k, gate_scale, window=16):
        '''How many (query tile, key tile, window of 16 table rows) the kernel skips: within the tile's table rows
        (its pairs' smallest ⌊p⌋ to largest ⌈p⌉, windows from the smallest), windows that no pair reads.'''
        q_len, k_len = q.shape[-2], k.shape[-2]
        gates = torch.sigmoid(q @ k.transpose(-1, -2) * gate_scale)[0, 0]
        allowed = torch.arange(k_len)[None, :] <= torch.arange(k_len - q_len, k_len)[:, None]
        counts = (gates * allowed).flip(-1).cumsum(-1).flip(-1)
        skipped = 0
        for rows in range(0, q_len, window):
            for keys in range(0, k_len, window):
                inside = allowed[rows:rows + window, keys:keys + window]
                tile = counts[rows:rows + window, keys:keys + window][inside]
                if tile.numel():
                    read = set(tile.floor().long().tolist()) | set(tile.ceil().long().tolist())
                    first, last = min(read), max(read)
                    skipped += sum(not read & set(range(s, s + window)) for s in range(first, last + 1, window))
        return skipped

    # the table's gradient is a small difference of each row's sums, and bf16 rounds the weights before they meet v
    # (as SDPA and eager do): at two rows it moves by 7e-2 of its largest magnitude
    TABLE_BF16 = 1.5e-1
    torch.manual_seed(0)
    cases = 0
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 5e-3)):
        for batch, heads, kv_heads, q_len, k_len, width, value_width, rows in (
                (2, 2, 1, 37, 37, 8, 8, 3), (1, 2, 2, 5, 40, 16, 12, 6), (1, 1, 1, 48, 48, 12, 20, 64),
                (1, 1, 1, 33, 33, 16, 16, 2), (1, 1, 1, 1, 1, 4, 4, 4), (1, 1, 1, 64, 64, 16, 16, 64)):
            q = torch.randn(batch, heads, q_len, width) * 2
            k = torch.randn(batch, kv_heads, k_len, width) * 2
            drifting = rows == k_len == 64
            if drifting:  # keys share a direction that every other query opposes: gates near 1 and near 0 by turns,
                # so neighbouring rows' counts drift apart; float32 sums of gates near 1 err by 1.5e-5 there (the
                # kernel that held the whole table did too)
                leaning = torch.where(torch.arange(64) % 2 == 0, 1.0, -1.0)[:, None]
                q, k = torch.randn(1, 1, 64, width) + leaning, torch.randn(1, 1, 64, width) + 1.5
                assert skipped_windows(q, k, width ** -0.5) > 0
            else:
                k[:, :, k_len // 2:] = 0.0  # gates of exactly ½ there: every other count an integer, no gradient
            v = torch.randn(batch, kv_heads, k_len, value_width)
            table = torch.randn(rows, width)
            exact = [x.to(dtype).double().requires_grad_() for x in (q, k, v)] + [table.double().requires_grad_()]
            fast = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [table.clone().requires_grad_()]
            expected, gate_scale = reference(*exact, 0.3)
            got = counts_attention(*fast, scale=0.3, gate_scale=gate_scale)
            assert got.dtype == dtype and got.shape == expected.shape
            upstream = torch.randn_like(expected)
            wanted = torch.autograd.grad(expected, exact, upstream)
            grads = torch.autograd.grad(got, fast, upstream.to(dtype))
            for name, a, b in zip(("out", "dq", "dk", "dv", "dtable"), (got, *grads), (expected.detach(), *wanted)):
                error = float((a.detach().double() - b).abs().max() / b.abs().max().clamp_min(1e-12))
                allowed = tolerance * (3 if drifting else 1)
                if (name, dtype) == ("dtable", torch.bfloat16):
                    allowed = TABLE_BF16
                assert error < allowed, (name, error, dtype, tuple(q.shape), tuple(k.shape), rows)
            cases += 1
    assert cases == 18
    print("ok")
    """
)


DIGITS = textwrap.dedent(
    """
    import torch
    from posenc.encodings.cope import CoPE
    from posenc.kernels.counts_triton import counts_attention

    torch.manual_seed(0)
    for trial in range(3):
        q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
        table = torch.randn(40, 16) * 8  # Z = q·e near ±30: rounding e to bf16 moves a logit by about 0.06
        cope = CoPE(16, 40)
        del cope.embeddings
        cope.embeddings = table.double()
        q_pos = k_pos = torch.arange(40)[None]
        allowed = (k_pos[:, None, :] <= q_pos[:, :, None])[:, None]
        for dtype, tolerance in ((torch.bfloat16, 6e-3), (torch.float16, 8e-4)):
            q_, k_, v_ = (x.to(dtype) for x in (q, k, v))
            exact = [x.double() for x in (q_, k_, v_)]
            logits = 0.3 * exact[0] @ exact[1].transpose(-1, -2) + cope.relative_logits(*exact[:2], q_pos, k_pos,
                                                                                          allowed)
            expected = logits.masked_fill(~allowed, float("-inf")).softmax(-1) @ exact[2]
            got = counts_attention(q_, k_, v_, table, scale=0.3, gate_scale=cope.gate_scale)
            error = float((got.double() - expected).abs().max() / expected.abs().max())
            assert error < tolerance, (dtype, error)
    print("ok")
    """
)


ROUTED = textwrap.dedent(
    """
    import copy
    import torch
    import posenc
    from posenc.kernels import counts_triton, dispatch, forms

    forms.triton_counts = lambda q: True  # as on a GPU that offers the kernel
    calls = []
    kernel = counts_triton.counts_attention
    counts_triton.counts_attention = lambda *a, **kw: calls.append(1) or kernel(*a, **kw)
    torch.manual_seed(1)
    for rows in (4, 64):
        encoding = posenc.build("cope", head_dim=16, max_positions=rows)
        with torch.no_grad():
            encoding.embeddings.normal_()  # they start at zero
        reference = copy.deepcopy(encoding).double()
        q, k, v = (torch.randn(2, 2, 37, 16) * 2 for _ in range(3))
        exact = [x.double().requires_grad_() for x in (q, k, v)]
        expected = posenc.attention(*exact, reference, backend="eager")
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact + [reference.embeddings], upstream)
        fast = [x.requires_grad_() for x in (q, k, v)]
        with dispatch.force("counts"):
            got = posenc.attention(*fast, encoding, backend="auto")
        grads = torch.autograd.grad(got, fast + [encoding.embeddings], upstream.float())
        for what, a, b in zip(("out", "dq", "dk", "dv", "embeddings"), (got, *grads), (expected.detach(), *wanted)):
            error = float((a.detach().double() - b).abs().max() / b.abs().max())
            assert error < 5e-5, (rows, what, error)  # float32 against float64: 1.04e-5 seen
    assert len(calls) == 2, calls
    print("ok")
    """
)


def test_cope_tiles_equal_float64_values_and_gradients():
    """Tables that fill every count early (so later tiles skip the gates) and one that never fills, grouped-query
    heads, a KV-cache step (Tq < Tk), widths that are no power of two, one token; the gradients of q, k, v and the
    table; float32 to 1e-5 of the reference's largest magnitude, bfloat16 to 3e-2 (the table's gradient to 1.5e-1),
    float16 to 5e-3."""
    assert run_interpreted(CHECK).strip().endswith("ok")


def test_a_large_table_keeps_its_float32_digits_in_16_bit_tiles():
    """Z = q·e from 16-bit q and a float32 table with entries near ±30: bfloat16 outputs within 6e-3 of float64's
    largest magnitude, float16 within 8e-4 (1.9–2.4e-3 and 2.2–2.9e-4 seen); with the table's rows rounded to q's
    dtype they erred by 1.2–2.3e-2 and 1.8–2.3e-3."""
    assert run_interpreted(DIGITS).strip().endswith("ok")


def test_attention_runs_cope_in_the_tiles_where_a_gpu_offers_them(tmp_path):
    """``attention(backend="auto")`` as on a GPU that offers the kernel: CoPE's counts form runs in the tiles, and
    the output and the gradients of q, k, v and the embeddings equal float64 eager to 5e-5."""
    assert run_interpreted(ROUTED, POSENC_FORMS_CACHE=str(tmp_path / "forms.json")).strip().endswith("ok")


def test_a_gpu_is_offered_the_kernel_only_once_checked_there_or_asked_and_where_its_tiles_fit(monkeypatch):
    """Offered on a GPU once checked there (or asked for), and only at the head widths whose tiles fit an H100's
    shared memory compiled for sm_90: up to 128 in bf16, 64 in fp32."""
    from posenc.kernels import counts_triton

    monkeypatch.delenv("POSENC_COUNTS_TRITON", raising=False)
    monkeypatch.setattr(counts_triton, "CHECKED_ON_GPU", False)
    assert not counts_triton.offered(gpu_tensor())
    monkeypatch.setenv("POSENC_COUNTS_TRITON", "1")
    assert counts_triton.offered(gpu_tensor()) and not counts_triton.offered(gpu_tensor(torch.float64))
    assert counts_triton.offered(gpu_tensor(width=128)) and not counts_triton.offered(gpu_tensor(width=256))
    assert not counts_triton.offered(gpu_tensor(torch.float32, 128))
    monkeypatch.delenv("POSENC_COUNTS_TRITON")
    monkeypatch.setattr(counts_triton, "CHECKED_ON_GPU", True)
    assert counts_triton.offered(gpu_tensor())


def test_the_kernel_refuses_shapes_it_cannot_serve_in_one_line():
    from posenc.kernels.counts_triton import counts_attention

    q, k = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"table must be \(P >= 2, Dh = 8\)"):
        counts_attention(q, k, k, torch.zeros(1, 8), scale=1.0, gate_scale=1.0)
    with pytest.raises(ValueError, match="Tq <= Tk"):
        counts_attention(torch.zeros(1, 2, 5, 8), k, k, torch.zeros(4, 8), scale=1.0, gate_scale=1.0)
