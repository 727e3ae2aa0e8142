"""The Triton attention kernel with the position terms inside its tiles (``kernels.tiles_triton``) against float64,
forward and backward, under TRITON_INTERPRET=1 on CPU tensors.

The interpreter is switched on when Triton is imported, so each check runs in a child process. The interpreter's
tiles are 16 × 16, so the shapes here (up to 40 tokens) cross tiles, diagonals and ragged edges.
"""

import importlib.util
import textwrap

import pytest

from tests.kernels.interpreted import run_interpreted

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (the test extra)")

REFERENCE = textwrap.dedent(
    """
    import torch
    from posenc.kernels.tiles_triton import tiled_attention

    def formula_bias(kind, params, offset):
        '''The formulas in float64: (H, 2) params against (B, 1, Tq, Tk) offsets.'''
        a, b = (params[:, i][None, :, None, None] for i in (0, 1))
        distance = offset.double() if kind == "linear" else offset.abs().double()
        if kind in ("linear", "linear_abs"):
            return a * distance
        if kind == "kerple_log":
            return -a * torch.log1p(b * distance)
        return -a * distance.pow(b)

    def reference(q, k, v, scale, causal, table, lowest, tokens, q_pos, k_pos, formula=None):
        '''float64 softmax(scale·q·kᵀ + table[h, offset − lowest] + c_i − c_j)·v, GQA by repeating k and v.'''
        heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
        k, v = (x.repeat_interleave(heads // x.shape[1], 1) for x in (k, v))
        logits = (q @ k.transpose(-1, -2)) * scale
        if q_pos is None:
            q_pos, k_pos = torch.arange(k_len - q_len, k_len)[None], torch.arange(k_len)[None]
        offset = (q_pos[:, :, None] - k_pos[:, None, :])[:, None]
        if table is not None:
            entry = (offset - lowest).clamp(0, table.shape[1] - 1)
            logits = logits + table[torch.arange(heads)[None, :, None, None], entry]
        if tokens is not None:
            logits = logits + (tokens[..., k_len - q_len:, None] - tokens[..., None, :])
        if formula is not None:
            logits = logits + formula_bias(*formula, offset)
        if causal:
            logits = logits.masked_fill(offset < 0, float("-inf"))
        return torch.softmax(logits, -1).nan_to_num(0.0) @ v

    def compare(dtype, tolerance, scale, causal, q, k, v, table=None, lowest=0, tokens=None, q_pos=None,
                k_pos=None, learned=None):
        '''The kernel in ``dtype`` against the reference: output and every input's gradient, each relative to
        the reference's largest magnitude, the table's and token values' within ``learned`` where given; the
        reference reads q, k and v as rounded to ``dtype``.'''
        inputs = [x for x in (q, k, v, table, tokens) if x is not None]
        exact = [(x.to(dtype) if i < 3 else x).double().requires_grad_() for i, x in enumerate(inputs)]  # as rounded
        fast = [x.to(dtype if i < 3 else torch.float32 if x is table else torch.float64).detach().requires_grad_()
                for i, x in enumerate(inputs)]
        def named(xs):
            it = iter(xs)
            q_, k_, v_ = next(it), next(it), next(it)
            return q_, k_, v_, next(it) if table is not None else None, next(it) if tokens is not None else None
        q64, k64, v64, t64, c64 = named(exact)
        expected = reference(q64, k64, v64, scale, causal, t64, lowest, c64, q_pos, k_pos)
        q_, k_, v_, t_, c_ = named(fast)
        got = tiled_attention(q_, k_, v_, scale=scale, causal=causal, table=t_, lowest=lowest, token_values=c_,
                              q_pos=q_pos, k_pos=k_pos)
        assert got.dtype == dtype and got.shape == expected.shape
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact, upstream)
        grads = torch.autograd.grad(got, fast, upstream.to(dtype))
        for name, a, b in zip(("out", "dq", "dk", "dv", "d_table" if table is not None else "d_tokens", "d_tokens"),
                              (got, *grads), (expected, *wanted)):
            error = float((a.double() - b).abs().max() / b.abs().max())
            bound = learned if learned is not None and name in ("d_table", "d_tokens") else tolerance
            assert error < bound, (name, error, dtype, causal, tuple(q.shape), tuple(k.shape))
    """
)


