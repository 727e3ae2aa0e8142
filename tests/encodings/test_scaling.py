"""

RoPE's scalings, RoPE itself and the LongRoPE candidates at their edges: YaRN's ramp clamped at both ends and
of zero width (against transformers), the attention factors at factor 1, each validation at its bound with the
parameter it names, in-place rotation, partial heads in the interleaved layout, and a candidate RoPE used before
its rows are set.
"""

import itertools
import math
import re

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

import posenc
from posenc.encodings.rotary import RoPE, apply_rope
from posenc.encodings.scaling import layer_scalings, normalize_scaling, rope_frequencies, rotary_dim, yarn_ramp_bounds
from posenc.extension.longrope import CandidateRoPE, longrope_parameters, plain_frequencies


HEAD_DIM = 64
CASES = [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0, "partial_rotary_factor": 0.75},
    {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 2048},
    {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 512,
     "partial_rotary_factor": 0.5},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 2048},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
     "mscale": 1.0, "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 2048,
     "truncate": False, "partial_rotary_factor": 0.5, "attention_factor": 1.3},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + i / 64 for i in range(32)],
     "long_factor": [float(i + 1) for i in range(32)], "original_max_position_embeddings": 2048, "factor": 4.0},
    {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 16, "long_factor": [2.0] * 16,
     "original_max_position_embeddings": 2048, "max_position_embeddings": 8192, "partial_rotary_factor": 0.5},
    {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5, "factor": 8.0},
]


def width(params: dict) -> int:
    """Frequencies returned: the rotated pairs, or every pair of the head for p-RoPE."""
    if params["rope_type"] == "proportional":
        return HEAD_DIM // 2
    return int(HEAD_DIM * params.get("partial_rotary_factor", 1.0)) // 2


def transformers_frequencies(params: dict, seq_len):
    """The same dict through transformers 5.23's own functions."""
    params = dict(params)
    max_positions = params.pop("max_position_embeddings", None) or params.get("original_max_position_embeddings", 2048)
    if params["rope_type"] == "dynamic":  # transformers reads the training length from the config
        max_positions = params.pop("original_max_position_embeddings")
    if params["rope_type"] == "llama3":
        max_positions *= 2
    config = LlamaConfig(
        hidden_size=HEAD_DIM * 4, num_attention_heads=4, head_dim=HEAD_DIM,
        max_position_embeddings=max_positions, rope_parameters=params,
    )
    if params["rope_type"] == "default":
        return PhiRotaryEmbedding.compute_default_rope_parameters(config)  # honours partial_rotary_factor
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, seq_len=seq_len)


@pytest.mark.parametrize("params", CASES, ids=lambda p: p["rope_type"])
@pytest.mark.parametrize("seq_len", [None, 1000, 3000, 20000])
def test_frequencies_equal_transformers_bit_for_bit(params, seq_len):
    theirs, their_factor = transformers_frequencies(params, seq_len)
    ours, our_factor = posenc.rope_frequencies(HEAD_DIM, params, seq_len=seq_len)
    assert ours.shape == (width(params),)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    assert torch.equal(ours, theirs)
    assert our_factor == pytest.approx(their_factor, rel=1e-12)


def grid(rope_type: str, **axes) -> list[dict]:
    """Every combination of the axes' values on top of a base dict of that type."""
    base = {"rope_type": rope_type, "rope_theta": 10000.0}
    cases = [base]
    for key, values in axes.items():
        cases = [{**case, key: value} for case in cases for value in values]
    return [{k: v for k, v in case.items() if v is not None} for case in cases]


GRID = (
    grid("yarn", factor=[1.5, 4.0, 32.0], original_max_position_embeddings=[512, 4096],
         mscale=[None, 0.707, 1.0], mscale_all_dim=[None, 1.0], truncate=[None, False],
         partial_rotary_factor=[None, 0.5])
    + grid("yarn", factor=[4.0], original_max_position_embeddings=[2048], beta_fast=[8, 64], beta_slow=[0.5, 2],
           attention_factor=[None, 0.9])
    + grid("proportional", partial_rotary_factor=[0.125, 0.25, 0.5, 0.75, 1.0], factor=[None, 1.0, 8.0],
           rope_theta=[10000.0, 1000000.0])
    + grid("llama3", factor=[2.0, 8.0, 32.0], low_freq_factor=[0.5, 1.0], high_freq_factor=[4.0, 8.0],
           original_max_position_embeddings=[1024, 8192])
    + grid("linear", factor=[1.0, 2.5, 64.0], partial_rotary_factor=[None, 0.25, 0.75])
    + grid("dynamic", factor=[1.5, 8.0], original_max_position_embeddings=[256, 4096], partial_rotary_factor=[None, 0.5])
    + grid("longrope", short_factor=[[1.0] * 32, [1.0 + i / 8 for i in range(32)]],
           long_factor=[[2.0 + i for i in range(32)]], original_max_position_embeddings=[1024, 4096],
           factor=[None, 2.0, 16.0], attention_factor=[None, 1.1])
)


