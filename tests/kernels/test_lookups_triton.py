"""Transformer-XL's position terms in Triton tiles (``kernels.lookups_triton``) against float64 attention written
out pair by pair, forward and backward, under TRITON_INTERPRET=1 on CPU tensors; and when ``forms`` offers it.

The interpreter is switched on when Triton is imported, so the checks run in a child process. Its tiles are 16 × 16,
so the shapes here (up to 40 keys) cross tiles, the diagonal, the window's two halves and ragged edges.
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
    from posenc.kernels.lookups_triton import lookup_attention

    def reference(q, k, v, table, values, value_floor, content_shift, lookup_shift, scale):
        '''softmax(scale·((q + u)·k_j + (q + v)·table[i − j]))·v (+ Σ_j p_ij values[i − j] + value_floor), causal,
        queries the last Tq keys, offsets past the table adding nothing, pair by pair.'''
        heads, q_len, k_len, rows = q.shape[1], q.shape[2], k.shape[2], table.shape[1]
        k, v = (x.repeat_interleave(heads // x.shape[1], 1) for x in (k, v))
        offset = torch.arange(k_len - q_len, k_len)[:, None] - torch.arange(k_len)[None, :]  # (Tq, Tk)
        in_table = ((offset >= 0) & (offset < rows)).double()[..., None]
        looked_up = table.expand(heads, -1, -1)[:, offset.clamp(0, rows - 1)] * in_table  # (H, Tq, Tk, Dh)
        content = (q + content_shift[None, :, None]) @ k.transpose(-1, -2)
        position = torch.einsum("bhqd,hqkd->bhqk", q + lookup_shift[None, :, None], looked_up)
        weights = ((content + position) * scale).masked_fill(offset < 0, float("-inf")).softmax(-1)
        out = weights @ v
        if values is not None:
            value_rows = values.expand(heads, -1, -1)[:, offset.clamp(0, rows - 1)] * in_table  # (H, Tq, Tk, Dv)
            out = out + torch.einsum("bhqk,hqkd->bhqd", weights, value_rows)
        return out if value_floor is None else out + value_floor

    def compare(dtype, tolerance, batch, heads, kv_heads, q_len, k_len, width, value_width, rows, shared, band):
        '''The kernel against the reference on random inputs: Transformer-XL's table with both shifts, or Shaw's
        band (``band``) with value rows and a floor; one table for every head (``shared``) or one per head. The
        output and the gradients of q, k, v and every table and shift, each relative to the reference's largest
        magnitude.'''
        q = torch.randn(batch, heads, q_len, width)
        k = torch.randn(batch, kv_heads, k_len, width)
        v = torch.randn(batch, kv_heads, k_len, value_width)
        table_heads = 1 if shared else heads
        table = torch.randn(table_heads, rows, width)
        terms = {"values": torch.randn(table_heads, rows, value_width),
                 "value_floor": torch.randn(value_width)} if band else {
            "content_shift": torch.randn(heads, width), "lookup_shift": torch.randn(heads, width)}
        exact = [x.to(dtype).double().requires_grad_() for x in (q, k, v)] + [
            x.double().requires_grad_() for x in (table, *terms.values())]
        fast = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [x.clone().requires_grad_()
                                                                     for x in (table, *terms.values())]
        zeros = torch.zeros(heads, width, dtype=torch.float64)
        named = dict(zip(terms, exact[4:]))
        expected = reference(*exact[:4], named.get("values"), named.get("value_floor"),
                             named.get("content_shift", zeros), named.get("lookup_shift", zeros), 0.3)
        got = lookup_attention(*fast[:4], **dict(zip(terms, fast[4:])), scale=0.3)
        assert got.dtype == dtype and got.shape == expected.shape
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact, upstream)
        grads = torch.autograd.grad(got, fast, upstream.to(dtype))
        names = ("out", "dq", "dk", "dv", "dtable", *("d" + name for name in terms))
        for name, a, b in zip(names, (got, *grads), (expected.detach(), *wanted)):
            assert a.dtype == (dtype if name in names[:4] else torch.float32), name
            # one token's gradients of q and k are exactly 0 (a softmax over one key): held to 0.1·tolerance (another
            # draw left 2.6e-7 of float32 noise there; every other gradient's largest magnitude is 0.5 or more)
            error = float((a.detach().double() - b).abs().max() / b.abs().max().clamp_min(0.1))
            assert error < tolerance, (name, error, dtype, tuple(q.shape), tuple(k.shape), rows)
    """
)

