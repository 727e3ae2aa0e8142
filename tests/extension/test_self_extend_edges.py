"""Self-Extend's fronts at their edges: explicit positions, scale and mask through posenc's front; the transformers
front's own scale, additive masks, position check and logit factor; the bounds and names of the helpers."""

import copy

import pytest
import torch

from posenc import build
from posenc.encodings.rotary import apply_rope
from posenc.experiments.pretrained.measure import tiny_llama
from posenc.extension.self_extend import (_rotated_attention, check_self_extend, farthest_distance, grouped,
                                          self_extend_attention, smallest_group, use_attention, use_self_extend,
                                          use_two_positions)
from posenc.kernels.two_scores import two_score_attention
from tests.extension.test_self_extend import DH, T, qkv


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
                                         rf"got \(1, {T - 1}\)$"):
        self_extend_attention(q, k, v, rope, 5, 2, **{which: torch.arange(T - 1)})
    with pytest.raises(ValueError, match=rf"^{which} must have shape \({T},\) or \(1, {T}\) to match the tensors, "
                                         rf"got \(3, {T}\)$"):
        self_extend_attention(q, k, v, rope, 5, 2, **{which: torch.arange(T).expand(3, -1)})