@pytest.mark.parametrize("seq_len", [None, 900, 1100, 5000, 70000])
def test_every_key_over_a_grid_equals_transformers_bit_for_bit(seq_len):
    """Each key 5.23 reads, crossed with the others, below and above the original length
    (longrope switches factor lists there, dynamic starts growing its base)."""
    for params in GRID:
        if params["rope_type"] == "longrope" and "factor" not in params:
            params = {**params, "max_position_embeddings": 4 * params["original_max_position_embeddings"]}
        theirs, their_factor = transformers_frequencies(params, seq_len)
        ours, our_factor = posenc.rope_frequencies(HEAD_DIM, params, seq_len=seq_len)
        assert torch.equal(ours, theirs), params
        assert our_factor == pytest.approx(their_factor, rel=1e-12), params


def test_proportional_rotates_the_fast_pairs_over_the_whole_head_and_leaves_the_rest():
    """p-RoPE's frequencies are the default ones of the *full* head, cut to the fastest pairs;
    partial_rotary_factor instead spreads the same number of pairs over a narrower width."""
    full = default()
    p_rope, _ = posenc.rope_frequencies(HEAD_DIM, {"rope_type": "proportional", "partial_rotary_factor": 0.25})
    narrow, _ = posenc.rope_frequencies(HEAD_DIM, {"partial_rotary_factor": 0.25})
    assert torch.equal(p_rope[:8], full[:8]) and torch.equal(p_rope[8:], torch.zeros(24))
    assert narrow.shape == (8,) and not torch.equal(narrow, p_rope[:8])
    rope = posenc.build("rope", head_dim=HEAD_DIM, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25})
    q, k = torch.randn(1, 2, 5, HEAD_DIM), torch.randn(1, 2, 5, HEAD_DIM)
    positions = torch.arange(100, 105)[None]
    rq, rk = rope.rotate(q, k, positions, positions)
    still = torch.cat((torch.arange(8, 32), torch.arange(40, 64)))  # pairs (c, c + 32) for c >= 8
    torch.testing.assert_close(rq[..., still], q[..., still], rtol=0, atol=0)
    assert not torch.allclose(rq[..., :8], q[..., :8])


def test_per_layer_type_dicts_are_split_not_misread():
    from transformers import Gemma3TextConfig

    config = Gemma3TextConfig(hidden_size=64, num_attention_heads=4, head_dim=16, num_hidden_layers=2,
                              intermediate_size=64, vocab_size=97)
    nested = config.rope_parameters
    with pytest.raises(ValueError, match="one scaling per layer type .*sliding_attention, full_attention"):
        posenc.build("rope", head_dim=16, scaling=nested)
    split = posenc.layer_scalings(nested)
    assert set(split) == {"sliding_attention", "full_attention"}
    assert split["full_attention"]["rope_theta"] == 1000000.0 and split["sliding_attention"]["rope_theta"] == 10000.0
    assert posenc.layer_scalings({"rope_type": "linear", "factor": 2.0})["all"]["factor"] == 2.0
    assert set(posenc.layer_scalings({"full_attention": {"rope_type": "default"}, "nope": None})) == {"full_attention"}


def test_rotating_only_some_heads_leaves_the_others_as_nope_heads():
    """The third partial rotary: whole heads. Float64 oracle per head; under GQA the key heads
    that the rotated query heads read rotate with them."""
    q, k = torch.randn(2, 6, 7, 8, dtype=torch.float64), torch.randn(2, 3, 7, 8, dtype=torch.float64)
    positions = torch.arange(3, 10)[None]
    full = posenc.build("rope", head_dim=8)
    some = posenc.build("rope", head_dim=8, rotary_heads=4)
    fq, fk = full.rotate(q, k, positions, positions)
    sq, sk = some.rotate(q, k, positions, positions)
    torch.testing.assert_close(sq[:, :4], fq[:, :4], rtol=0, atol=0)
    torch.testing.assert_close(sq[:, 4:], q[:, 4:], rtol=0, atol=0)
    torch.testing.assert_close(sk[:, :2], fk[:, :2], rtol=0, atol=0)
    torch.testing.assert_close(sk[:, 2:], k[:, 2:], rtol=0, atol=0)
    with pytest.raises(ValueError, match="rotary_heads=3 must be .* multiple of the query heads per key head"):
        posenc.build("rope", head_dim=8, rotary_heads=3).rotate(q, k, positions, positions)
    with pytest.raises(ValueError, match="rotary_heads must be an integer >= 1"):
        posenc.build("rope", head_dim=8, rotary_heads=0)


