"""Dual Chunk Attention: its three position maps (intra, successive, inter chunk) by a float64 loop, through
posenc's RoPE and through a transformers model's attention registry, the piecewise kernel's blocks and empty rows,
KV-cache decoding, and bad options."""

import pytest
import torch

from posenc import attention, build
from posenc.encodings.rotary import apply_rope
from posenc.extension.dual_chunk import (_rotated_attention, chunk_positions, chunked_attention, default_sizes,
                                         dual_chunk_attention, use_dual_chunk)
from posenc.kernels.piecewise import piecewise_attention
from tests.helpers import assert_swapped_attention_decodes_as_the_full_pass, grouped_qkv
from tests.oracles import position_map_attention_loop

T, DH = 31, 8


def qkv(heads=2, kv_heads=1):
    return grouped_qkv(T, DH, heads, kv_heads)


def chunk_map_loop(q, k, v, inv_freq, chunk_size, local):
    """Keys at j mod L (L = chunk_size − local); the query at i mod L (same chunk), min(i mod L + L, chunk_size)
    (the chunk before), chunk_size (earlier)."""
    length = chunk_size - local

    def read_at(i, j):
        gap, place = i // length - j // length, i % length
        return (place if gap == 0 else min(place + length, chunk_size) if gap == 1 else chunk_size), j % length
    return position_map_attention_loop(q, k, v, inv_freq.tolist(), read_at)


@pytest.mark.parametrize("chunk_size, local", [(10, 2), (8, 0), (12, 5)])
def test_posenc_front_equals_the_chunk_maps(chunk_size, local):
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    expected = chunk_map_loop(q, k, v, rope.frequencies()[0].double(), chunk_size, local)
    torch.testing.assert_close(dual_chunk_attention(q, k, v, rope, chunk_size, local), expected, rtol=1e-10,
                               atol=1e-12)


def test_transformers_front_with_pre_rotated_q_and_k_equals_the_chunk_maps():
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    inv_freq = rope.frequencies()[0]
    positions = torch.arange(T)[None]
    got, _ = _rotated_attention(None, apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v, None,
                                inv_freq=inv_freq, chunk_size=10, local=3, scaling=DH**-0.5, position_ids=positions)
    expected = chunk_map_loop(q, k, v, inv_freq.double(), 10, 3)
    torch.testing.assert_close(got.transpose(1, 2), expected, rtol=1e-9, atol=1e-11)


def test_one_chunk_is_plain_rope_attention_and_no_distance_passes_the_chunk_size():
    q, k, v = qkv(heads=4, kv_heads=2)
    rope = build("rope", head_dim=DH)
    torch.testing.assert_close(dual_chunk_attention(q, k, v, rope, T + 4, 4), attention(q, k, v, rope, backend="eager"))
    positions = torch.arange(200)[None]
    (intra, successive, inter), keys, choice = chunk_positions(positions, positions, 40, 8)
    stacked, pick = torch.stack((intra, successive, inter))[:, 0], choice[0, 0]  # (3, 200), (200, 200)
    read = stacked[pick.clamp(min=0), torch.arange(200)[:, None]] - keys[0][None, :]  # the distance each pair reads
    allowed = pick >= 0
    assert int(read[allowed].max()) == 40 and int(read[allowed].min()) == 0
    exact = (positions[0][:, None] - positions[0][None, :]) == read
    early = (torch.arange(200) % 32 <= 8)[:, None]  # the first local + 1 queries of each 32-token chunk
    assert exact[pick == 0].all() and exact[(pick == 1) & early].all()  # their chunk and the one before: exact
    assert not exact[(pick == 1) & ~early].any() and not exact[pick == 2].any()  # clamped or at the chunk size


def test_the_piecewise_kernel_gives_the_same_rows_in_any_block_and_zero_for_an_empty_row():
    q, k, v = qkv()
    choice = torch.randint(-1, 3, (T, T), generator=torch.Generator().manual_seed(3))
    choice[5] = -1  # nothing allowed
    queries = [q, q.flip(-1), q * 2]
    whole = piecewise_attention(queries, k, v, choice, scale=0.3, block=T)
    torch.testing.assert_close(piecewise_attention(queries, k, v, choice, scale=0.3, block=4), whole)
    assert torch.all(whole[:, :, 5] == 0) and whole[:, :, 6].abs().max() > 0


