"""STRING: its position map (exact below the shift, shifted back beyond it) by a float64 loop, through posenc's RoPE
and through a transformers model's attention registry, KV-cache decoding, the smallest shift, and bad options."""

import pytest
import torch

import posenc
from posenc import attention, build
from posenc.cli import main
from posenc.encodings.rotary import apply_rope
from posenc.experiments.pretrained.measure import tiny_llama
from posenc.extension.self_extend import _rotated_attention
from posenc.extension.shifted import (ATTENTION_FACTOR, farthest_distance, shifted, smallest_shift, string_attention,
                                      use_string)
from tests.helpers import assert_swapped_attention_decodes_as_the_full_pass, grouped_qkv
from tests.oracles import position_map_attention_loop

T, DH = 19, 8


def qkv(heads=2, kv_heads=1):
    return grouped_qkv(T, DH, heads, kv_heads)


def position_map_loop(q, k, v, inv_freq, shift, local):
    """Query i, key j ≤ i at distance d = i − j: read at (i, j) if d < shift, else at (i − shift + local, j); logits
    times ATTENTION_FACTOR²."""
    return position_map_attention_loop(q, k, v, inv_freq.tolist(),
                                       lambda i, j: (i if i - j < shift else i - shift + local, j),
                                       logit_factor=ATTENTION_FACTOR**2)


@pytest.mark.parametrize("shift, local", [(5, 2), (8, 0), (3, 2)])
def test_posenc_front_equals_the_position_map(shift, local):
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    expected = position_map_loop(q, k, v, rope.frequencies()[0].double(), shift, local)
    torch.testing.assert_close(string_attention(q, k, v, rope, shift, local), expected, rtol=1e-10, atol=1e-12)


def test_transformers_front_with_pre_rotated_q_and_k_equals_the_position_map():
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    inv_freq = rope.frequencies()[0]
    positions = torch.arange(T)[None]
    got, _ = _rotated_attention(None, apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v, None,
                                inv_freq=inv_freq, window=6, far=shifted(6, 3), logit_factor=ATTENTION_FACTOR**2,
                                scaling=DH**-0.5, position_ids=positions)
    expected = position_map_loop(q, k, v, inv_freq.double(), 6, 3)
    torch.testing.assert_close(got.transpose(1, 2), expected, rtol=1e-9, atol=1e-11)


def test_a_shift_past_the_sequence_is_plain_rope_attention_sharpened_by_the_factor():
    q, k, v = qkv(heads=4, kv_heads=2)
    rope = build("rope", head_dim=DH)
    plain = attention(q, k, v, rope, backend="eager", scale=DH**-0.5 * ATTENTION_FACTOR**2)
    torch.testing.assert_close(string_attention(q, k, v, rope, T, 4), plain)


def test_smallest_shift_keeps_every_distance_inside_the_context_and_is_the_smallest():
    for original, target, local in [(8192, 12288, 128), (8192, 32768, 128), (512, 1024, 128), (64, 100, 8)]:
        shift = smallest_shift(original, target, local)
        assert farthest_distance(target, shift, local) <= original - 1
        assert shift == round(original / 3) or farthest_distance(target, shift - 1, local) > original - 1
    assert smallest_shift(8192, 12288, 128) == 4224  # 12287 − 4224 + 128 = 8191
    assert smallest_shift(8192, 9000, 128) == 2731  # the paper's third of the context when more than enough


def test_in_a_transformers_model_kv_cache_decoding_equals_the_full_pass():
    assert_swapped_attention_decodes_as_the_full_pass(lambda model: use_string(model, 20, 4), prefill=40)


def test_bad_options_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"string local window \(5\) must be below the shift \(5\)"):
        string_attention(*qkv(), build("rope", head_dim=DH), 5, 5)
    with pytest.raises(ValueError, match="string shift must be an integer >= 1, got 0"):
        use_string(None, 0, 0)
    for args, message in [
        (["--string-shift", "300"], "--string-shift apply to the string row: add string to --methods"),
        (["--methods", "string", "--string-shift", "300"], "--string-shift 300 leaves distances up to 851 at --to "
                                                           "1024, past the model's context (512); pass at least 640"),
        (["--methods", "string", "--string-shift", "700", "--string-local", "700"],
         "--string-local (700) must be below --string-shift (700)"),
    ]:
        assert main(["pretrained", "tiny", "--preset", "smoke", "--finetune", "none", "--out",
                     str(tmp_path / "x"), *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, err


def test_cache_steps_with_explicit_positions_and_a_given_scale_equal_the_full_pass():
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    full = string_attention(q, k, v, rope, 6, 2, scale=0.2)
    step = string_attention(q[:, :, -3:], k, v, rope, 6, 2, q_positions=torch.arange(T - 3, T),
                            k_positions=torch.arange(T), scale=0.2)
    torch.testing.assert_close(step, full[:, :, -3:])
    assert (full - string_attention(q, k, v, rope, 6, 2)).abs().max() > 1e-3  # the scale reached the logits


def test_bad_positions_are_one_line_errors_naming_them():
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    with pytest.raises(ValueError, match="q_positions"):
        string_attention(q, k, v, rope, 6, 2, q_positions=torch.arange(T + 1))
    with pytest.raises(ValueError, match="k_positions"):
        string_attention(q, k, v, rope, 6, 2, k_positions=torch.arange(T - 1))
    with pytest.raises(ValueError, match="string local window must be an integer >= 0, got -1"):
        string_attention(q, k, v, rope, 6, -1)


def test_distances_below_the_shift_stay_exact_and_the_smallest_shift_has_a_floor():
    assert farthest_distance(5, 6, 2) == 4 and farthest_distance(6, 6, 2) == 5 and farthest_distance(7, 6, 2) == 2
    assert smallest_shift(100, 90, 60) == 61  # a target inside the context: just past the local window
    with pytest.raises(ValueError, match=r"string local window \(100\) must be below the model's context \(100\)"):
        smallest_shift(100, 200, 100)


def test_packed_documents_under_a_mask_equal_separate_runs():
    q, k, v = qkv()
    rope = build("rope", head_dim=DH)
    doc_ids = torch.tensor([0] * 8 + [1] * (T - 8))
    positions = posenc.document_positions(doc_ids)
    packed = string_attention(q, k, v, rope, 4, 1, q_positions=positions, k_positions=positions,
                              mask=posenc.document_mask(doc_ids))
    separate = torch.cat([string_attention(q[:, :, s], k[:, :, s], v[:, :, s], rope, 4, 1)
                          for s in (slice(0, 8), slice(8, T))], dim=2)
    torch.testing.assert_close(packed, separate)


def test_the_registered_attention_carries_the_references_factor():
    from transformers import AttentionInterface

    name = use_string(tiny_llama(0, 32), 20, 4)
    registered = AttentionInterface()[name]
    assert registered.keywords["logit_factor"] == ATTENTION_FACTOR**2 and registered.keywords["window"] == 20
