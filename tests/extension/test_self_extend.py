"""Self-Extend and ReRoPE: the paper's equations (float64 loop), posenc's RoPE front and the transformers front
(q and k arrive rotated), window = whole sequence = plain attention, KV-cache decoding = the full pass.

Self-Extend's fronts at their edges: explicit positions, scale and mask through posenc's front; the transformers
front's own scale, additive masks, position check and logit factor; the bounds and names of the helpers.
"""

import copy

import pytest
import torch

from posenc import attention, build
from posenc.encodings.rotary import apply_rope
from posenc.kernels.two_scores import two_score_attention
from posenc.extension.self_extend import (_rotated_attention, farthest_distance, grouped, grouped_positions,
                                          self_extend_attention, smallest_group, use_attention, use_self_extend)
from posenc.experiments.pretrained.measure import tiny_llama
from posenc.extension.self_extend import check_self_extend, use_two_positions
from tests.helpers import decoded_logits
from tests.oracles import self_extend_loop


T, DH = 23, 8


def qkv(heads=2, kv_heads=1, length=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, length, DH, generator=g, dtype=torch.float64),
            torch.randn(1, kv_heads, length, DH, generator=g, dtype=torch.float64),
            torch.randn(1, kv_heads, length, DH, generator=g, dtype=torch.float64))


