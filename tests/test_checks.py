"""The argument checks every public entry point runs first: each accepts its boundary, refuses one step past it, and
its ValueError names the parameter, the valid range and the value given."""

import re
from types import SimpleNamespace

import pytest
import torch

from posenc import checks


def refused(message: str):
    return pytest.raises(ValueError, match="^" + re.escape(message) + "$")


def test_integers_take_their_minimum_and_refuse_bools_floats_and_less():
    assert checks.positive_int("steps", 1) == 1 and checks.positive_int("n", 3, minimum=3) == 3
    for value, shown in ((0, "0"), (True, "True"), (2.0, "2.0"), ("4", "'4'")):
        with refused(f"steps must be an integer >= 1, got {shown}"):
            checks.positive_int("steps", value)
    with refused("n must be an integer >= 3, got 2"):
        checks.positive_int("n", 2, minimum=3)
    assert checks.even_int("head_dim", 2) == 2 and type(checks.even_int("head_dim", 8)) is int
    with refused("head_dim must be an even integer >= 2, got 7"):
        checks.even_int("head_dim", 7)
    with refused("head_dim must be an integer >= 2, got 0"):
        checks.even_int("head_dim", 0)


def test_numbers_take_their_bound_only_where_inclusive():
    assert checks.positive_float("base", 2) == 2.0 and type(checks.positive_float("base", 2)) is float
    assert checks.positive_float("factor", 1.0, minimum=1.0, inclusive=True) == 1.0
    assert checks.positive_float("factor", 1.5, minimum=1.0) == 1.5
    with refused("factor must be a finite number > 1.0, got 1.0"):
        checks.positive_float("factor", 1.0, minimum=1.0)
    with refused("factor must be a finite number >= 1.0, got 0.999"):
        checks.positive_float("factor", 0.999, minimum=1.0, inclusive=True)
    for value, shown in ((0, "0"), (False, "False"), (float("nan"), "nan"), (float("inf"), "inf"), ("2", "'2'"),
                         (None, "None")):
        with refused(f"base must be a finite number > 0.0, got {shown}"):
            checks.positive_float("base", value)
    with refused("base must be a finite number >= 0.0, got nan"):
        checks.positive_float("base", float("nan"), inclusive=True)
    with refused("factor must be a finite number >= 1.0, got 1" + "0" * 309):
        checks.positive_float("factor", 10 ** 309, minimum=1.0, inclusive=True)  # an int past float's range


def test_a_choice_lists_its_options_sorted():
    assert checks.choice("backend", "eager", ("eager", "auto")) == "eager"
    for value in ("flash", None, ["eager"]):
        with refused(f"backend must be one of ['auto', 'eager'], got {value!r}"):
            checks.choice("backend", value, ("eager", "auto"))


def test_positions_are_one_or_b_rows_of_t_non_negative_integers():
    assert checks.batched_positions("positions", [3, 4]).tolist() == [[3, 4]]
    assert checks.batched_positions("positions", torch.zeros(2, 5)).shape == (2, 5)
    with refused("positions must have shape (T,) or (B or 1, T), got (1, 2, 5)"):
        checks.batched_positions("positions", torch.zeros(1, 2, 5))

    got = checks.positions("q_positions", torch.tensor([0, 2, 5], dtype=torch.int32), 3, 4)
    assert got.dtype == torch.int64 and got.tolist() == [[0, 2, 5]]
    assert checks.positions("q_positions", [[1, 2, 3]] * 4, 3, 4).shape == (4, 3)
    assert checks.positions("q_positions", torch.zeros(1, 0, dtype=torch.long), 0, 2).shape == (1, 0)  # no tokens
    for dtype in (torch.float32, torch.bool, torch.complex64):
        with refused(f"q_positions must be an integer tensor, got dtype {dtype}"):
            checks.positions("q_positions", torch.zeros(3, dtype=dtype), 3, 4)
    for shape in ((4,), (2, 3), (4, 3, 1), (5, 3)):
        with refused(f"q_positions must have shape (3,) or (4, 3) to match the tensors, got {shape}"):
            checks.positions("q_positions", torch.zeros(shape, dtype=torch.long), 3, 4)
    with refused("q_positions must be >= 0, got minimum -1"):
        checks.positions("q_positions", torch.tensor([[0, 1, 2], [5, -1, 0]]), 3, 2)