def default(dim=HEAD_DIM, base=10000.0):
    return posenc.rope_frequencies(dim, {"rope_theta": base})[0]


def test_relations_between_scalings():
    inv = default()
    linear, _ = posenc.rope_frequencies(HEAD_DIM, {"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(linear, inv / 4)
    ntk, _ = posenc.rope_frequencies(HEAD_DIM, {"rope_type": "ntk", "factor": 4.0})
    torch.testing.assert_close(ntk, default(base=10000.0 * 4.0 ** (HEAD_DIM / (HEAD_DIM - 2))))
    assert ntk[0] == inv[0]  # NTK keeps the fastest frequency
    torch.testing.assert_close(ntk[-1], inv[-1] / 4, rtol=1e-5, atol=0)  # ... and interpolates the slowest
    dynamic = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 512}
    torch.testing.assert_close(posenc.rope_frequencies(HEAD_DIM, dynamic, seq_len=300)[0], inv)
    torch.testing.assert_close(posenc.rope_frequencies(HEAD_DIM, dynamic, seq_len=896)[0], ntk)  # base·(4·896/512 − 3) = base·4
    yarn, attn = posenc.rope_frequencies(HEAD_DIM, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512})
    assert torch.all(yarn <= inv) and torch.all(yarn >= inv / 4 * (1 - 1e-6))
    assert attn == pytest.approx(0.1 * math.log(4.0) + 1.0)
    for params in CASES:  # factor 1 leaves every type equal to the default
        if params["rope_type"] in ("linear", "yarn", "llama3"):
            unit = {**params, "factor": 1.0, "partial_rotary_factor": 1.0, "rope_theta": 10000.0}
            unit.pop("attention_factor", None)
            got, factor = posenc.rope_frequencies(HEAD_DIM, unit)
            torch.testing.assert_close(got, default(), msg=params["rope_type"])
            assert factor == 1.0


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32, "factor": 2.0,
            "original_max_position_embeddings": 16}


@pytest.mark.parametrize(
    "scaling, message",
    [
        ({"rope_type": "magic"}, "rope_type must be one of"),
        ({"rope_type": "yarn", "factor": 4.0}, r"needs \['original_max_position_embeddings'\]"),
        ({"rope_type": "linear", "factor": 0.5}, "factor must be a finite number >= 1.0"),
        ({"rope_type": "linear", "factor": 2.0, "fator": 1}, r"unknown keys \['fator'\]"),
        ({"rope_type": "dynamic", "factor": 2.0}, r"needs \['original_max_position_embeddings'\]"),
        ({"rope_type": "default", "partial_rotary_factor": 1.5}, r"partial_rotary_factor must be in \(0, 1\]"),
        ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "original_max_position_embeddings": 8,
          "factor": 2.0}, "short_factor must have dim/2 = 32 entries"),
        # each of these once ran: no scaling at all, NaN logits, a ZeroDivisionError or a TypeError deep inside
        ({"factor": 4.0}, r"^the scaling dict gives \['factor'\] but no rope_type to read them; name one of "
                          r"\['dynamic', 'linear', 'llama3', 'longrope', 'ntk', 'proportional', 'yarn'\]$"),
        ({**YARN, "attention_factor": math.nan}, r"^attention_factor must be a finite number > 0.0, got nan$"),
        ({**YARN, "attention_factor": 0}, r"^attention_factor must be a finite number > 0.0, got 0$"),
        ({**YARN, "mscale": -1}, r"^mscale must be a finite number >= 0.0, got -1$"),
        ({**YARN, "beta_fast": "32"}, r"^beta_fast must be a finite number > 0.0, got '32'$"),
        ({**LLAMA3, "low_freq_factor": 0.0}, r"^low_freq_factor must be a finite number > 0.0, got 0.0$"),
        ({**LONGROPE, "short_factor": [1.0] * 31 + [0.0]}, r"^short_factor must be a list of finite numbers > 0 "),
        ({**LONGROPE, "long_factor": [math.nan] * 32}, r"^long_factor must be a list of finite numbers > 0 "),
        ({**LONGROPE, "short_factor": 1.0}, r"^short_factor must be a list of finite numbers > 0 .*got 1.0$"),
        ({**LONGROPE, "short_factor": ["1"] * 32}, r"^short_factor must be a list of finite numbers > 0 "),
        ({**LONGROPE, "short_factor": torch.ones(32)}, r"^short_factor must be a list of finite numbers > 0 "),
    ],
    ids=lambda value: re.sub(r"[^A-Za-z0-9]+", "_", value)[:60].strip("_") if isinstance(value, str) else None,
)
def test_bad_scaling_dicts_raise_clear_errors(scaling, message):
    with pytest.raises(ValueError, match=message):
        posenc.rope_frequencies(HEAD_DIM, scaling)