def _run(check: str) -> None:
    assert run_interpreted(REFERENCE + textwrap.dedent(check)).strip().endswith("ok")


@pytest.mark.parametrize("dtype, tolerance, learned, cases", [("float32", 1e-5, 1e-5, 24), ("bfloat16", 5e-2, 2e-2, 18)],
                         ids=["float32", "bfloat16"])
def test_tiles_equal_float64_with_an_offset_table_and_token_values(dtype, tolerance, learned, cases):
    """Causal and bidirectional, grouped-query, a KV-cache step (Tq < Tk), head widths that are no power of two
    and a value width unlike the key's; the table's gradient (reduced along the tiles' diagonals) and the token
    values' gradient (row and column sums) included, the values also near −3·10^4 (each side differenced against a
    float64 reference, else float32 loses 4e-4) and falling by 10^5 where a query tile starts (the reference is
    each tile's own); float32 to 1e-5, bfloat16 to 5e-2, and its table's and token values' gradients to 2e-2.
    Those sum dS = P·(dP − D) over pairs whose exact sums cancel; with D from the bf16-rounded output (as
    FlashAttention takes it) the table's missed by 0.144 at one seed of five (each of 0, 1,000, …, 4,000 added to
    every seed), by 7.6e-3 at worst with D from the float32 output the kernel now keeps for them."""
    _run(f"""
    dtype, tolerance, learned, expected_cases = torch.{dtype}, {tolerance!r}, {learned!r}, {cases!r}
    """ + """
    torch.manual_seed(0)
    cases = 0
    for causal in (True, False):
        for batch, heads, kv_heads, q_len, k_len, width, value_width in (
                (2, 4, 2, 37, 37, 8, 8), (1, 2, 2, 5, 40, 16, 8), (2, 2, 1, 33, 33, 12, 20)):
            q = torch.randn(batch, heads, q_len, width)
            k, v = torch.randn(batch, kv_heads, k_len, width), torch.randn(batch, kv_heads, k_len, value_width)
            lowest = 0 if causal else -(k_len - 1)
            table = torch.randn(heads, k_len - lowest)
            tokens = (torch.randn(1, heads, k_len) - 1).cumsum(-1) * 3 if causal else None  # FoX: causal only
            compare(dtype, tolerance, 0.3, causal, q, k, v)
            compare(dtype, tolerance, 0.3, causal, q, k, v, table=table, lowest=lowest, learned=learned)
            compare(dtype, tolerance, 0.3, causal, q, k, v, table=table, lowest=lowest, tokens=tokens,
                    learned=learned)
            cases += 3
            if causal and dtype == torch.float32:  # c far from 0, as late in a long FoX context: its digits kept
                compare(dtype, tolerance, 0.3, causal, q, k, v, tokens=tokens.double() - 30000.123456789)
                # a gate that shuts where a query tile starts (c falls by 10^5 there): the later tiles' c is
                # differenced against their own tile's first query, not the first query's (c_0 − 10^5 in
                # float32 keeps 3 bits after the point)
                shut = tokens.double() - 1e5 * (torch.arange(k_len) >= 16)
                compare(dtype, tolerance, 0.3, causal, q, k, v, tokens=shut)
                cases += 2
    assert cases == expected_cases
    print("ok")
    """)