def test_the_piecewise_kernel_computes_bf16_inputs_in_float32():
    """bf16 queries, keys and values: every logit, the softmax and the sum in float32, then one rounding to bf16
    (the float32 inputs' result, rounded) — not arithmetic in bf16."""
    q, k, v = (t.float() for t in qkv())
    choice = torch.randint(-1, 2, (T, T), generator=torch.Generator().manual_seed(4)).tril()
    queries = [q, q * 1.5]
    rounded = [t.to(torch.bfloat16) for t in (*queries, k, v)]
    got = piecewise_attention(rounded[:2], rounded[2], rounded[3], choice, scale=0.3)
    expected = piecewise_attention([t.float() for t in rounded[:2]], rounded[2].float(), rounded[3].float(), choice,
                                   scale=0.3)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected.to(torch.bfloat16))


def test_in_a_transformers_model_kv_cache_decoding_equals_the_full_pass():
    assert_swapped_attention_decodes_as_the_full_pass(lambda model: use_dual_chunk(model, 24, 4), prefill=33)


def test_the_references_sizes_and_bad_options():
    assert default_sizes(8192) == (6144, 512) and default_sizes(4096) == (3072, 256)
    with pytest.raises(ValueError, match=r"dca local window \(5\) must be under half the chunk size \(10\)"):
        dual_chunk_attention(*qkv(), build("rope", head_dim=DH), 10, 5)
    with pytest.raises(ValueError, match="dca chunk size must be an integer >= 2, got 1"):
        use_dual_chunk(None, 1, 0)


def test_cache_steps_with_explicit_positions_and_a_given_scale_equal_the_full_pass():
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    full = dual_chunk_attention(q, k, v, rope, 10, 2, scale=0.2)
    step = dual_chunk_attention(q[:, :, -3:], k, v, rope, 10, 2, q_positions=torch.arange(T - 3, T),
                                k_positions=torch.arange(T), scale=0.2)
    torch.testing.assert_close(step, full[:, :, -3:])
    assert (full - dual_chunk_attention(q, k, v, rope, 10, 2)).abs().max() > 1e-3  # the scale reached the logits


def test_sizes_are_whole_tokens_and_every_bad_option_names_itself():
    assert default_sizes(1001) == (750, 62) and all(isinstance(n, int) for n in default_sizes(1001))
    with pytest.raises(ValueError, match="dca local window must be an integer >= 0, got -1"):
        dual_chunk_attention(*qkv(), build("rope", head_dim=DH), 10, -1)
    with pytest.raises(ValueError, match=r"\(10\): a chunk holds chunk size − local tokens$"):
        dual_chunk_attention(*qkv(), build("rope", head_dim=DH), 10, 5)


def test_float32_queries_give_float32_outputs_near_the_float64_ones():
    q, k, v = qkv()
    choice = chunk_positions(torch.arange(T)[None], torch.arange(T)[None], 10, 2)[2]
    want = piecewise_attention([q, 2 * q, 3 * q], k, v, choice, scale=0.3)
    got = piecewise_attention([t.float() for t in (q, 2 * q, 3 * q)], k.float(), v.float(), choice, scale=0.3)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_bad_positions_and_a_shifted_sequence_in_a_transformers_model_are_one_line_errors():
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    with pytest.raises(ValueError, match="q_positions"):
        dual_chunk_attention(q, k, v, rope, 10, 2, q_positions=torch.arange(T + 1))
    with pytest.raises(ValueError, match="k_positions"):
        dual_chunk_attention(q, k, v, rope, 10, 2, k_positions=torch.arange(T - 1))
    inv_freq = rope.frequencies()[0]
    with pytest.raises(ValueError, match="needs each row's positions to be 0..T−1"):
        _rotated_attention(None, q, k, v, None, inv_freq=inv_freq, chunk_size=10, local=2,
                           position_ids=torch.arange(1, T + 1)[None])