def test_odd_rotary_dim_is_rejected():
    with pytest.raises(ValueError, match="rotary dim"):
        posenc.rope_frequencies(10, {"partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match="head_dim must be an even integer"):
        posenc.build("rope", head_dim=7)


def test_legacy_type_key_is_accepted():
    legacy, _ = posenc.rope_frequencies(HEAD_DIM, {"type": "linear", "factor": 2.0})
    torch.testing.assert_close(legacy, default() / 2)


@pytest.mark.parametrize("original, beta_fast, beta_slow, truncate", [(10 ** 9, 32, 1, True), (8, 32, 1, True),
                                                                     (4096, 2, 2, False)])
def test_yarn_equals_transformers_where_its_ramp_is_clamped_or_has_no_width(original, beta_fast, beta_slow, truncate):
    params = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": original,
              "beta_fast": beta_fast, "beta_slow": beta_slow, "truncate": truncate}
    low, high = yarn_ramp_bounds(params, HEAD_DIM)
    assert (high == HEAD_DIM - 1) if original == 10 ** 9 else (low == 0) if original == 8 else (low == high)
    ours, factor = rope_frequencies(HEAD_DIM, params)
    theirs, their_factor = transformers_frequencies(params, None)
    assert torch.equal(ours, theirs.float()) and factor == pytest.approx(their_factor)


def test_attention_factors_of_ntk_longrope_at_factor_one_and_rotary_defaults():
    ntk = {"rope_type": "ntk", "factor": 2.0}
    assert rope_frequencies(16, ntk)[1] == 1.0
    at_one = longrope_parameters([1.0] * 8, factor=1.0, original=512)
    assert rope_frequencies(16, at_one)[1] == 1.0
    assert rope_frequencies(16, longrope_parameters([1.0] * 8, factor=4.0, original=512))[1] == pytest.approx(
        math.sqrt(1 + math.log(4) / math.log(512)))
    assert rotary_dim(64) == 64 and rotary_dim(64, 0.5) == 32 and rotary_dim(64, 0.5, "proportional") == 64
    assert torch.equal(plain_frequencies(16, 500.0), 1.0 / 500.0 ** (torch.arange(0, 16, 2).float() / 16))


def test_layer_scalings_fill_in_the_base_they_are_given():
    got = layer_scalings({"full_attention": {"rope_type": "default"}, "sliding_attention": None}, base=500.0)
    assert list(got) == ["full_attention"] and got["full_attention"]["rope_theta"] == 500.0
    assert layer_scalings({"rope_type": "default"}, base=700.0)["all"]["rope_theta"] == 700.0
    assert layer_scalings({"full_attention": {"rope_type": "default"}})["full_attention"]["rope_theta"] == 10000.0


@pytest.mark.parametrize("scaling, message", [
    ({"full_attention": {"rope_type": "default"}}, r"holds one scaling per layer type \(full_attention\); a RoPE takes "
                                                   r"one of them, e\.g\. scaling=rope_parameters\['full_attention'\] "
                                                   r"\(posenc\.layer_scalings splits them\)"),
    ({"rope_theta": 0.5}, r"^rope_theta must be a finite number > 1\.0, got 0\.5$"),
    ({"partial_rotary_factor": 0}, r"^partial_rotary_factor must be in \(0, 1\], got 0$"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0},
     r"^original_max_position_embeddings must be an integer >= 1, got 0$"),
    ({"rope_type": "longrope", "original_max_position_embeddings": 64, "short_factor": [1.0], "long_factor": [1.0]},
     r"^rope_type='longrope' needs 'factor' or 'max_position_embeddings' in the scaling dict$"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 2.0, "high_freq_factor": 2.0,
      "original_max_position_embeddings": 64}, r"^llama3 scaling needs high_freq_factor > low_freq_factor$"),
])
def test_each_refusal_names_what_is_wrong(scaling, message):
    with pytest.raises(ValueError, match=message):
        normalize_scaling(scaling)