def oracle(q, k, v, rope, window, group):
    inv_freq = rope.frequencies()[0].double().tolist()
    repeats = q.shape[1] // k.shape[1]
    return torch.stack([self_extend_loop(q[0, h], k[0, h // repeats], v[0, h // repeats], inv_freq, window, group)
                        for h in range(q.shape[1])])[None]


@pytest.mark.parametrize("window,group", [(4, 2), (6, 3), (5, None), (1, 4)])
def test_posenc_front_equals_the_papers_equations(window, group):
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    got = self_extend_attention(q, k, v, rope, window, group)
    torch.testing.assert_close(got, oracle(q, k, v, rope, window, group), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("window,group", [(4, 2), (7, None)])
def test_transformers_front_with_pre_rotated_q_and_k_equals_the_oracle(window, group):
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    inv_freq = rope.frequencies()[0]
    positions = torch.arange(T)[None]
    rotated_q, rotated_k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
    got, _ = _rotated_attention(None, rotated_q, rotated_k, v, None, inv_freq=inv_freq, window=window,
                                far=grouped(window, group), scaling=DH ** -0.5, position_ids=positions)
    torch.testing.assert_close(got.transpose(1, 2), oracle(q, k, v, rope, window, group), rtol=1e-9, atol=1e-11)


def test_a_window_covering_the_sequence_is_plain_rope_attention():
    q, k, v = qkv(heads=4, kv_heads=2)
    rope = build("rope", head_dim=DH)
    torch.testing.assert_close(self_extend_attention(q, k, v, rope, T, 2), attention(q, k, v, rope, backend="eager"))


def test_cache_steps_with_explicit_positions_equal_the_full_pass():
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    full = self_extend_attention(q, k, v, rope, 5, 3)
    step = self_extend_attention(q[:, :, -3:], k, v, rope, 5, 3, q_positions=torch.arange(T - 3, T))
    torch.testing.assert_close(step, full[:, :, -3:])


def test_grouped_distances_meet_the_exact_ones_at_the_window_edge():
    positions = torch.arange(200)
    for window, group in [(16, 2), (32, 4), (10, 3)]:
        q_far, k_far = grouped_positions(positions, window, group)
        for i in range(window, 200):
            j = i - window
            assert abs(int(q_far[i] - k_far[j]) - window) < group  # the grouped distance at the edge ~ the window
            assert int(q_far[i] - k_far[0]) == farthest_distance(i + 1, window, group)


def test_smallest_group_keeps_every_distance_inside_the_original_context():
    for original, target, window in [(8192, 32768, 4096), (8192, 12288, 4096), (64, 512, 16)]:
        group = smallest_group(original, target, window)
        assert farthest_distance(target, window, group) <= original - 1
        assert farthest_distance(target, window, group - 1) > original - 1 or group == 2
    assert smallest_group(8192, 32768, 4096) == 8  # G = 7: 32767//7 + 4096 − 585 = 8192, one past the context


def test_in_a_transformers_model_kv_cache_decoding_equals_the_full_pass_and_the_whole_window_is_sdpa():
    model = tiny_llama(0, 32).double()
    ids = torch.randint(0, 256, (1, 70), generator=torch.Generator().manual_seed(1))
    plain = model(ids).logits
    use_self_extend(model, 70, 4)
    torch.testing.assert_close(model(ids).logits, plain)
    use_self_extend(model, 16, 4)
    full = model(ids).logits
    assert (full - plain).abs().max() > 1e-2  # grouping changed something
    torch.testing.assert_close(decoded_logits(model, ids, 50), full)
    use_attention(model, "sdpa")
    torch.testing.assert_close(model(ids).logits, plain)


@pytest.mark.parametrize("window,group,match", [(0, 2, "window must be an integer >= 1"),
                                                (8, 1, "group must be an integer >= 2")])
def test_bad_window_or_group_is_one_line_error(window, group, match):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=match):
        self_extend_attention(q, k, v, build("rope", head_dim=DH), window, group)


@pytest.mark.parametrize("block", [3, 7, 64])
@pytest.mark.parametrize("window", [1, 5, 30])
def test_the_two_fused_calls_equal_the_general_path_across_blocks(block, window):
    q, k, v = qkv(heads=4, kv_heads=2)
    q_far, k_far = q.flip(-1), k * 0.7
    positions = torch.arange(T)[None]
    args = (q[:, :, -9:], k, q_far[:, :, -9:], k_far, v, positions[:, -9:], positions, window)
    fused = two_score_attention(*args, scale=0.3, block=block)
    general = two_score_attention(*args, scale=0.3, block=block, mask=torch.ones(1, 1, 9, T, dtype=torch.bool))
    torch.testing.assert_close(fused, general, rtol=1e-12, atol=1e-12)


def test_the_fused_path_serves_prefill_and_cache_steps(monkeypatch):
    import posenc.kernels.two_scores as kernel

    calls = []
    monkeypatch.setattr(kernel, "_two_fused_calls", lambda *a: calls.append(a[5]) or torch.zeros(1))
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    self_extend_attention(q, k, v, rope, 5, 2)
    self_extend_attention(q[:, :, -1:], k, v, rope, 5, 2, q_positions=torch.tensor([T - 1]))
    assert calls == [0, T - 1]  # the offsets of a prefill and of a one-token step


def test_explicit_positions_and_a_mask_are_read_a_token_in_front_masked_away_is_a_shift_by_one():
    """Tokens at positions 1..T equal the same tokens behind a dummy at 0 that no query may read."""
    q, k, v = qkv(length=T + 1)
    rope = build("rope", head_dim=DH)
    mask = torch.ones(1, 1, T + 1, T + 1, dtype=torch.bool)
    mask[..., 0] = False
    behind_a_dummy = self_extend_attention(q, k, v, rope, 5, 3, mask=mask)[:, :, 1:]
    shifted = torch.arange(1, T + 1)
    got = self_extend_attention(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], rope, 5, 3, q_positions=shifted,
                                k_positions=shifted)
    torch.testing.assert_close(got, behind_a_dummy, rtol=1e-10, atol=1e-12)
    at_zero = self_extend_attention(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], rope, 5, 3)
    assert (got - at_zero).abs().max() > 1e-3  # grouping by 3 is not shift-invariant by 1: the positions were read


def test_the_scale_multiplies_every_logit():
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    default = self_extend_attention(q, k, v, rope, 5, 2)
    torch.testing.assert_close(self_extend_attention(q, k, v, rope, 5, 2, scale=DH ** -0.5), default)
    torch.testing.assert_close(self_extend_attention(q, k, v, rope, 5, 2, scale=0.5 * DH ** -0.5),
                               self_extend_attention(q * 0.5, k, v, rope, 5, 2))


def rotated(q, k):
    inv_freq = build("rope", head_dim=DH).frequencies()[0]
    positions = torch.arange(q.shape[2])[None]
    return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), inv_freq


