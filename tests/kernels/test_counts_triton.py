"""CoPE's attention in Triton tiles (``kernels.counts_triton``) against float64 CoPE (the encoding's own counts and
lookups), forward and backward, under TRITON_INTERPRET=1 on CPU tensors; and when ``forms`` offers it.

The interpreter is switched on when Triton is imported, so the checks run in a child process. Its tiles and table
windows are 16 × 16, so the shapes here (up to 70 keys) cross tiles, windows, the diagonal and ragged edges; tables
of 3 and 6 rows fill every row's count within a tile or two, so the tiles past them run without gates, tables of 64
rows never fill (one in a KV-cache step), and in two cases rows whose gates differ drift apart until a tile's pairs
read table rows with more than a window's rows between them that no pair reads (which the kernel jumps); with 40
rows, some rows of a tile are clamped at P − 1 while others still count.
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

    def counts_of(q, k):
        '''CoPE's counts p_ij = Σ_{i ≥ l ≥ j} σ(q_i·k_l / √Dh), unclamped (B, H, Tq, Tk), 0 where j may not be
        attended; and which pairs may (Tq, Tk). Queries are the last Tq keys; GQA by repeating k.'''
        heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
        k = k.repeat_interleave(heads // k.shape[1], 1)
        gates = torch.sigmoid(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5)
        allowed = torch.arange(k_len)[None, :] <= torch.arange(k_len - q_len, k_len)[:, None]
        return (gates * allowed).flip(-1).cumsum(-1).flip(-1), allowed

    def jumped_rows(q, k, rows, window=16):
        '''How many table rows the kernel's windows jump over, summed over (query tile, key tile): walking windows
        of 16 rows from the tile's smallest ⌊p⌋, each from the next row some allowed pair reads.'''
        q_len, k_len = q.shape[-2], k.shape[-2]
        counts, allowed = counts_of(q, k)
        counts = counts[0, 0].clamp(max=rows - 1)
        jumped = 0
        for first_row in range(0, q_len, window):
            for first_key in range(0, k_len, window):
                inside = allowed[first_row:first_row + window, first_key:first_key + window]
                tile = counts[first_row:first_row + window, first_key:first_key + window][inside]
                read = sorted(set(tile.floor().long().tolist()) | set(tile.ceil().long().tolist()))
                start = read[0] if read else None
                while start is not None:
                    following = next((row for row in read if row >= start + window), None)
                    jumped += 0 if following is None else following - (start + window)
                    start = following
        return jumped

    # the table's gradient is a small difference of each row's sums, and bf16 rounds the weights before they meet v
    # (as SDPA and eager do): over five seeds it moved by up to 6.7e-2 of its largest magnitude at two rows, 2.7e-2
    # elsewhere
    TABLE_BF16 = {2: 0.15}

    def near_a_kink(q, k):
        '''Whether a count lies within 1e-5 of an integer it is not: float32's count may fall on the integer's other
        side, where the interpolation's derivative is another pair of rows' difference (the gradients then differ
        by O(1): 0.07 of dk's largest seen). Exact integers (sums of gates of exactly ½) are no kink to the kernel.'''
        counts, _ = counts_of(q, k)
        apart = (counts - counts.round()).abs()
        return bool(((apart > 0) & (apart < 1e-5)).any())

    def compare(dtype, tolerance, batch, heads, kv_heads, q_len, k_len, width, value_width, rows, drifting):
        '''The kernel against the reference on random inputs (``drifting``: rows whose counts drift apart): the output
        and the gradients of q, k, v and the table, each relative to the reference's largest magnitude (at least
        0.1: a softmax over one key gives q and k no gradient, and float32 leaves noise there). Inputs with a count
        near a kink (``near_a_kink``), or drifting rows that leave no window of rows unread, are drawn again.'''
        while True:
            q = torch.randn(batch, heads, q_len, width) * 2
            k = torch.randn(batch, kv_heads, k_len, width) * 2
            if drifting:  # keys share a direction that every other query opposes: gates near 1 and near 0 by turns,
                # so neighbouring rows' counts drift apart
                leaning = torch.where(torch.arange(q_len) % 2 == 0, 1.0, -1.0)[:, None]
                q, k = torch.randn(1, 1, q_len, width) + leaning, torch.randn(1, 1, k_len, width) + 1.5
                if jumped_rows(q, k, rows) < 16:  # at least a window of rows no pair reads
                    continue
            else:
                k[:, :, k_len // 2:] = 0.0  # gates of exactly ½ there: every other count an integer, no gradient
            if not near_a_kink(q.to(dtype).double(), k.to(dtype).double()):
                break
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
            error = float((a.detach().double() - b).abs().max() / b.abs().max().clamp_min(0.1))
            allowed = TABLE_BF16.get(rows, 5e-2) if (name, dtype) == ("dtable", torch.bfloat16) else tolerance
            assert error < allowed, (name, error, dtype, tuple(q.shape), tuple(k.shape), rows)
    """
)