def test_attention_tensors_agree_with_each_other_and_the_encoding():
    any_encoding = SimpleNamespace(num_heads=None)
    q, kv = torch.zeros(2, 4, 5, 8), torch.zeros(2, 2, 7, 8)
    checks.attention_tensors(q, kv, kv, any_encoding)  # grouped-query: 4 query heads over 2
    checks.attention_tensors(q, kv, kv, SimpleNamespace(num_heads=4, head_dim=8))
    with refused("v must be a 4-D tensor (B, H, T, D), got (2, 7, 8)"):
        checks.attention_tensors(q, kv, kv[0], any_encoding)
    with refused("q must be a 4-D tensor (B, H, T, D), got (4, 5, 8)"):
        checks.attention_tensors(q[0], kv, kv, any_encoding)
    with refused("k must be a 4-D tensor (B, H, T, D), got list"):
        checks.attention_tensors(q, [], kv, any_encoding)
    with refused("q, k and v must share one dtype, got torch.float32, torch.float32 and torch.float64"):
        checks.attention_tensors(q, kv, kv.double(), any_encoding)
    with refused("q, k and v must share one dtype, got torch.float32, torch.bfloat16 and torch.float32"):
        checks.one_dtype(q, kv.bfloat16(), kv)
    heads = ("q, k, v must share the batch B, and k, v the heads Hkv, with the query heads H a multiple of Hkv "
             "(grouped-query attention): got q {}, k {}, v {}")
    for k, v in ((torch.zeros(1, 2, 7, 8), torch.zeros(1, 2, 7, 8)), (kv, torch.zeros(2, 1, 7, 8)),
                 (torch.zeros(2, 3, 7, 8), torch.zeros(2, 3, 7, 8))):
        with refused(heads.format(tuple(q.shape), tuple(k.shape), tuple(v.shape))):
            checks.attention_tensors(q, k, v, any_encoding)
    with refused("q and k must have the same head width Dh: got 8 and 6"):
        checks.attention_tensors(q, kv[..., :6], kv, any_encoding)
    with refused("k and v must have the same length Tk: got 7 and 6"):
        checks.attention_tensors(q, kv, kv[:, :, :6], any_encoding)
    with refused("the encoding was built for num_heads=2 but the tensors have H=4 heads"):
        checks.attention_tensors(q, kv, kv, SimpleNamespace(num_heads=2))
    with refused("the encoding was built for head_dim=16 but the tensors have Dh=8"):
        checks.attention_tensors(q, kv, kv, SimpleNamespace(num_heads=None, head_dim=16))
    for dtype in (torch.int64, torch.bool, torch.complex64):
        with refused(f"q, k and v must be floating-point tensors (float16, bfloat16, float32 or float64), got {dtype}"):
            checks.attention_tensors(*(x.to(dtype) for x in (q, kv, kv)), any_encoding)
    for q_len, k_len in ((0, 7), (5, 0), (0, 0)):
        with refused(f"q and k must hold at least one position each (Tq, Tk >= 1), got Tq={q_len} and Tk={k_len}"):
            checks.attention_tensors(q[:, :, :q_len], kv[:, :, :k_len], kv[:, :, :k_len], any_encoding)


def test_a_scale_is_none_or_a_finite_number_above_zero():
    for scale in (None, 0.125, 2, 1e-30):
        checks.attention_scale(scale)
    for scale in (0, -0.5, float("nan"), float("inf"), "0.5", True, torch.tensor(0.5)):
        with refused(f"scale must be None (1/sqrt(Dh)) or a finite number > 0, got {scale!r}"):
            checks.attention_scale(scale)


def test_a_mask_is_bool_and_broadcasts_to_the_scores():
    shape = (2, 4, 5, 7)
    for mask in (torch.ones(1, 1, 5, 7, dtype=torch.bool), torch.ones(shape, dtype=torch.bool),
                 torch.ones(2, 1, 1, 7, dtype=torch.bool)):
        checks.attention_mask(mask, shape)
    with refused("mask must be a bool tensor (True = may attend), got torch.float32"):
        checks.attention_mask(torch.ones(shape), shape)
    with refused("mask must be a bool tensor (True = may attend), got <class 'list'>"):
        checks.attention_mask([True], shape)
    for bad in ((5, 7), (3, 4, 5, 7), (1, 1, 5, 6), (1, 1, 1, 1, 1)):
        with refused(f"mask must be 4-D, each dim 1 or that of (B, H, Tq, Tk) = {shape}, got {bad}"):
            checks.attention_mask(torch.ones(bad, dtype=torch.bool), shape)


def test_sinks_are_one_logit_per_query_head():
    checks.sink_logits(None, 4)
    checks.sink_logits(torch.zeros(4), 4)
    with refused("sink must be a tensor of one logit per query head, shape (4,), got (2,)"):
        checks.sink_logits(torch.zeros(2), 4)
    with refused("sink must be a tensor of one logit per query head, shape (4,), got list"):
        checks.sink_logits([0.0] * 4, 4)