def test_the_transformers_front_defaults_to_one_over_root_d_and_reads_additive_and_bool_masks():
    q, k, v = qkv()
    rq, rk, inv_freq = rotated(q, k)
    front = dict(inv_freq=inv_freq, window=5, far=grouped(5, 2))
    given, _ = _rotated_attention(None, rq, rk, v, None, scaling=DH ** -0.5, **front)
    default, _ = _rotated_attention(None, rq, rk, v, None, **front)
    torch.testing.assert_close(default, given)
    halved, _ = _rotated_attention(None, rq, rk, v, None, scaling=0.5 * DH ** -0.5, **front)
    torch.testing.assert_close(halved, _rotated_attention(None, rq * 0.5, rk, v, None, **front)[0])
    documents = torch.tensor([0] * 9 + [1] * 14)
    allowed = (documents[:, None] == documents[None, :])[None, None]  # packed: no query reads the other document
    additive = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    from_additive, _ = _rotated_attention(None, rq, rk, v, additive, **front)
    from_bool, _ = _rotated_attention(None, rq, rk, v, allowed, **front)
    q_pos = torch.arange(T)[None]
    q_far, k_far = grouped(5, 2)(q_pos, q_pos)
    want = two_score_attention(rq, rk, apply_rope(q, q_far, inv_freq), apply_rope(k, k_far, inv_freq), v, q_pos,
                               q_pos, 5, scale=DH ** -0.5, mask=allowed).transpose(1, 2)
    torch.testing.assert_close(from_additive, want)
    torch.testing.assert_close(from_bool, want)
    assert (from_additive - default).abs().max() > 1e-3  # the mask changed the second document


def test_the_transformers_front_refuses_positions_other_than_zero_to_t_and_takes_none():
    q, k, v = qkv()
    rq, rk, inv_freq = rotated(q, k)
    front = dict(inv_freq=inv_freq, window=5, far=grouped(5, 2))
    out, _ = _rotated_attention(None, rq, rk, v, None, position_ids=None, **front)
    assert out.shape == (1, T, 2, DH)
    with pytest.raises(ValueError, match=r"self-extend and STRING in a transformers model need each row's positions "
                                         r"to be 0\.\.T−1 \(one unpadded sequence per row, keys cached in order\)"):
        _rotated_attention(None, rq, rk, v, None, position_ids=torch.arange(1, T + 1)[None], **front)


def test_a_logit_factor_is_the_same_model_with_its_queries_scaled_and_registers_under_its_name():
    model = tiny_llama(0, 32).double()
    ids = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(2))
    sharper = copy.deepcopy(model)
    with torch.no_grad():
        for layer in sharper.model.layers:
            layer.self_attn.q_proj.weight.mul_(1.5)
    want = sharper(ids).logits
    name = use_two_positions(model, "posenc_test_logit_factor_1p5", 40, grouped(40, None), logit_factor=1.5)
    assert name == "posenc_test_logit_factor_1p5" and model.config._attn_implementation == name
    torch.testing.assert_close(model(ids).logits, want)
    use_attention(model, "sdpa")


def test_the_registered_names_say_window_and_group():
    model = tiny_llama(0, 32)
    assert use_self_extend(model, 16, 4) == "posenc_self_extend_w16_g4"
    assert use_self_extend(model, 12, None) == "posenc_self_extend_w12_gclip"
    with pytest.raises(ValueError, match="self-extend group must be an integer >= 2, got 1"):
        use_self_extend(model, 16, 1)


def test_each_bound_holds_at_its_edge():
    check_self_extend(7, 2, target=8)
    with pytest.raises(ValueError, match=r"self-extend window \(8\) must be below --to \(8\): a window that covers "
                                         r"the whole context leaves nothing to group"):
        check_self_extend(8, 2, target=8)
    assert farthest_distance(8, 8, 2) == 7 and farthest_distance(9, 8, 2) == 8 // 2 + 8 - 4
    assert farthest_distance(100, 8, None) == 8 and farthest_distance(8, 8, None) == 7
    assert smallest_group(64, 100, 63) == 50  # a window one below the context: 99 // 50 + 63 − 63 // 50 = 63
    with pytest.raises(ValueError, match=r"self-extend window \(64\) must be below the model's context \(64\)"):
        smallest_group(64, 100, 64)


@pytest.mark.parametrize("which", ["q_positions", "k_positions"])
def test_positions_of_the_wrong_length_or_batch_name_themselves(which):
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    with pytest.raises(ValueError, match=rf"^{which} must have shape \({T},\) or \(1, {T}\) to match the tensors, "
                                         rf"got \({T - 1},\)$"):  # the shape given, not as batched
        self_extend_attention(q, k, v, rope, 5, 2, **{which: torch.arange(T - 1)})
    with pytest.raises(ValueError, match=rf"^{which} must have shape \({T},\) or \(1, {T}\) to match the tensors, "
                                         rf"got \(3, {T}\)$"):
        self_extend_attention(q, k, v, rope, 5, 2, **{which: torch.arange(T).expand(3, -1)})