def test_tiles_equal_float64_at_explicit_positions():
    """Positions per batch row: one a KV-cache window, one shuffled (rows with no allowed key return zeros); the
    table spans every offset and its gradient is added pair by pair."""
    _run("""
    torch.manual_seed(1)
    q_pos = torch.stack([torch.arange(14, 35), torch.randperm(40)[:21]])
    k_pos = torch.stack([torch.arange(35), torch.randperm(40)[:35]])
    lowest = int(q_pos.min() - k_pos.max())
    entries = int(q_pos.max() - k_pos.min()) - lowest + 1
    for causal in (True, False):
        q, k, v = torch.randn(2, 2, 21, 8), torch.randn(2, 1, 35, 8), torch.randn(2, 1, 35, 8)
        compare(torch.float32, 1e-5, 0.5, causal, q, k, v, table=torch.randn(2, entries), lowest=lowest,
                q_pos=q_pos, k_pos=k_pos)
    print("ok")
    """)


def test_tiles_equal_float64_whatever_their_sizes_on_a_gpu():
    """The tiles a GPU takes differ from the interpreter's square 16 × 16: forward tiles twice as tall as wide
    (``TIMED``'s 128 × 64 and float32's 64 × 32, each with a backward tile of the forward's width), and wider than
    tall. Each shape here, causal (a KV-cache step among them) and bidirectional, contiguous and at explicit
    positions, crosses several tiles of every size and their diagonals."""
    _run("""
    from posenc.kernels import tiles_triton

    torch.manual_seed(2)
    cases = 0
    for tiles in (tiles_triton.Tiles(32, 16, 1, 16, 1, 1), tiles_triton.Tiles(16, 32, 1, 32, 1, 1)):
        tiles_triton._blocks = lambda q, value_dim, kind, contiguous, tiles=tiles: tiles
        for causal in (True, False):
            for heads, kv_heads, q_len, k_len in ((2, 1, 45, 70), (2, 2, 70, 70)):
                q, k, v = torch.randn(1, heads, q_len, 8), torch.randn(1, kv_heads, k_len, 8), torch.randn(
                    1, kv_heads, k_len, 8)
                lowest = 0 if causal else -(k_len - 1)
                tokens = (torch.randn(1, heads, k_len) - 1).cumsum(-1) if causal else None
                compare(torch.float32, 1e-5, 0.3, causal, q, k, v, table=torch.randn(heads, k_len - lowest),
                        lowest=lowest, tokens=tokens)
                cases += 1
            q_pos, k_pos = torch.randperm(80)[None, :45], torch.randperm(80)[None, :70]
            lowest = int(q_pos.min() - k_pos.max())
            q, k, v = torch.randn(1, 2, 45, 8), torch.randn(1, 1, 70, 8), torch.randn(1, 1, 70, 8)
            compare(torch.float32, 1e-5, 0.3, causal, q, k, v, table=torch.randn(2, int(q_pos.max() - k_pos.min())
                    - lowest + 1), lowest=lowest, q_pos=q_pos, k_pos=k_pos)
            cases += 1
    assert cases == 12
    print("ok")
    """)


def test_a_kv_cache_step_at_every_shift_of_the_diagonal_equals_float64():
    """Causal, queries the last Tq of the keys at every shift Tk − Tq modulo the tiles (the interpreter's 16 × 16 and
    a GPU's shapes: 32 × 16 forward tiles with a backward of 16, 16 × 32 with 32), with two query tiles: where the
    diagonal falls decides the last key tile a query tile visits, the first one it masks, and the query tiles each
    key tile's backward visits and masks. A span one key off at some shifts passed every other test here."""
    _run("""
    from posenc.kernels import tiles_triton

    torch.manual_seed(3)
    cases = 0
    for tiles, q_len, period in ((tiles_triton.INTERPRETED, 18, 16), (tiles_triton.Tiles(32, 16, 1, 16, 1, 1), 34, 32),
                                 (tiles_triton.Tiles(16, 32, 1, 32, 1, 1), 34, 32)):
        tiles_triton._blocks = lambda q, value_dim, kind, contiguous, tiles=tiles: tiles
        for shift in range(period):
            k_len = q_len + shift
            q, k, v = torch.randn(1, 2, q_len, 8), torch.randn(1, 1, k_len, 8), torch.randn(1, 1, k_len, 8)
            compare(torch.float32, 1e-5, 0.3, True, q, k, v, table=torch.randn(2, k_len))
            cases += 1
    assert cases == 80
    print("ok")
    """)


