"""Hand-made wrong versions of the Triton kernels: each is one plausible bug, and each must fail its kernel's tests
under the interpreter.

mutmut cannot mutate a ``@triton.jit`` body usefully (a mutant must compile, and the interpreter runs a kernel's test
file in a minute or two), and no GPU runs these kernels' CUDA tests yet (stick-breaking, the offset lookups, CoPE,
FIRE): the interpreter tests are all that would notice a wrong number. So these stand for the bugs a reviewer asks
about: a relative shift one off, a window half dropped, a gradient summed in the wrong direction or over the wrong
heads, a count clamped one row early, a scale left out. ``make kernel-mutants`` applies each to a copy of ``src/``
and runs its kernel's test file against it (stopping at the first failure); it prints each mutant's fate and exits 1
if any survived. About 30 minutes on 2 cores; ``make kernel-mutants KERNELS="rope sticks"`` runs some.
"""

from __future__ import annotations

import sys

from tests import hand_mutants

STICKS, STICKS_TESTS = "posenc/kernels/sticks_triton.py", "tests/kernels/test_sticks_triton.py"
LOOKUPS, LOOKUPS_RULES = "posenc/kernels/lookups_jit.py", "posenc/kernels/lookups_triton.py"
LOOKUPS_TESTS = "tests/kernels/test_lookups_triton.py"
COUNTS, WINDOWS = "posenc/kernels/counts_triton.py", "posenc/kernels/count_windows_triton.py"
COUNTS_TESTS = "tests/kernels/test_counts_triton.py"
TERMS, TILES, TILES_RULES = ("posenc/kernels/tiles_terms.py", "posenc/kernels/tiles_jit.py",
                             "posenc/kernels/tiles_triton.py")
TILES_TESTS = "tests/kernels/test_tiles_triton.py"
COLUMNS_TESTS = "tests/kernels/test_value_columns.py"
ROPE, ROPE_TESTS = "posenc/kernels/rope_triton.py", "tests/kernels/test_rope_triton.py"