def test_the_transformers_front_keeps_a_padding_mask_bool_or_additive():
    q, k, v = qkv()
    inv_freq = build("rope", head_dim=DH).frequencies()[0]
    allowed = torch.ones(1, 1, T, T, dtype=torch.bool).tril()
    allowed[..., :3] = False  # three padded keys
    allowed[..., :3, :] = True  # (their own rows are discarded by a model; keep them finite here)
    additive = torch.zeros(allowed.shape, dtype=q.dtype).masked_fill(~allowed, torch.finfo(q.dtype).min)
    by_bool, _ = _rotated_attention(None, q, k, v, allowed, inv_freq=inv_freq, chunk_size=10, local=2)
    by_add, _ = _rotated_attention(None, q, k, v, additive, inv_freq=inv_freq, chunk_size=10, local=2)
    unmasked, _ = _rotated_attention(None, q, k, v, None, inv_freq=inv_freq, chunk_size=10, local=2)
    torch.testing.assert_close(by_bool, by_add, rtol=0, atol=0)
    assert (by_bool[:, 5:] - unmasked[:, 5:]).abs().max() > 1e-3  # the padded keys were left out


@pytest.mark.parametrize("q_length, k_length, chunk_size, local, block", [
    (31, 31, 10, 2, 512), (31, 31, 10, 2, 3), (31, 31, 8, 0, 5), (5, 31, 10, 3, 512), (1, 31, 12, 5, 2),
    (9, 40, 40, 4, 4), (17, 17, 40, 4, 512)])
@pytest.mark.parametrize("fused", [True, False], ids=["fused-cpu-calls", "one-softmax"])
def test_the_spans_equal_the_map_per_pair(q_length, k_length, chunk_size, local, block, fused, monkeypatch):
    """chunked_attention (three key spans per block of one chunk's queries) against piecewise_attention with
    chunk_positions' map: prefill and decoding (queries the last Tq), blocks that end inside a chunk and chunks that
    end inside a block, one chunk only, grouped heads; distinct query copies, so a span read with the wrong copy
    or a key in the wrong span shows. Both forms: the CPU's fused calls merged by log-sum-exp, and the one
    softmax other devices run."""
    from posenc.kernels import cpu_flash

    if not fused:
        monkeypatch.setattr(cpu_flash, "NAME", "no such kernel")
    generator = torch.Generator().manual_seed(q_length * 100 + block)
    queries = [torch.randn(2, 4, q_length, DH, dtype=torch.float64, generator=generator) for _ in range(3)]
    k, v = (torch.randn(2, 2, k_length, DH, dtype=torch.float64, generator=generator) for _ in range(2))
    q_pos, k_pos = torch.arange(k_length - q_length, k_length)[None], torch.arange(k_length)[None]
    choice = chunk_positions(q_pos, k_pos, chunk_size, local)[2]
    want = piecewise_attention(queries, k, v, choice, scale=0.3)
    got = chunked_attention(queries, k, v, chunk_size - local, scale=0.3, block=block)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_plain_causal_mask_and_none_take_the_spans_and_padding_the_map(monkeypatch):
    """transformers hands a causal mask (or none): the spans serve it; a padding mask goes through the map per pair,
    which honours it. Both give the loop's numbers where they overlap."""
    from posenc.extension import dual_chunk

    q, k, v = qkv()
    inv_freq = build("rope", head_dim=DH).frequencies()[0]
    positions = torch.arange(T)[None]
    q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
    taken = []
    monkeypatch.setattr(dual_chunk, "chunked_attention",
                        lambda *a, **kw: taken.append("spans") or chunked_attention(*a, **kw))
    causal = torch.ones(1, 1, T, T + 6, dtype=torch.bool).tril()  # longer than the keys, as a cache's mask can be
    outputs = [_rotated_attention(None, q, k, v, mask, inv_freq=inv_freq, chunk_size=10, local=2)[0]
               for mask in (None, causal, torch.zeros(1, 1, T, T).masked_fill(~causal[..., :T], -1e9))]
    assert taken == ["spans"] * 3
    padded = causal[..., :T].clone()
    padded[..., :2] = False
    padded[..., :2, :] = True
    got = _rotated_attention(None, q, k, v, padded, inv_freq=inv_freq, chunk_size=10, local=2)[0]
    assert taken == ["spans"] * 3 and (got[:, 2:] - outputs[0][:, 2:]).abs().max() > 1e-3  # padding changed rows
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0])