CHECK = REFERENCE + textwrap.dedent(
    """
    torch.manual_seed(0)
    cases = 0
    # over five seeds the worst: float32 2.6e-6, bfloat16 3.3e-2 (dq), float16 1.5e-3
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2), (torch.float16, 5e-3)):
        for case in ((2, 2, 1, 37, 37, 8, 8, 40, False, False), (1, 2, 2, 5, 40, 16, 12, 43, False, False),
                     (1, 1, 1, 33, 33, 12, 20, 36, False, False), (1, 1, 1, 1, 1, 4, 4, 4, False, False),
                     (1, 2, 2, 37, 37, 8, 8, 5, True, True), (2, 2, 1, 33, 40, 16, 12, 20, False, True),
                     (1, 1, 1, 50, 50, 8, 8, 1, True, True), (1, 1, 1, 40, 40, 8, 8, 18, True, True)):
            compare(dtype, tolerance, *case)
            cases += 1
    assert cases == 24
    print("ok")
    """
)

EVERY_SHIFT = REFERENCE + textwrap.dedent(
    """
    torch.manual_seed(1)
    for shift in range(16):  # the interpreter's tiles are 16 × 16 (a GPU's are square too)
        compare(torch.float32, 1e-5, 1, 2, 1, 18, 18 + shift, 8, 8, 18 + shift, False, False)
        compare(torch.float32, 1e-5, 1, 2, 1, 18, 18 + shift, 8, 8, 5, False, True)
    print("ok")
    """
)


ROUTED = textwrap.dedent(
    """
    import copy
    import torch
    import posenc
    from posenc.kernels import dispatch, forms, lookups_triton

    forms.triton_lookups = lambda q: True  # as on a GPU that offers the kernel
    calls = []
    kernel = lookups_triton.lookup_attention
    lookups_triton.lookup_attention = lambda *a, **kw: calls.append(1) or kernel(*a, **kw)
    torch.manual_seed(1)
    for name, kwargs in (("transformer_xl", {}), ("shaw", {"max_distance": 5})):
        encoding = posenc.build(name, head_dim=16, num_heads=2, **kwargs)
        with torch.no_grad():
            for parameter in encoding.parameters():  # Transformer-XL's biases start at zero
                parameter.normal_(0.0, 0.3)
        reference = copy.deepcopy(encoding).double()
        q, k, v = (torch.randn(2, 2, 37, 16) for _ in range(3))
        exact = [x.double().requires_grad_() for x in (q, k, v)]
        expected = posenc.attention(*exact, reference, backend="eager")
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact + list(reference.parameters()), upstream)
        fast = [x.requires_grad_() for x in (q, k, v)]
        with dispatch.force("lookups"):
            got = posenc.attention(*fast, encoding, backend="auto")
        grads = torch.autograd.grad(got, fast + list(encoding.parameters()), upstream.float())
        names = ("out", "dq", "dk", "dv", *(n for n, _ in encoding.named_parameters()))
        for what, a, b in zip(names, (got, *grads), (expected.detach(), *wanted)):
            error = float((a.detach().double() - b).abs().max() / b.abs().max())
            assert error < 1e-5, (name, what, error)
    assert len(calls) == 2, calls
    print("ok")
    """
)


KEEPS = textwrap.dedent(
    """
    import torch
    from posenc.bench.training import saved_activation_bytes
    from posenc.kernels import forms, lookups_triton
    from posenc.lm.model import LanguageModel, ModelConfig

    forms.triton_lookups = lambda q: True  # as on a GPU that offers the kernel
    calls = []
    kernel = lookups_triton.lookup_attention
    lookups_triton.lookup_attention = lambda *a, **kw: calls.append(1) or kernel(*a, **kw)
    tokens = torch.randint(0, 256, (2, 65))
    sizes = {}
    for name in ("none", "shaw"):
        torch.manual_seed(0)
        sizes[name] = saved_activation_bytes(LanguageModel(ModelConfig(encoding=name, max_positions=64)), tokens)
    assert calls and sizes["shaw"] <= 1.01 * sizes["none"], (calls, sizes)
    print("ok")
    """
)