# (what goes wrong, file under src/, the text, its wrong version, the test file that must fail)
MUTANTS = [
    # stick-breaking
    ("sticks: queries placed at 0 .. Tq − 1 in a KV-cache step", STICKS,
     "rows + (k_len - q_len), offs_d, offs_dv, q, tiles", "rows, offs_d, offs_dv, q, tiles", STICKS_TESTS),
    ("sticks: a key's weight also pays its own stick", STICKS,
     "tl.cumsum(log_rest, axis=1, reverse=True) - log_rest", "tl.cumsum(log_rest, axis=1, reverse=True)",
     STICKS_TESTS),
    ("sticks: the own key allowed whatever attend_current says", STICKS,
     "(cols[None, :] <= q_pos[:, None]) if CURRENT", "(cols[None, :] <= q_pos[:, None]) if True", STICKS_TESTS),
    ("sticks: dz without the taken key's σ(−z)", STICKS, "taken * (1.0 - take)", "taken", STICKS_TESTS),
    ("sticks: the later tiles' Σ A·g not carried", STICKS, "        later_taken += tl.sum(taken, 1)\n", "",
     STICKS_TESTS),
    ("sticks: the suffix Σ A·g summed from the wrong end", STICKS,
     "from_here = tl.cumsum(taken, axis=1, reverse=True)", "from_here = tl.cumsum(taken, axis=1)", STICKS_TESTS),
    ("sticks: every query head's gradient sent to key/value head 0", STICKS, "kv_head = h // group",
     "kv_head = h // heads", STICKS_TESTS),
    ("sticks: the logit scale left out of dz", STICKS, "- take * (total[:, None] - from_here), 0.0) * scale",
     "- take * (total[:, None] - from_here), 0.0)", STICKS_TESTS),
    # Transformer-XL and Shaw
    ("lookups: the relative shift one offset off", LOOKUPS, "at = offs[:, None] - offs[None, :] + BLOCK - 1",
     "at = offs[:, None] - offs[None, :] + BLOCK", LOOKUPS_TESTS),
    ("lookups: the first tile that reads the table skipped", LOOKUPS, "past // BLOCK + 1", "past // BLOCK + 2",
     LOOKUPS_TESTS),
    ("lookups: a row past the table read", LOOKUPS,
     "    inside = (entries >= 0) & (entries < n_entries)\n    return",
     "    inside = (entries >= 0) & (entries <= n_entries)\n    return", LOOKUPS_TESTS),
    ("lookups: the value floor not added", LOOKUPS, "sums, 1.0)[:, None] + floor[None, :]", "sums, 1.0)[:, None]",
     LOOKUPS_TESTS),
    ("lookups: D_i counts the value floor", LOOKUPS_RULES, "(out.float() - floor)", "out.float()", LOOKUPS_TESTS),
    ("lookups: the content shift read from the lookup shift's row", LOOKUPS,
     "content_shift = tl.load(SHIFTS + h * HEAD_DIM", "content_shift = tl.load(SHIFTS + (heads + h) * HEAD_DIM",
     LOOKUPS_TESTS),
    ("lookups: the lookup shift's gradient given the content's", LOOKUPS, "tl.sum(d_lookup, 0) * scale",
     "tl.sum(d_content, 0) * scale", LOOKUPS_TESTS),
    ("lookups: the diagonal tile's last table half not added", LOOKUPS,
     "_add_half(DTABLE_, s_tn, last_base, carried * scale",
     "_add_half(DTABLE_, s_tn, last_base + BLOCK, carried * scale",
     LOOKUPS_TESTS),
    ("lookups: dl without the window's upper half", LOOKUPS,
     "d_lookup += dot(d_lower, lower, DOT) + dot(d_upper, upper, DOT)", "d_lookup += dot(d_lower, lower, DOT)",
     LOOKUPS_TESTS),
    ("lookups: the carried value half summed, not replaced", LOOKUPS,
     "carried_values = dot(tl.trans(p_lower), grad, DOT)", "carried_values += dot(tl.trans(p_lower), grad, DOT)",
     LOOKUPS_TESTS),
    ("lookups: one shared table read with each head's stride", LOOKUPS_RULES,
     "(table.stride(0) if table.shape[0] > 1 else 0)", "table.stride(0)", LOOKUPS_TESTS),
    # CoPE
    ("cope: counts summed from the query's side, not the key's", COUNTS,
     "counted[:, None] + tl.cumsum(gates, axis=1, reverse=True)", "counted[:, None] + tl.cumsum(gates, axis=1)",
     COUNTS_TESTS),
    ("cope: counting stops a row early", COUNTS, "counted, n_rows), 0) < n_rows - 1",
     "counted, n_rows), 0) < n_rows - 2", COUNTS_TESTS),
    ("cope: the filled tiles without Z[P − 1]", COUNTS,
     "products * scale_log2 + at_last[:, None] * 1.4426950408889634", "products * scale_log2", COUNTS_TESTS),
    ("cope: the gates' gradient without gate_scale", COUNTS, "gates * (1.0 - gates) * gate_scale",
     "gates * (1.0 - gates)", COUNTS_TESTS),
    ("cope: a key's own dP counted among the later keys'", COUNTS,
     "tl.cumsum(d_count, axis=1, reverse=True) - d_count", "tl.cumsum(d_count, axis=1, reverse=True)", COUNTS_TESTS),
    ("cope: dq without the filled tiles' Z[P − 1]", COUNTS, "    dq += d_last[:, None] * last_row[None, :]\n", "",
     COUNTS_TESTS),
    ("cope: the filled tiles' table gradient added to row P − 2", COUNTS,
     "tl.atomic_add(DTABLE + (n_rows - 1) * HEAD_DIM", "tl.atomic_add(DTABLE + (n_rows - 2) * HEAD_DIM",
     COUNTS_TESTS),
    ("cope: the next window starts at a ⌈p⌉, skipping a ⌊p⌋", WINDOWS, "tl.where(low >= after, low, high)",
     "high",
     COUNTS_TESTS),
    ("cope: the binary search's last step dropped", WINDOWS,
     "return found + (tl.gather(low, found, 1) >= rows).to(tl.int32)", "return found", COUNTS_TESTS),
    ("cope: ⌈p⌉'s share taken from the row above, not below", WINDOWS,
     "over_first_keys(on_high, from_row_below)", "over_first_keys(on_high, from_row_above)", COUNTS_TESTS),
    ("cope: the float32 table's low part dropped in 16-bit products", WINDOWS, "    if a.dtype == tl.float32:\n",
     "    if a.dtype == tl.float64:\n", COUNTS_TESTS),
    ("cope: the backward's binary search one level short", COUNTS, 'LOG_BLOCK=sizes["BLOCK"].bit_length() - 1',
     'LOG_BLOCK=sizes["BLOCK"].bit_length() - 2', COUNTS_TESTS),
    # FIRE, grouped-query keys' backward, token values, masks (the table and the formulas: docs/history/mutation.md)
    ("fire: the search starts at a quarter of the kinks", TERMS, "    half = keys // 2\n", "    half = keys // 4\n",
     TILES_TESTS),
    ("fire: a tile's last kink not crossed", TERMS,
     "    for r in range(low, high):\n        past = tl.load(fire + keys + r + 1)",
     "    for r in range(low, high - 1):\n        past = tl.load(fire + keys + r + 1)", TILES_TESTS),
    ("fire: the threshold L ignored", TERMS, "normalizer = tl.maximum(q_pos.to(tl.float32), threshold)",
     "normalizer = q_pos.to(tl.float32)", TILES_TESTS),
    ("fire: log(1 + u) rounded at 1 + u", TERMS,
     "return tl.where(grown == 1.0, u, tl.log(grown) * (u / tl.where(grown == 1.0, 1.0, grown - 1.0)))",
     "return tl.log(grown)", TILES_TESTS),
    ("fire: each segment's slope and intercept gradients swapped", TERMS,
     "DFIRE + keys + s, tl.sum(weighted_rows))\n        tl.atomic_add(DFIRE + 2 * keys + s, tl.sum(ds_rows))",
     "DFIRE + keys + s, tl.sum(ds_rows))\n        tl.atomic_add(DFIRE + 2 * keys + s, tl.sum(weighted_rows))",
     TILES_TESTS),
    ("fire: the first segment bounded below by its own kink", TERMS,
     'tl.where(s > 0, tl.load(fire + tl.maximum(s - 1, 0)), float("-inf"))', "tl.load(fire + tl.maximum(s - 1, 0))",
     TILES_TESTS),
    ("fire: a tie at L gives max's whole gradient to L", TERMS,
     "tl.where(threshold == q_pos.to(tl.float32), 0.5, 0.0)", "tl.where(threshold == q_pos.to(tl.float32), 1.0, 0.0)",
     TILES_TESTS),
    ("fire: c's gradient through the normalizer added, not taken", TERMS, "- along * grown", "+ along * grown",
     TILES_TESTS),
    ("fire: c's and L's gradients swapped", TILES, "tl.atomic_add(DTABLE_ + n_entries - 2, tl.sum(first_rows))",
     "tl.atomic_add(DTABLE_ + n_entries - 2, tl.sum(second_rows))", TILES_TESTS),
    ("tiles: a key/value head's group read from the wrong query heads", TILES, "h = kv_head * group + member",
     "h = kv_head + member", TILES_TESTS),
    ("tiles: the keys' token values' gradient with the wrong sign", TILES, "d_values -= tl.sum(ds, 0)",
     "d_values += tl.sum(ds, 0)", TILES_TESTS),
    ("tiles: bidirectional, the ragged last key tile left unmasked", TILES,
     "unmasked_end = k_len // BLOCK_N * BLOCK_N", "unmasked_end = k_len", TILES_TESTS),
    ("tiles: explicit positions' table gradient added pair by pair at the wrong entry", TILES,
     "tl.atomic_add(dtable + entry, ds, mask=ds != 0.0)",
     "tl.atomic_add(dtable + tl.minimum(entry + 1, n_entries - 1), ds, mask=ds != 0.0)",
     TILES_TESTS),
    # the edges of a tile's spans
    ("sticks: a query tile's last key tile missed at some KV-cache shifts", STICKS,
     "tiles = tl.cdiv(tl.minimum(start_m + BLOCK_M + (k_len - q_len), k_len), BLOCK_N)",
     "tiles = tl.cdiv(tl.minimum(start_m + BLOCK_M - 1 + (k_len - q_len), k_len), BLOCK_N)", STICKS_TESTS),
    ("sticks: the backward's weights not rounded as the forward's product read them", STICKS,
     ".to(v_tile.dtype).to(tl.float32)", "", STICKS_TESTS),
    ("lookups: a query tile's last key tile missed at some KV-cache shifts", LOOKUPS,
     "tiles = tl.cdiv(tl.minimum(start_m + BLOCK + (k_len - q_len), k_len), BLOCK)",
     "tiles = tl.cdiv(tl.minimum(start_m + BLOCK - 1 + (k_len - q_len), k_len), BLOCK)", LOOKUPS_TESTS),
    ("lookups: a tile whose least offset is just below N taken for one past the table", LOOKUPS,
     "past = tl.maximum(base_0 - n_entries, -1)", "past = tl.maximum(base_0 - n_entries, 0)", LOOKUPS_TESTS),
    ("lookups: the window's upper half loses its first row", LOOKUPS, "tl.where(key_of_upper >= 0",
     "tl.where(key_of_upper > 0", LOOKUPS_TESTS),
    ("cope: a query tile's last key tile missed at some KV-cache shifts", COUNTS,
     "tiles = tl.cdiv(tl.minimum(start_m + BLOCK + (k_len - q_len), k_len), BLOCK)",
     "tiles = tl.cdiv(tl.minimum(start_m + BLOCK - 1 + (k_len - q_len), k_len), BLOCK)", COUNTS_TESTS),
    ("cope: a window's first row not looked up for ⌊p⌋", WINDOWS, "low_here = (low >= start)",
     "low_here = (low > start)", COUNTS_TESTS),
    ("cope: the next window misses a ⌈p⌉ at its start", WINDOWS, "allowed & (high >= after)",
     "allowed & (high > after)", COUNTS_TESTS),
    ("cope: a sum over no keys read as the first key's", WINDOWS, "* tl.minimum(keys, 1).to(tl.float32)", "",
     COUNTS_TESTS),
    ("tiles: a causal query tile stops a key early", TILES, "end = tl.minimum(k_len, shift + start_m + BLOCK_M)",
     "end = tl.minimum(k_len, shift + start_m + BLOCK_M - 1)", TILES_TESTS),
    ("tiles: a key tile crossing the diagonal taken as unmasked", TILES,
     "unmasked_end = tl.maximum(0, (shift + start_m + 1) // BLOCK_N * BLOCK_N)",
     "unmasked_end = tl.maximum(0, (shift + start_m + 2) // BLOCK_N * BLOCK_N)", TILES_TESTS),
    ("tiles: the keys' backward skips a query tile that sees them", TILES,
     "first = tl.maximum(0, start_n - shift) // BLOCK_M * BLOCK_M",
     "first = tl.maximum(0, start_n - shift + 1) // BLOCK_M * BLOCK_M", TILES_TESTS),
    ("tiles: the keys' backward takes a query tile crossing the diagonal as unmasked", TILES,
     "tl.cdiv(tl.maximum(0, start_n + BLOCK_N - 1 - shift), BLOCK_M)",
     "tl.cdiv(tl.maximum(0, start_n + BLOCK_N - 2 - shift), BLOCK_M)", TILES_TESTS),
    ("tiles: token values differenced against the first query, not the tile's", TILES,
     "reference = tl.load(QVAL + tl.minimum(start_m, q_len - 1))", "reference = tl.load(QVAL)", TILES_TESTS),
    ("tiles: a learned term's gradient from D of the bf16-rounded output", TILES_RULES,
     "wide = q.dtype != torch.float32 and any(ctx.needs_input_grad[3:6])", "wide = False", TILES_TESTS),
    ("fire: the last segment a tile spans gets no gradient", TERMS, "for s in range(low, high + 1):",
     "for s in range(low, high):", TILES_TESTS),
    # values wider than the tiles
    ("columns: float32 values cut at the 16-bit width", TILES_RULES, "step = widest[v.dtype == torch.float32]",
     "step = widest[v.dtype != torch.float32]", COLUMNS_TESTS),
    ("columns: blocks stacked head-major", TILES_RULES,
     "torch.cat([block.transpose(1, 2) for block in blocks], -1).transpose(1, 2)", "torch.cat(blocks, -1)",
     COLUMNS_TESTS),
    # RoPE on q and k, out of place and in place
    ("rope: the backward rotates forward", ROPE,
     "_rotated(grad_q, grad_k, ctx.saved_tensors, ctx.layout, -1.0", "_rotated(grad_q, grad_k, ctx.saved_tensors, "
     "ctx.layout, 1.0", ROPE_TESTS),
    ("rope: the in-place record's backward rotates forward", ROPE, "(cos, sin, cos, sin), ctx.layout, -1.0",
     "(cos, sin, cos, sin), ctx.layout, 1.0", ROPE_TESTS),
    ("rope: keys rotated at the queries' positions", ROPE,
     "k_cos + b * kc_sb + t * kc_st, k_sin + b * kc_sb + t * kc_st",
     "q_cos + b * qc_sb + t * qc_st, q_sin + b * qc_sb + t * qc_st", ROPE_TESTS),
    ("rope: every batch row reads the first row's positions", ROPE,
     "return 0 if table.shape[0] == 1 else table.stride(0)", "return 0", ROPE_TESTS),
    ("rope: the last head group writes past the last head", ROPE, "rows = t < tl.where(head < heads, length, 0)",
     "rows = t < length", ROPE_TESTS),
    ("rope: the last, partial tile of positions dropped", ROPE,
     "grid = (triton.cdiv(max(q_len, k_len), block_t) * batch", "grid = (max(q_len, k_len) // block_t * batch",
     ROPE_TESTS),
    ("rope: partial rotary's other channels not copied out of place", ROPE,
     "BLOCK_REST=0 if in_place or head_dim == 2 * pairs", "BLOCK_REST=0 if True", ROPE_TESTS),
    ("rope: the other channels start one past the pairs", ROPE, "rest = 2 * PAIRS + tl.arange",
     "rest = 2 * PAIRS + 1 + tl.arange", ROPE_TESTS),
    ("rope: an interleaved pair's members swapped", ROPE, "x1, x2 = tl.split(", "x2, x1 = tl.split(", ROPE_TESTS),
    ("rope: the half layout's second half read from the first", ROPE, "x2 = tl.load(x_src + PAIRS + pair",
     "x2 = tl.load(x_src + pair", ROPE_TESTS),
    ("rope: one tensor with a strided last dim rotated in place as if contiguous", ROPE,
     "if q.stride(-1) == 1 and k.stride(-1) == 1:", "if q.stride(-1) == 1 or k.stride(-1) == 1:", ROPE_TESTS),
    ("rope: a head group starts at its number, not its first head", ROPE,
     "length, heads, first = q_len, q_heads, group * HEADS", "length, heads, first = q_len, q_heads, group",
     ROPE_TESTS),
    ("rope: the key head count read from q", ROPE, "k_heads, k_len = k.shape[1], k.shape[2]",
     "k_heads, k_len = q.shape[1], k.shape[2]", ROPE_TESTS),
    ("rope: keys rotated over the queries' length", ROPE, "length, heads, first = k_len, k_heads",
     "length, heads, first = q_len, k_heads", ROPE_TESTS),
    ("rope: the grid's programs split by the queries' length alone", ROPE,
     "program_tile(tl.maximum(q_len, k_len), all_groups, BLOCK_T)", "program_tile(q_len, all_groups, BLOCK_T)",
     ROPE_TESTS),
]


def main(kernels: list[str]) -> int:
    """Runs the mutants of the named kernels (the word before a mutant's colon: ``rope``, ``tiles``, ...), or all."""
    chosen = [m for m in MUTANTS if not kernels or m[0].split(":")[0] in kernels]
    if not chosen:
        raise SystemExit(f"no mutants of {kernels}; kernels: {sorted({m[0].split(':')[0] for m in MUTANTS})}")
    return hand_mutants.run(chosen, lambda mutant: [mutant[4]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