def test_the_edges_that_are_accepted_and_the_sizes_that_are_not():
    assert normalize_scaling({"rope_theta": 1.5})["rope_theta"] == 1.5
    assert rope_frequencies(2)[0].shape == (1,)  # the smallest rotary dim
    assert rope_frequencies(4, {"rope_type": "ntk", "factor": 2.0})[0].shape == (2,)
    with pytest.raises(ValueError, match=r"^rope_type='dynamic' needs a rotary dim > 2 \(its exponent is d/\(d-2\)\), "
                                         r"got 2$"):
        rope_frequencies(2, {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8})
    with pytest.raises(ValueError, match="^head_dim must be an integer >= 1, got 0$"):
        rope_frequencies(0)
    with pytest.raises(ValueError, match="^seq_len must be an integer >= 1, got 0$"):
        rope_frequencies(8, seq_len=0)
    longrope = longrope_parameters([1.0] * 8, factor=2.0, original=8)
    for which, seq_len in itertools.product(("short_factor", "long_factor"), (8, 9)):  # refused at either length
        with pytest.raises(ValueError, match=f"^{which} must have dim/2 = 8 entries, got 4$"):
            rope_frequencies(16, {**longrope, which: [1.0] * 4}, seq_len=seq_len)
    for fast, slow in ((1, 32), (None, 40), (0.5, None)):
        with pytest.raises(ValueError, match=rf"^yarn scaling needs beta_fast >= beta_slow .* got beta_fast={fast} and "
                                             rf"beta_slow={slow} \(None: 32 and 1\)$"):
            rope_frequencies(16, {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8,
                                  "beta_fast": fast, "beta_slow": slow})
    for scaling in ("yarn", [("rope_type", "linear")], 2.0):
        for refuses in (lambda: rope_frequencies(16, scaling), lambda: layer_scalings(scaling)):
            with pytest.raises(ValueError, match=rf"^scaling must be None or a dict .*, got {re.escape(repr(scaling))}$"):
                refuses()


def test_rope_refuses_a_bad_layout_or_base_by_name_and_takes_a_base_between_one_and_two():
    with pytest.raises(ValueError, match=r"^layout must be one of \['half', 'interleaved'\], got 'pairs'$"):
        RoPE(8, layout="pairs")
    with pytest.raises(ValueError, match=r"^base must be a finite number > 1\.0, got 0\.5$"):
        RoPE(8, base=0.5)
    assert RoPE(8, base=1.5).scaling["rope_theta"] == 1.5
    with pytest.raises(ValueError, match=r"^scaling must be None or a dict .*, got 'yarn'$"):
        RoPE(8, scaling="yarn")
    longrope = longrope_parameters([1.0] * 4, factor=2.0, original=8)
    with pytest.raises(ValueError, match="^long_factor must have dim/2 = 4 entries, got 3$"):  # at once, not past 8
        RoPE(8, scaling={**longrope, "long_factor": [1.0] * 3})


def test_apply_rope_takes_positions_of_shape_t_and_refuses_what_does_not_match_x_by_name():
    x, inv_freq = torch.randn(2, 3, 5, 8, dtype=torch.float64), rope_frequencies(8)[0]
    rows = torch.arange(5)
    assert torch.equal(apply_rope(x, rows, inv_freq), apply_rope(x, rows[None].expand(2, 5), inv_freq))
    back = apply_rope(apply_rope(x, rows, inv_freq), -rows, inv_freq)  # a negative position rotates backwards
    torch.testing.assert_close(back, x, rtol=0, atol=1e-12)
    for positions in (torch.arange(6), torch.arange(5.0), torch.zeros(3, 5, dtype=torch.long), torch.ones(5) > 0):
        with pytest.raises(ValueError, match=rf"^positions must be an integer tensor of shape \(5,\) or \(2, 5\) to "
                                             rf"match x, got {positions.dtype} {re.escape(str(tuple(positions.shape)))}$"):
            apply_rope(x, positions, inv_freq)
    for freq in (rope_frequencies(16)[0], inv_freq[None]):
        with pytest.raises(ValueError, match=rf"^inv_freq must be a \(F,\) tensor with 2F <= Dh = 8, got "
                                             rf"{re.escape(str(tuple(freq.shape)))}$"):
            apply_rope(x, rows, freq)
    with pytest.raises(ValueError, match=r"^x must be a 4-D tensor \(B, H, T, Dh\), got \(3, 5, 8\)$"):
        apply_rope(x[0], rows, inv_freq)
    with pytest.raises(ValueError, match=r"^layout must be one of \['half', 'interleaved'\], got 'pairs'$"):
        apply_rope(x, rows, inv_freq, layout="pairs")