def test_lookup_tiles_equal_float64_values_and_gradients():
    """Transformer-XL's table over every offset with both shifts, and Shaw's band (a few rows, one for every head
    or one per head, with value rows), so that tiles past the band skip it (18 rows at 40 tokens puts a tile's least
    offset at N − 1: the last tile that reads the band) and its value floor; grouped-query heads, a KV-cache step
    (Tq < Tk), head and value widths that are no power of two, one token; the gradients of q, k, v and every table
    and shift; float32 to 1e-5 of the reference's largest magnitude, bfloat16 to 5e-2, float16 to 5e-3."""
    assert run_interpreted(CHECK).strip().endswith("ok")


def test_a_kv_cache_step_at_every_shift_of_the_diagonal_equals_float64():
    """Two query tiles at every shift Tk − Tq modulo the tiles, with a table over every offset and with a band of 5
    rows: where the diagonal falls decides the last key tile a query tile walks back from and the first that reads
    the table. A walk one tile short at some shifts passed the test above."""
    assert run_interpreted(EVERY_SHIFT).strip().endswith("ok")


def test_attention_runs_transformer_xl_and_shaw_in_the_tiles_where_a_gpu_offers_them(tmp_path):
    """``attention(backend="auto")`` as on a GPU that offers the kernel: Transformer-XL's lookups form and Shaw's
    band form run in the tiles, and the output and the gradients of q, k, v and every parameter of the encoding
    (through the table, the shifts, the band and its floor) equal float64 eager to 1e-5."""
    assert run_interpreted(ROUTED, POSENC_FORMS_CACHE=str(tmp_path / "forms.json")).strip().endswith("ok")


def test_shaw_in_the_tiles_keeps_what_nope_keeps(tmp_path):
    """A training step of the tiny LM with Shaw's band in the tiles keeps for the backward within 1% of NoPE's bytes:
    the floor is added inside the kernel, so the output it keeps is the one it returns (outside, a second copy per
    layer kept 6% more)."""
    assert run_interpreted(KEEPS, POSENC_FORMS_CACHE=str(tmp_path / "forms.json")).strip().endswith("ok")


def test_a_gpu_is_offered_the_kernel_only_once_checked_there_or_asked(monkeypatch):
    from posenc.kernels import lookups_triton

    monkeypatch.delenv("POSENC_LOOKUPS_TRITON", raising=False)
    monkeypatch.setattr(lookups_triton, "CHECKED_ON_GPU", False)
    assert not lookups_triton.offered(gpu_tensor())
    monkeypatch.setenv("POSENC_LOOKUPS_TRITON", "1")
    assert lookups_triton.offered(gpu_tensor()) and not lookups_triton.offered(gpu_tensor(torch.float64))
    assert lookups_triton.offered(gpu_tensor(width=128)) and not lookups_triton.offered(gpu_tensor(width=256))
    assert not lookups_triton.offered(gpu_tensor(torch.float32, 128))  # its tiles do not fit sm_90's shared memory
    monkeypatch.delenv("POSENC_LOOKUPS_TRITON")
    monkeypatch.setattr(lookups_triton, "CHECKED_ON_GPU", True)
    assert lookups_triton.offered(gpu_tensor())


def test_the_kernel_refuses_shapes_it_cannot_serve_in_one_line():
    from posenc.kernels.lookups_triton import lookup_attention

    q, k = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    shift = torch.zeros(2, 8)
    with pytest.raises(ValueError, match=r"table must be \(H or 1, N ≥ 1, Dh\)"):
        lookup_attention(q, k, k, torch.zeros(2, 3, 7), content_shift=shift, lookup_shift=shift, scale=1.0)
    with pytest.raises(ValueError, match="lookup_shift must be"):
        lookup_attention(q, k, k, torch.zeros(2, 4, 8), content_shift=shift, lookup_shift=shift[:1], scale=1.0)
    with pytest.raises(ValueError, match=r"value_floor must be \(Dv,\) = \(8,\)"):
        lookup_attention(q, k, k, torch.zeros(1, 3, 8), values=torch.zeros(1, 3, 8), value_floor=torch.zeros(7),
                         scale=1.0)
    with pytest.raises(ValueError, match="Tq <= Tk"):
        lookup_attention(torch.zeros(1, 2, 5, 8), k, k, torch.zeros(2, 5, 8), content_shift=shift,
                         lookup_shift=shift, scale=1.0)
    wide = torch.zeros(1, 2, 4, 129, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"q's head width must be at most 128 in torch.bfloat16 .* got 129"):
        lookup_attention(wide, wide, wide, torch.zeros(2, 4, 129), scale=1.0)