def test_the_tiles_form_equals_eager_for_every_encoding_it_serves():
    """``forms._tiles_form`` through each encoding whose bias is a table of offsets (FIRE below its threshold)
    and FoX's gates: the output and the gradients of q, k, v and every learned parameter equal float64 eager, at
    the model's own positions and at explicit ones."""
    _run("""
    import copy
    import posenc
    from posenc.encodings.registry import REGISTRY
    from posenc.kernels import forms

    torch.manual_seed(2)
    served = []
    sizes = {"head_dim": 8, "num_heads": 2, "dim": 16, "max_positions": 64}
    built = [(entry.name, posenc.encodings.build_for_model(
        entry.name, sizes=sizes, **({"sinusoid_dim": 8} if entry.name == "sandwich" else {})))
        for entry in REGISTRY if entry.axes == 1 and entry.in_attention]
    # T5 whose last buckets start within 24 tokens, so whole tiles read one entry (flat_offsets)
    built += [(f"t5 short{' both ways' if both else ''}", posenc.build("t5", num_heads=2, num_buckets=6,
                                                                       max_distance=6, bidirectional=both))
              for both in (False, True)]
    built.append(("kerple power", posenc.build("kerple", num_heads=2, variant="power")))
    # FIRE past its threshold (queries beyond 12 divide by their own ψ(i)), and a query exactly at it
    built.append(("fire past its threshold", posenc.build("fire", num_heads=2, width=8, init_threshold=12.0)))
    for name, encoding in built:
        with torch.no_grad():
            for parameter in encoding.parameters():
                parameter.add_(0.1 * torch.randn_like(parameter))
        for causal, contiguous in ((True, True), (False, True), (True, False)):
            if (not causal and encoding.causal_only) or (encoding.has_token_gates and not contiguous):
                continue
            q_len, k_len = (40, 40) if contiguous else (20, 30)  # 40: tiles wholly past a short T5's buckets
            q_pos = torch.arange(k_len - q_len, k_len)[None] if contiguous else torch.randperm(40)[:q_len][None]
            k_pos = torch.arange(k_len)[None] if contiguous else torch.randperm(40)[:k_len][None]
            q, k, v = torch.randn(2, 2, q_len, 8), torch.randn(2, 2, k_len, 8), torch.randn(2, 2, k_len, 8)
            gates = torch.nn.functional.logsigmoid(torch.randn(2, 2, k_len) + 2)

            def positioned(enc, dtype):
                at = enc.at(q_pos, k_pos, contiguous=contiguous)
                return at.with_gates(gates.to(dtype).requires_grad_()) if enc.has_token_gates else at

            at = positioned(encoding, torch.float32)
            if not forms.tiles_serve(q, at, causal):
                continue
            reference = copy.deepcopy(encoding).double()
            exact = [x.double().requires_grad_() for x in (q, k, v)]
            at64 = positioned(reference, torch.float64)
            expected = posenc.attention(*exact, at64, causal=causal, backend="eager")
            fast = [x.requires_grad_() for x in (q, k, v)]
            got = forms._tiles_form(*fast, at, causal, None, 8 ** -0.5, causal)
            upstream = torch.randn_like(expected)
            extra = lambda a, enc: ([a.log_forget] if enc.has_token_gates else []) + list(enc.parameters())
            wanted = torch.autograd.grad(expected, exact + extra(at64, reference), upstream, allow_unused=True)
            grads = torch.autograd.grad(got, fast + extra(at, encoding), upstream.float(), allow_unused=True)
            for a, b in zip((got, *grads), (expected, *wanted)):
                if b is None:
                    assert a is None or float(a.abs().max()) == 0.0
                    continue
                error = float((a.double() - b).abs().max() / b.abs().max().clamp_min(1.0))
                assert error < 2e-5, (name, causal, contiguous, error)
            served.append((name, causal, contiguous))
    names = {name for name, _, _ in served}
    assert {"alibi", "t5", "kerple", "sandwich", "fire", "fox", "t5 short", "t5 short both ways", "kerple power",
            "fire past its threshold"} <= names, names
    assert ("t5", True, False) in served and ("fox", True, True) in served
    print("ok")
    """)