def test_apply_rope_defaults_to_the_half_layout_and_rotation_in_place_writes_the_inputs():
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    positions, inv_freq = torch.arange(5)[None], rope_frequencies(8)[0]
    assert torch.equal(apply_rope(x, positions, inv_freq), apply_rope(x, positions, inv_freq, layout="half"))
    assert not torch.equal(apply_rope(x, positions, inv_freq), apply_rope(x, positions, inv_freq, layout="interleaved"))
    rope = RoPE(8)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    want_q, want_k = rope.rotate(q, k, positions, positions)
    at = rope.at(positions, positions)
    q_in, k_in = q.clone(), k.clone()
    got_q, got_k = rope.rotate_positioned(at, q_in, k_in, in_place=True)
    torch.testing.assert_close(q_in, want_q)  # the inputs themselves hold the rotation
    torch.testing.assert_close(k_in, want_k)
    assert got_q.data_ptr() == q_in.data_ptr()


def test_rotary_heads_rotate_in_the_interleaved_layout_and_bound_the_heads():
    q, k = torch.randn(1, 4, 6, 8, dtype=torch.float64), torch.randn(1, 2, 6, 8, dtype=torch.float64)
    positions = torch.arange(6)[None]
    some = RoPE(8, layout="interleaved", rotary_heads=2)
    full = RoPE(8, layout="interleaved")
    got_q, got_k = some.rotate(q, k, positions, positions)
    want_q, want_k = full.rotate(q, k, positions, positions)
    torch.testing.assert_close(got_q[:, :2], want_q[:, :2])
    torch.testing.assert_close(got_q[:, 2:], q[:, 2:])  # the NoPE heads
    torch.testing.assert_close(got_k[:, :1], want_k[:, :1])
    with pytest.raises(ValueError, match=r"multiple of the query heads per key head \(2\) under GQA"):
        RoPE(8, rotary_heads=3).rotate(q, k, positions, positions)


def test_a_candidate_rope_must_be_given_its_rows_and_uses_the_longrope_factor_past_the_context():
    from posenc.extension.search import Candidate

    rope = CandidateRoPE(8, factor=4.0, original=64)
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
    assert rope.row_factors is None and rope.row_n_hat is None
    q = torch.randn(1, 1, 5, 8)
    positions = torch.arange(5)[None]
    with pytest.raises(ValueError, match=r"^CandidateRoPE\.use\(candidates\) must be called before a forward pass$"):
        rope.rotate(q, q, positions, positions)
    rope.use([Candidate((1.0, 2.0, 3.0, 4.0), 0)])
    assert rope.row_factors.dtype == torch.float32 and rope.row_n_hat.dtype == torch.int64
    with pytest.raises(ValueError, match=r"^CandidateRoPE scores whole windows: queries and keys must share "
                                         r"positions$"):
        rope.rotate(q, q, positions, positions.clone())


def test_the_candidates_and_their_rope_follow_the_models_base():
    from posenc.extension.longrope import method_factors, seed_candidates

    seeds = seed_candidates(16, 4.0, 64, base=100.0)
    assert [c.factors for c in seeds] == [method_factors(m, 16, 4.0, 64, 100.0) for m in ("pi", "ntk", "yarn")]
    assert seeds[2].factors != method_factors("yarn", 16, 4.0, 64)  # YaRN's ramp moves with the base
    rope = CandidateRoPE(16, factor=4.0, original=64, base=100.0)
    assert rope.scaling["rope_theta"] == 100.0
    rope.use([seeds[2]])
    q = torch.randn(1, 1, 80, 16, dtype=torch.float64)
    positions = torch.arange(80)[None]
    exported = RoPE(16, scaling=longrope_parameters(seeds[2].factors, factor=4.0, original=64, base=100.0))
    torch.testing.assert_close(rope.rotate(q, q, positions, positions)[0],
                               exported.rotate(q, q, positions, positions)[0])  # past 64: the long factors