CHECK = REFERENCE + textwrap.dedent(
    """
    # per case: (B, H, Hkv, Tq, Tk, Dh, Dv, P, whether rows drift apart)
    CASES = ((2, 2, 1, 37, 37, 8, 8, 3, False), (1, 2, 2, 5, 40, 16, 12, 6, False),
             (1, 1, 1, 48, 48, 12, 20, 64, False), (1, 1, 1, 33, 33, 16, 16, 2, False), (1, 1, 1, 1, 1, 4, 4, 4, False),
             (1, 1, 1, 64, 64, 16, 16, 64, True), (1, 1, 1, 64, 64, 16, 16, 40, True),
             (1, 4, 2, 20, 70, 16, 16, 64, False))
    torch.manual_seed(0)
    cases = 0
    # float32's gates summed into counts err by up to 3.7e-5 of a gradient's largest magnitude over five seeds
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 5e-2), (torch.float16, 5e-3)):
        for case in CASES:
            compare(dtype, tolerance, *case)
            cases += 1
    assert cases == 3 * len(CASES)
    print("ok")
    """
)

EVERY_SHIFT = REFERENCE + textwrap.dedent(
    """
    torch.manual_seed(1)
    for shift in range(16):  # the interpreter's tiles are 16 × 16
        for rows in (6, 64):  # filled within the first key tiles; never filled
            compare(torch.float32, 1e-4, 1, 2, 1, 18, 18 + shift, 8, 8, rows, False)
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
    table_errors = []  # the table's gradient from bf16 q, with dZ (float32) split as the table's rows are
    for trial in range(10):
        q, k, v = (torch.randn(1, 2, 40, 16).bfloat16() for _ in range(3))
        table = torch.randn(40, 16)
        exact = [x.double() for x in (q, k, v)] + [table.double().requires_grad_()]
        cope.embeddings = exact[3]
        logits = 0.3 * exact[0] @ exact[1].transpose(-1, -2) + cope.relative_logits(*exact[:2], q_pos, k_pos, allowed)
        expected = logits.masked_fill(~allowed, float("-inf")).softmax(-1) @ exact[2]
        upstream = torch.randn_like(expected)
        wanted, = torch.autograd.grad(expected, exact[3], upstream)
        fast = table.clone().requires_grad_()
        got, = torch.autograd.grad(counts_attention(q, k, v, fast, scale=0.3, gate_scale=cope.gate_scale), fast,
                                   upstream.bfloat16())
        table_errors.append(float((got.double() - wanted).abs().max() / wanted.abs().max()))
    assert sorted(table_errors)[4] < 3.6e-3, table_errors  # one draw's error varies by 2×: their median
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
    """Tables that fill every count early (so later tiles skip the gates) and ones that never fill, rows that drift
    apart, grouped-query heads, KV-cache steps (Tq < Tk), widths that are no power of two, one token; the gradients
    of q, k, v and the table; float32 to 1e-4 of the reference's largest magnitude, bfloat16 to 5e-2 (at two rows
    the table's gradient to 0.15), float16 to 5e-3: 2-3 times the worst of five seeds (the bounds one seed had
    passed, 1e-5 and 1e-2, failed others). Draws with a count within float32's reach of an integer, where the
    derivative jumps, are drawn again (``near_a_kink``)."""
    assert run_interpreted(CHECK).strip().endswith("ok")


def test_a_kv_cache_step_at_every_shift_of_the_diagonal_equals_float64():
    """Two query tiles at every shift Tk − Tq modulo the tiles, with a table that fills early and one that never
    does: where the diagonal falls decides the last key tile a query tile walks back from. A walk one tile short at
    some shifts passed the test above."""
    assert run_interpreted(EVERY_SHIFT).strip().endswith("ok")


def test_a_large_table_keeps_its_float32_digits_in_16_bit_tiles():
    """Z = q·e from 16-bit q and a float32 table with entries near ±30: bfloat16 outputs within 6e-3 of float64's
    largest magnitude, float16 within 8e-4 (1.9–2.4e-3 and 2.2–2.9e-4 seen); with the table's rows rounded to q's
    dtype they erred by 1.2–2.3e-2 and 1.8–2.3e-3. The table's gradient from bfloat16: the median error of 10 draws
    within 3.6e-3 (2.6–2.7e-3 seen; with dZ rounded to bfloat16, 4.4–5.0e-3)."""
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
    wide = torch.zeros(1, 2, 4, 65)
    with pytest.raises(ValueError, match=r"q's head width must be at most 64 in torch.float32 .* got 65"):
        counts_attention(wide, wide, wide, torch.zeros(4, 65), scale=1.0, gate_scale=1.0)