def test_tiles_equal_float64_with_a_formula_bias():
    """ALiBi's linear kinds and Kerple's two, computed inside the tiles: values and the gradients of q, k, v and the
    (H, 2) parameters, at contiguous and explicit positions."""
    _run("""
    from posenc.kernels.tiles_triton import Formula
    torch.manual_seed(3)
    q_pos, k_pos = torch.randperm(50)[:21][None], torch.randperm(50)[:35][None]
    for kind in ("linear", "linear_abs", "kerple_log", "kerple_power"):
        for causal in (True, False):
            for positions in ({}, {"q_pos": q_pos, "k_pos": k_pos}):
                q_len, k_len = (21, 35) if positions else (37, 37)
                q, k, v = torch.randn(2, 2, q_len, 8), torch.randn(2, 1, k_len, 8), torch.randn(2, 1, k_len, 8)
                params = torch.rand(2, 2) + 0.2
                exact = [x.double().requires_grad_() for x in (q, k, v, params)]
                fast = [x.clone().requires_grad_() for x in (q, k, v, params)]
                expected = reference(*exact[:3], 0.4, causal, None, 0, None, positions.get("q_pos"),
                                     positions.get("k_pos"), formula=(kind, exact[3]))
                got = tiled_attention(*fast[:3], scale=0.4, causal=causal, formula=Formula(kind, fast[3]),
                                      **positions)
                upstream = torch.randn_like(expected)
                wanted = torch.autograd.grad(expected, exact, upstream)
                grads = torch.autograd.grad(got, fast, upstream.float())
                for name, a, b in zip(("out", "dq", "dk", "dv", "dparams"), (got, *grads), (expected, *wanted)):
                    error = float((a.double() - b).abs().max() / b.abs().max())
                    # the parameters' gradient sums ds times offsets up to 50 over every pair: float32's rounding
                    assert error < (1e-4 if name == "dparams" else 2e-5), (kind, causal, bool(positions), name, error)
    print("ok")
    """)


def test_a_tile_on_a_flat_run_of_the_table_reads_one_entry_and_adds_one_sum():
    """A table whose entries from ``high`` on (and up to ``low``) are one value: the output equals float64,
    and the gradient summed over each run (what one shared parameter receives) equals float64's; entries between
    the runs get their own. Tiles wholly on a run add their sum at its first entry, tiles across its edge per
    entry. In bfloat16 such a tile's logits read the run's one number; in float32 every pair reads its entry."""
    _run("""
    torch.manual_seed(4)
    # runs that start on and off the tiles' grid of entries (16-row tiles: a tile's least entry is 1, 17, ...); at
    # low = 24 the tile of queries 0-15 and keys 32-39 lies wholly on the low run
    runs = ((True, -1, 9), (True, -1, 2), (True, -1, 18), (False, 2, 48), (False, -1, 24), (False, 24, 48))
    for dtype, tolerance, (causal, low, high) in [(torch.float32, 2e-5, run) for run in runs] + [
            (torch.bfloat16, 2e-2, run) for run in runs[::3] + runs[-1:]]:
        q, k, v = (torch.randn(1, 2, 40, 8).to(dtype).float() for _ in range(3))  # exact in dtype
        lowest = 0 if causal else -39
        table = torch.randn(2, 40 - lowest)
        table[:, high:] = table[:, high:high + 1]
        if low >= 0:
            table[:, :low + 1] = table[:, :1]
        exact = [x.double().requires_grad_() for x in (q, k, v, table)]
        fast = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [table.clone().requires_grad_()]
        expected = reference(*exact[:3], 0.4, causal, exact[3], lowest, None, None, None)
        got = tiled_attention(*fast[:3], scale=0.4, causal=causal, table=fast[3], lowest=lowest, flat=(low, high))
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact, upstream)
        grads = torch.autograd.grad(got, fast, upstream.to(got.dtype))

        def folded(g):
            middle = g[:, max(low, 0) + (low >= 0):high]
            runs = [g[:, high:].sum(1, keepdim=True)] + ([g[:, :low + 1].sum(1, keepdim=True)] if low >= 0 else [])
            return torch.cat([middle, *runs], 1)
        for name, a, b in zip(("out", "dq", "dk", "dv", "dtable"), (got, *grads[:3], folded(grads[3])),
                              (expected, *wanted[:3], folded(wanted[3]))):
            error = float((a.double() - b).abs().max() / b.abs().max())
            assert error < tolerance, (dtype, causal, low, high, name, error)
        # tiles wholly on the run put their sum at its first entry (per entry it differs from float64's); at 18 no
        # tile lies wholly on it (the nearest starts at 17), so there the values check the run's first entry
        if high != 18 and dtype == torch.float32:
            assert float((grads[3][:, high] - wanted[3][:, high]).abs().max()) > 1e-3
    print("ok")
    """)


def test_a_tile_on_a_declared_flat_run_reads_one_number_in_bf16_and_each_pairs_entry_in_float32():
    """Where a tile lies wholly on a flat run, bf16 logits read the run's one number (part of what the first lend
    timed for T5) and float32's read each pair's entry (the branch made ptxas spill 7,680 bytes a thread): given a
    table that is not flat past the entry declared flat, float32 equals the call without ``flat``, bf16 does not."""
    _run("""
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
    table = torch.randn(2, 40)
    for dtype in (torch.float32, torch.bfloat16):
        tensors = [x.to(dtype) for x in (q, k, v)]
        declared = tiled_attention(*tensors, scale=0.4, table=table, flat=(-1, 9))
        plain = tiled_attention(*tensors, scale=0.4, table=table)
        gap = float((declared.float() - plain.float()).abs().max())
        assert (gap == 0.0) == (dtype == torch.float32), (dtype, gap)
    print("ok")
    """)


@pytest.mark.parametrize("width, spread, c", [(5, 0.35, None), (32, 1.0, None), (33, 1.2, None), (5, 0.35, 1e-4)],
                         ids=["width5", "width32", "width33", "width5-small-c"])  # one child each: 30 s, not 2 min
def test_fire_tiles_read_its_mlp_as_segments_and_equal_float64_eager(width, spread, c):
    """FIRE through ``forms._tiles_form``, its MLP read as linear segments per pair (``kernels.fire_segments``),
    against float64 eager: the output and the gradients of q, k, v and every parameter (the MLP's weights and
    biases, c, L), causal and bidirectional, at the model's positions (queries below and past L = 12, one at it; a
    KV-cache step) and at explicit ones (a window at offset 14, shuffled), grouped-query heads, widths 5, 32 and 33
    (P = 8, 64, 64 keys), W1 with negative and zero entries and kinks of both signs exactly at x = 0, where every
    diagonal pair lies (torch's relu'(0) = 0 there). Width 5's kinks lie below 0.35, so tiles far from the diagonal
    lie in one segment (one FMA per pair), near it they span several and step through the kinks in their range.
    And c = 10^-4, with no kink below x = 0 (elsewhere a unit's key is −inf and segment 0 holds no pair), where
    ψ(u) = log(1 + c·u) needs log1p's digits (rounded at 1 + u, x loses 3 of them).

    The parameters' gradients sum ds over every pair, and each row's ds sums to 0: their float32 error follows
    the sum of the terms, not the result. Over seeds 1, 2, 5, 7 and 8 the tiles' worst (per max |gradient|, at least
    1) was 1.5e-5 for the MLP's, 9.5e-5 for L's, 9.2e-5 for c's, 2.3e-2 for c's at c = 10^-4, whose two terms cancel
    to c·max(q, L) of their size (float32 eager's c: up to 1.8e-4 and 3.0e-2 on the same draws); the bounds are 2-5
    times those. The output and dq, dk, dv stay at 2e-5."""
    _run(f"""
    width, spread, c = {width!r}, {spread!r}, {c!r}
    """ + """
    import copy
    import posenc
    from posenc.kernels import forms
    from posenc.kernels.fire_segments import segment_of

    torch.manual_seed(5)

    def fire(width, spread, c=None):
        encoding = posenc.build("fire", num_heads=2, width=width, init_threshold=12.0)
        with torch.no_grad():
            w1, b1 = encoding.mlp[0].weight[:, 0], encoding.mlp[0].bias
            w1.copy_(torch.randn(width) * 4)
            w1[1], w1[2], w1[3], w1[4] = 0.0, -abs(w1[2]), abs(w1[3]), -abs(w1[4])
            b1.copy_(-w1 * torch.rand(width) * spread)  # kinks in [0, spread], where x lies
            b1[1], b1[3], b1[4] = 0.3, 0.0, 0.0  # a constant unit; kinks at x = 0 of both signs
            encoding.mlp[2].weight.normal_()
            if c is not None:  # and unit 4's kink at x = 0.1: no key below 0, the diagonal pairs in segment 0
                encoding.log_scale.fill_(c)
                b1[4] = -w1[4] * 0.1
            else:
                encoding.log_scale.add_(0.05)
        return encoding

    def compare(encoding, causal, q_pos, k_pos, contiguous, kv_heads):
        q = torch.randn(2, 2, q_pos.shape[-1], 8)
        k, v = torch.randn(2, kv_heads, k_pos.shape[-1], 8), torch.randn(2, kv_heads, k_pos.shape[-1], 8)
        reference = copy.deepcopy(encoding).double()
        exact = [x.double().requires_grad_() for x in (q, k, v)]
        expected = posenc.attention(*exact, reference.at(q_pos, k_pos, contiguous=contiguous), causal=causal,
                                    backend="eager")
        at = encoding.at(q_pos, k_pos, contiguous=contiguous)
        fast = [x.requires_grad_() for x in (q, k, v)]
        assert forms.tiles_serve(q, at, causal)
        got = forms._tiles_form(*fast, at, causal, None, 8 ** -0.5, causal)
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact + list(reference.parameters()), upstream)
        grads = torch.autograd.grad(got, fast + list(encoding.parameters()), upstream.float())
        names = ("out", "dq", "dk", "dv", *(name for name, _ in encoding.named_parameters()))
        small_c = encoding.log_scale.item() < 1e-3
        bounds = {"log_scale": 5e-2 if small_c else 5e-4, "threshold": 5e-4, "out": 2e-5, "dq": 2e-5, "dk": 2e-5,
                  "dv": 2e-5}  # the MLP's weights and biases: 5e-5 (see the docstring)
        for name, a, b in zip(names, (got, *grads), (expected, *wanted)):
            error = float((a.double() - b).abs().max() / b.abs().max().clamp_min(1.0))
            assert error < bounds.get(name, 5e-5), (encoding, causal, contiguous, kv_heads, name, error)

    contiguous = torch.arange(40)[None]
    window = (torch.arange(14, 35)[None], torch.arange(35)[None])
    shuffled = (torch.randperm(40)[:21][None], torch.randperm(40)[:35][None])
    encoding = fire(width, spread, c)
    if width == 5:  # 16 x 16 tiles of the 40 x 40 pairs in one segment, and across several
        x = encoding.interpolated_distance(contiguous, contiguous, torch.float32)[0]
        keys = encoding.offset_formula()[1][0, :8]
        counts = [len(segment_of(x[i:i + 16, j:j + 16], keys).unique()) for i in (0, 16, 32) for j in (0, 16, 32)]
        assert min(counts) == 1 and max(counts) > 2, counts
    for causal in (True, False):
        compare(encoding, causal, contiguous, contiguous, True, 1)
        compare(encoding, causal, *shuffled, False, 2)
    compare(encoding, True, contiguous[:, 19:], contiguous, True, 2)  # a KV-cache step: 21 queries, 40 keys
    compare(encoding, True, *window, False, 1)
    print("ok")
    """)


def test_the_kernel_refuses_terms_it_cannot_take_in_one_line():
    """Each before any launch: positions for one side only, token values at explicit positions, a table and a
    formula at once, a table without a row per head, q, k and v of more than one dtype, a head wider than the tiles
    fit a GPU's shared memory (256 in bf16, 128 in float32: Triton would refuse it only at launch)."""
    import torch

    from posenc.kernels.tiles_triton import Formula, tiled_attention

    q = torch.zeros(1, 2, 4, 8)
    positions = torch.arange(4)[None]
    linear = Formula("linear", torch.zeros(2, 2))
    for terms, message in (({"q_pos": positions}, "pass both q_pos and k_pos, or neither"),
                           ({"q_pos": positions, "k_pos": positions, "token_values": torch.zeros(1, 2, 4)},
                            "token_values take the queries as the last Tq keys"),
                           ({"table": torch.zeros(2, 4), "formula": linear}, "as a table or as a formula, not both"),
                           ({"table": torch.zeros(3, 4)}, r"table must be \(H, N\) = \(2, N >= 1\), got \(3, 4\)")):
        with pytest.raises(ValueError, match=message):
            tiled_attention(q, q, q, scale=1.0, **terms)
    with pytest.raises(ValueError, match="one dtype, got torch.bfloat16, torch.float32 and torch.float32"):
        tiled_attention(q.bfloat16(), q, q, scale=1.0, formula=linear)
    for dtype, widest in ((torch.bfloat16, 256), (torch.float32, 128)):
        wide = torch.zeros(1, 2, 4, widest + 1, dtype=dtype)
        with pytest.raises(ValueError, match=rf"at most {widest} in {dtype} .* got {widest + 1}"):
            tiled_attention(wide, wide, wide, scale=1.0, formula=linear)


def test_a_gpu_runs_a_backward_tile_of_32_past_width_128_and_two_stages_past_64():
    """The rule's adjustments by width, which the suite's compile check cannot pin (at 256 the 64 × 64 backward
    fits; it spills up to 2,392 bytes a thread, 32 × 32 at most 232): every kind and dtype. The width is the wider
    of the heads and the values (narrow heads with values of 512 asked for 297 KiB of shared memory)."""
    import torch

    from posenc.kernels import tiles_jit, tiles_triton
    from tests.kernels.interpreted import gpu_tensor

    for dtype in (torch.bfloat16, torch.float32):
        for kind, contiguous in ((tiles_jit.LINEAR, True), (tiles_jit.FIRE, True), (tiles_jit.TABLE, False)):
            rule = {width: tiles_triton._blocks(gpu_tensor(dtype, width), width, kind, contiguous)
                    for width in (64, 65, 128, 129)}
            for width in (65, 129):
                assert tiles_triton._blocks(gpu_tensor(dtype, 16), width, kind, contiguous) == rule[width]
                assert tiles_triton._blocks(gpu_tensor(dtype, width), 16, kind, contiguous) == rule[width]
            assert rule[64].stages == 3 and rule[65].stages == rule[129].stages == 2, (dtype, kind)
            assert rule[128].backward == rule[64].backward and rule[129].backward == min(rule[64].backward, 32)
            assert rule[129].backward == 32 and rule[129].forward_m == rule[128].forward_m, (dtype, kind)
