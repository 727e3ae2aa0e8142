"""The fused-forward, blockwise-backward kernel for a learned score bias equals plain softmax attention.

The reference is autograd through ``softmax(scale·q·kᵀ + bias)·v`` in float64 (rows with no allowed key
give zeros), and, through ``attention()``, the eager backend with every encoding whose SDPA mask needs a
gradient on CPU: gradients of q, k, v and every parameter of the encoding.

The blockwise kernel where mutation testing found no test: grouped heads whose counts meet the lengths, the
path each problem takes (fused forward and backward, or query blocks), dtypes in and out, channel inputs
without a gradient, Transformer-XL's shifted queries, and each error message's numbers.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.kernels import blockwise, dispatch, gated_counts, offset_bias
from posenc.verify import tolerance
from posenc.kernels import band
from tests.kernels.test_channels import CASES, assert_all_close, at_dtype, outputs_and_grads, tensors
from tests.helpers import kernel_calls, make_encoding


def reference(q, k, v, bias, q_channels, k_channels, scale):
    """float64 softmax attention on q and k widened by the channels; a row with no allowed key is zeros."""
    q, k, v, bias, q_channels, k_channels = (t.double() for t in (q, k, v, bias, q_channels, k_channels))
    wide_q = torch.cat((q, q_channels.expand(*q.shape[:-1], -1)), dim=-1)
    wide_k = torch.cat((k, k_channels.expand(*k.shape[:-1], -1)), dim=-1)
    logits = scale * wide_q @ wide_k.transpose(-1, -2) + bias
    rows = torch.isfinite(logits).any(-1, keepdim=True)
    return torch.softmax(torch.where(rows, logits, 0.0), dim=-1) * rows @ v


def output_and_grads(function, upstream, *tensors):
    """function's output and the gradient of every input (zeros for an input it did not use)."""
    inputs = [t.detach().requires_grad_() for t in tensors]
    out = function(*inputs)
    grads = torch.autograd.grad(out, inputs, upstream.to(out.dtype), allow_unused=True)
    return [out, *(torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads))]


@st.composite
def problems(draw):
    batch, heads = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    causal = draw(st.booleans())
    q_len = draw(st.integers(1, 40))
    k_len = q_len if causal else draw(st.integers(1, 40))
    return dict(batch=batch, heads=heads, causal=causal, q_len=q_len, k_len=k_len,
                head_dim=draw(st.sampled_from([4, 8])), value_dim=draw(st.sampled_from([4, 6, 8])),
                bias_shape=(draw(st.sampled_from([1, batch])), draw(st.sampled_from([1, heads])), q_len, k_len),
                with_bias=draw(st.booleans()), masked=draw(st.floats(0.0, 0.6)), empty_row=draw(st.booleans()),
                channels=draw(st.sampled_from([0, 3])), channel_batches=draw(st.sampled_from([(1, 1), (batch, 1),
                                                                                             (1, batch)])),
                built_per_block=draw(st.booleans()), shifted=draw(st.booleans()),
                block=draw(st.integers(1, 48)), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=80, deadline=None)
@given(problems())
def test_equals_softmax_attention_in_float64(p):
    """Output and the gradients of q, k, v, the bias, the channels (through what builds their query side, whole
    or per block) and a per-head query shift, for any block size, broadcast bias and channels, widths and mask; the fused forward (one width,
    no channels) and the blockwise one."""
    generator = torch.Generator().manual_seed(p["seed"])
    randn = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    q = randn(p["batch"], p["heads"], p["q_len"], p["head_dim"])
    k = randn(p["batch"], p["heads"], p["k_len"], p["head_dim"])
    v = randn(p["batch"], p["heads"], p["k_len"], p["value_dim"])
    q_batch, k_batch = p["channel_batches"]
    # the query side is x @ w, handed over whole or as ChannelBlocks built per block
    x, w, k_channels = randn(q_batch, p["heads"], p["q_len"], 5), randn(5, 3), randn(k_batch, 1, p["k_len"], 3)
    shift = randn(p["heads"], p["head_dim"]) if p["shifted"] else torch.zeros(p["heads"], p["head_dim"],
                                                                               dtype=torch.float64)
    allowed = torch.rand(p["bias_shape"], generator=generator) >= p["masked"] if p["with_bias"] else \
        torch.ones(p["q_len"], p["k_len"], dtype=torch.bool)
    if p["causal"]:
        allowed = allowed & torch.ones(p["q_len"], p["k_len"], dtype=torch.bool).tril()
    if p["empty_row"] and p["with_bias"]:
        allowed[..., p["q_len"] // 2, :] = False
    bias = (randn(*p["bias_shape"]) if p["with_bias"] else torch.zeros(allowed.shape, dtype=torch.float64))
    bias = bias.masked_fill(~allowed, float("-inf"))
    if not p["channels"]:
        w, k_channels = w[:, :0], k_channels[..., :0]
    upstream = randn(p["batch"], p["heads"], p["q_len"], p["value_dim"])

    def kernel(q, k, v, bias, x, w, k_channels, shift):
        q_channels = blockwise.ChannelBlocks(lambda start, end, x, w: x[:, :, start:end] @ w, (x, w), p["q_len"], 3) \
            if p["built_per_block"] else x @ w
        return blockwise.blockwise_attention(
            q, k, v, bias if p["with_bias"] else None, scale=0.4, causal=p["causal"], block=p["block"],
            q_channels=q_channels if p["channels"] else None, k_channels=k_channels if p["channels"] else None,
            q_shift=shift if p["shifted"] else None)

    got = output_and_grads(kernel, upstream, q, k, v, bias, x, w, k_channels, shift)
    expected = output_and_grads(lambda q, k, v, b, x, w, kc, u: reference(q + u[None, :, None, :], k, v, b, x @ w, kc,
                                                                           0.4), upstream, q, k, v, bias, x, w,
                                k_channels, shift)
    if not p["shifted"]:
        expected[-1] = torch.zeros_like(shift)  # the kernel had no shift
    if not p["with_bias"]:
        expected[4] = torch.zeros_like(bias)  # the kernel had no bias (it masked causal pairs itself)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a.nan_to_num(0.0, 0.0, 0.0), b.nan_to_num(0.0, 0.0, 0.0), rtol=0, atol=1e-10)
    assert not any(t.isnan().any() for t in got[:4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_within_verify_tolerance(dtype):
    """Probabilities are recomputed in float32 in the backward, so bf16 inputs keep verify's tolerance."""
    q, k, v = (torch.randn(2, 3, 33, 8, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(1, 3, 33, 33, dtype=torch.float64).masked_fill(~torch.ones(33, 33, dtype=torch.bool).tril(), float("-inf"))
    upstream = torch.randn(2, 3, 33, 8, dtype=torch.float64)
    none = torch.zeros(1, 1, 1, 0, dtype=torch.float64)
    expected = output_and_grads(lambda *t: reference(*t, none, none, 0.35), upstream, q, k, v, bias)
    low = [t.to(dtype) for t in (q, k, v)] + [bias.float()]
    got = output_and_grads(lambda q, k, v, b: blockwise.blockwise_attention(
        q, k, v, b, scale=0.35, causal=True, block=8), upstream, *low)
    assert [t.dtype for t in got] == [dtype, dtype, dtype, dtype, torch.float32]
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=tolerance(dtype, 33) * max(1.0, float(b.detach().abs().max())))


@pytest.mark.parametrize("call, message", [
    (lambda q, b: blockwise.blockwise_attention(q, q, q, b, scale=1.0, block=0), r"block must be an integer >= 1, got 0"),
    (lambda q, b: blockwise.blockwise_attention(q, q, q, b, scale=1.0, block=-3), r"block must be an integer >= 1, got -3"),
    (lambda q, b: blockwise.blockwise_attention(q, q, q, b > 0, scale=1.0), r"bias must be a float tensor.*torch.bool"),
    (lambda q, b: blockwise.blockwise_attention(q, q, q, b[..., :3], scale=1.0), r"bias must be \(B or 1"),
    (lambda q, b: blockwise.blockwise_attention(q, q, q, b[0], scale=1.0), r"bias must be \(B or 1"),
    (lambda q, b: blockwise.blockwise_attention(q[:, :, :2], q, q, b[:, :, :2], scale=1.0, causal=True),
     r"causal needs as many queries as keys"),
    (lambda q, b: blockwise.blockwise_attention(q, q, q, scale=1.0, q_channels=q), r"go together"),
    (lambda q, b: blockwise.blockwise_attention(q, q, q, scale=1.0, q_shift=q[0, 0]), r"q_shift must be \(H, Dh\)"),
    (lambda q, b: blockwise.blockwise_attention(q, q, q, scale=1.0, q_channels=q, k_channels=q), r"go together"),
    (lambda q, b: blockwise.blockwise_attention(q, q, q, scale=1.0, q_channels=q, k_channels=q[:, :1, :, :3]),
     r"go together.*\(2, 5, 4\) and \(2, 1, 5, 3\)"),
])
def test_bad_input_is_a_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(2, 2, 5, 4), torch.zeros(1, 2, 5, 5))


# Encodings whose SDPA mask needs a gradient: learned biases and (below its channel length) Transformer-XL.
LEARNED = ["t5", "t5_interpolated", "kerple_log", "kerple_power", "fire", "transformer_xl", "cope"]


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls that reach this kernel from attention(), with the mask form forced (it would be timed
    against the kernel with the bias inside, ``test_offset_bias``)."""
    return kernel_calls(monkeypatch, blockwise, "blockwise_attention", "mask")


# calls at a model's own positions that run in an encoding's own C++ kernel where it builds: CoPE's causal ones
# (test_gated_counts), every one of FIRE's (its segments inside the offset-bias tiles, test_fire_cpu)
OWN_KERNEL_CASES = {"cope": {"causal", "kv-cache step"} if gated_counts.extension() else set(),
                    "fire": {"causal", "bidirectional", "kv-cache step"} if offset_bias.extension() else set()}


@pytest.mark.parametrize(("key", "case"), [(key, case) for key in LEARNED for case in CASES
                                           if case not in OWN_KERNEL_CASES.get(key, ())])
def test_attention_serves_learned_encodings_exactly(key, case, spy, monkeypatch):
    """sdpa (this kernel) equals eager in float64: output, q, k, v and every parameter's gradient."""
    if key == "transformer_xl":  # its channels run here too; they are timed against its lookups otherwise
        monkeypatch.setenv(dispatch.FORCE_VARIABLE, "channels")
    q_len, k_len, kwargs = CASES[case]
    enc = make_encoding(key, heads=4)
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    got = outputs_and_grads(enc, q, k, v, "sdpa", **kwargs)
    assert len(spy) == 1, "the learned-bias kernel did not serve"
    assert spy[0]["causal"] == (case == "causal"), "the causal skip serves exactly where positions are plain"
    assert_all_close(got, expected, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("key", ["t5", "fire", "transformer_xl"])
def test_attention_low_precision_within_verify_tolerance(key, dtype, spy):
    q_len, k_len, kwargs = CASES["packed documents"]
    enc = make_encoding(key, heads=4)
    q, k, v = tensors(q_len=q_len, k_len=k_len)
    expected = outputs_and_grads(enc, q, k, v, "eager", **kwargs)
    got = outputs_and_grads(*at_dtype(enc, q, k, v, dtype), "sdpa", **kwargs)
    assert spy
    assert_all_close(got, expected, atol=tolerance(dtype, 4))


def test_grouped_query_heads(spy):
    enc = make_encoding("t5", heads=4)
    q, k, v = tensors(heads=4, kv_heads=2)
    expected = outputs_and_grads(enc, q, k, v, "eager")
    got = outputs_and_grads(enc, q, k, v, "sdpa")
    assert spy
    assert_all_close(got, expected, atol=1e-10)


def test_without_a_gradient_the_fused_kernel_serves_alone(spy):
    enc = make_encoding("t5", heads=4)
    with torch.no_grad():
        posenc.attention(*tensors(), enc, backend="sdpa")
    assert not spy


def test_no_batch_sized_score_tensor_is_kept_for_the_backward():
    """Autograd keeps the (1, H, T, T) bias and B·H·T·Dh tensors, never the B·H·T² probabilities."""
    batch, heads, length = 4, 4, 64
    enc = posenc.build("t5", num_heads=heads)
    q, k, v = (torch.randn(batch, heads, length, 8, requires_grad=True) for _ in range(3))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        posenc.attention(q, k, v, enc, backend="sdpa").sum().backward()
    assert max(saved) < batch * heads * length * length
    assert enc.table.grad is not None and enc.table.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["t5", "shaw", "transformer_xl", "kerple"])
def test_a_training_step_keeps_about_what_nope_keeps(name):
    """Bytes autograd keeps for the backward, 8 sequences of 256 tokens (Transformer-XL takes its channels there
    on CPU; T5 keeps one (H, T, T) bias shared by the batch): within 5% of NoPE's, where SDPA's math path kept
    B·H·T² probabilities (T5 1.95×, Shaw 3.2× NoPE's at 512)."""
    from posenc.bench.training import saved_activation_bytes
    from posenc.lm.model import LanguageModel, ModelConfig

    tokens = torch.randint(0, 256, (8, 257))
    sizes = {}
    for encoding in ("none", name):
        torch.manual_seed(0)
        sizes[encoding] = saved_activation_bytes(LanguageModel(ModelConfig(encoding=encoding, max_positions=256)), tokens)
    assert sizes[name] <= 1.05 * sizes["none"], sizes


@pytest.mark.parametrize("causal", [True, False])
def test_a_bias_without_a_gradient_takes_the_fused_backward(causal):
    """q, k and v's gradients from the fused kernel's own backward (told the mask is causal) equal the formula."""
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 40, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    allowed = torch.ones(40, 40, dtype=torch.bool).tril() if causal else torch.rand(40, 40, generator=generator) > 0.3
    bias = torch.randn(1, 3, 40, 40, generator=generator, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    upstream = torch.randn(2, 3, 40, 8, generator=generator, dtype=torch.float64)
    none = torch.zeros(1, 1, 1, 0, dtype=torch.float64)
    got = output_and_grads(lambda q, k, v: blockwise.blockwise_attention(q, k, v, bias, scale=0.3, causal=causal),
                           upstream, q, k, v)
    expected = output_and_grads(lambda q, k, v: reference(q, k, v, bias, none, none, 0.3), upstream, q, k, v)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_a_long_causal_mask_runs_on_the_kernel_told_it_is_causal(spy):
    """Sandwich's parameter-free bias from 1,024 keys: the kernel serves with causal=True, equal to eager."""
    enc = posenc.build("sandwich", num_heads=2, sinusoid_dim=16).double()
    q, k, v = (torch.randn(1, 2, blockwise.CPU_CAUSAL_MASK_FROM_KEYS, 8, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    expected = outputs_and_grads(enc, q, k, v, "eager")
    got = outputs_and_grads(enc, q, k, v, "sdpa")
    assert len(spy) == 1 and spy[0]["causal"]
    assert_all_close(got, expected, atol=1e-10)
    spy.clear()
    short = [t[:, :, :-1].detach().requires_grad_() for t in (q, k, v)]
    outputs_and_grads(enc, *short, "sdpa")
    assert not spy  # below the length SDPA's masked path is as fast


def test_grouped_key_value_heads_are_repeated_inside():
    """k and v with fewer heads serve H/Hkv consecutive query heads each, as repeated heads would."""
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 20, 8, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 20, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    bias = torch.randn(1, 4, 20, 20, generator=generator, dtype=torch.float64)
    upstream = torch.randn(2, 4, 20, 8, generator=generator, dtype=torch.float64)
    none = torch.zeros(1, 1, 1, 0, dtype=torch.float64)
    got = output_and_grads(lambda q, k, v: blockwise.blockwise_attention(q, k, v, bias, scale=0.3, block=7),
                           upstream, q, k, v)
    expected = output_and_grads(lambda q, k, v: reference(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                          bias, none, none, 0.3), upstream, q, k, v)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


NONE = torch.zeros(1, 1, 1, 0, dtype=torch.float64)


def randn(generator, *shape):
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("q_len, k_len, causal", [(4, 4, True), (2, 5, False)],
                         ids=["keys-as-many-as-heads", "queries-as-many-as-kv-heads"])
def test_grouped_heads_where_a_length_equals_a_head_count(q_len, k_len, causal):
    """H = 4 query heads over Hkv = 2: with Tk = H, or Tq = Hkv, a check that read a length for a head count
    would skip the repeat (or repeat by the wrong count)."""
    g = torch.Generator().manual_seed(11)
    q, k, v = randn(g, 1, 4, q_len, 8), randn(g, 1, 2, k_len, 8), randn(g, 1, 2, k_len, 8)
    bias = randn(g, 1, 4, q_len, k_len)
    upstream = randn(g, 1, 4, q_len, 8)
    got = output_and_grads(lambda q, k, v, b: blockwise.blockwise_attention(q, k, v, b, scale=0.4, causal=causal,
                                                                            block=3), upstream, q, k, v, bias)
    allowed = torch.ones(q_len, k_len, dtype=torch.bool).tril() if causal else torch.ones(q_len, k_len, dtype=torch.bool)
    expected = output_and_grads(lambda q, k, v, b: reference(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), b.masked_fill(~allowed, float("-inf")), NONE, NONE,
        0.4), upstream, q, k, v, bias)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


class Paths:
    """Which of the kernel's paths ran: the fused flash forward, the query blocks, and any blockwise scores
    (built in the forward's block path and in the hand-written backward)."""

    def __init__(self, monkeypatch):
        self.fused, self.blocks, self.scores = 0, 0, 0
        fused, blocks, scores = blockwise.cpu_flash.forward, blockwise._forward_in_blocks, blockwise._Scores

        def count_fused(*args, **kwargs):
            self.fused += 1
            return fused(*args, **kwargs)

        def count_blocks(*args, **kwargs):
            self.blocks += 1
            return blocks(*args, **kwargs)

        def count_scores(*args, **kwargs):
            self.scores += 1
            return scores(*args, **kwargs)

        monkeypatch.setattr(blockwise.cpu_flash, "forward", count_fused)
        monkeypatch.setattr(blockwise, "_forward_in_blocks", count_blocks)
        monkeypatch.setattr(blockwise, "_Scores", count_scores)


@pytest.mark.parametrize("value_dim, fused", [(4, True), (6, False), (2, False), (5, False)],
                         ids=["q-and-v-one-width", "v-wider", "v-as-wide-as-heads", "v-as-wide-as-keys"])
def test_the_fused_kernel_serves_exactly_when_q_and_v_have_one_width(monkeypatch, value_dim, fused):
    """H = 2, Dh = 4, T = 5, so a width compared with a head count or a length instead takes the wrong path."""
    paths = Paths(monkeypatch)
    g = torch.Generator().manual_seed(12)
    q, k, v = randn(g, 1, 2, 5, 4), randn(g, 1, 2, 5, 4), randn(g, 1, 2, 5, value_dim)
    blockwise.blockwise_attention(q, k, v, randn(g, 1, 2, 5, 5), scale=0.5, causal=True)
    assert (paths.fused, paths.blocks) == ((1, 0) if fused else (0, 1))


def test_a_bias_without_a_gradient_builds_no_blockwise_scores_in_the_backward(monkeypatch):
    paths = Paths(monkeypatch)
    g = torch.Generator().manual_seed(13)
    q, k, v = (randn(g, 1, 2, 6, 4).requires_grad_() for _ in range(3))
    blockwise.blockwise_attention(q, k, v, randn(g, 1, 2, 6, 6), scale=0.5, causal=True).sum().backward()
    assert (paths.fused, paths.scores) == (1, 0)
    bias = randn(g, 1, 2, 6, 6).requires_grad_()
    blockwise.blockwise_attention(q, k, v, bias, scale=0.5, causal=True).sum().backward()
    assert (paths.fused, paths.scores) == (2, 1)  # the bias's gradient needs the hand-written backward


@pytest.mark.parametrize("value_dim", [8, 6], ids=["fused", "blocks"])
def test_bfloat16_comes_back_in_bfloat16_from_either_path(value_dim):
    q, k = (torch.randn(1, 2, 9, 8, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(1, 2, 9, value_dim, dtype=torch.bfloat16)
    out = blockwise.blockwise_attention(q, k, v, torch.zeros(1, 2, 9, 9), scale=0.3, causal=True)
    assert out.dtype == torch.bfloat16


def test_a_float64_bias_on_float32_inputs_is_cast_to_their_compute_dtype():
    g = torch.Generator().manual_seed(14)
    q, k, v = (randn(g, 1, 2, 7, 4).float().requires_grad_() for _ in range(3))
    bias = randn(g, 1, 2, 7, 7)
    got, want = (output_and_grads(lambda q, k, v: blockwise.blockwise_attention(q, k, v, b, scale=0.5, causal=True),
                                  torch.ones(1, 2, 7, 4), q, k, v) for b in (bias, bias.float()))
    for a, b in zip(got, want, strict=True):  # forward and the fused backward
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_channel_inputs_without_a_gradient_get_none_and_the_others_theirs():
    """ChannelBlocks built from two inputs, one trained and one fixed: the trained one's gradient equals autograd
    through the full channels, the fixed one gets none."""
    g = torch.Generator().manual_seed(15)
    q, k, v = randn(g, 1, 2, 6, 4), randn(g, 1, 2, 6, 4), randn(g, 1, 2, 6, 5)
    weight, fixed = randn(g, 2, 3).requires_grad_(), randn(g, 6, 3)
    k_channels = randn(g, 1, 1, 6, 3)

    def build(start, end, weight, fixed):  # (1, H, end − start, 3)
        return (weight[:, None, :] * fixed[None, start:end, :])[None]

    lazy = blockwise.ChannelBlocks(build, (weight, fixed), length=6, width=3)
    out = blockwise.blockwise_attention(q, k, v, scale=0.5, causal=True, q_channels=lazy, k_channels=k_channels, block=4)
    (got,) = torch.autograd.grad(out.sum(), weight)
    causal = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    want_out = reference(q, k, v, causal, build(0, 6, weight, fixed), k_channels, 0.5)
    (want,) = torch.autograd.grad(want_out.sum(), weight)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-10)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert lazy.full().shape == (1, 2, 6, 3)
    torch.testing.assert_close(lazy.full(), build(0, 6, weight, fixed), rtol=0, atol=0)


def test_shifted_queries_add_one_vector_per_head():
    g = torch.Generator().manual_seed(16)
    q, shift = randn(g, 2, 3, 4, 5), randn(g, 3, 5)
    full = blockwise.ShiftedQueries(q, shift).full()
    for h in range(3):
        torch.testing.assert_close(full[:, h], q[:, h] + shift[h], rtol=0, atol=0)


@pytest.mark.parametrize("call, message", [
    (lambda q: blockwise.blockwise_attention(q, q, q, torch.zeros(1, 2, 5, 4), scale=1.0),
     r"bias must be \(B or 1, H or 1, Tq, Tk\) = \(2, 2, 5, 5\), got \(1, 2, 5, 4\)"),
    (lambda q: blockwise.blockwise_attention(q, q, q, scale=1.0, q_shift=torch.zeros(3, 4)),
     r"q_shift must be \(H, Dh\) = \(2, 4\), got \(3, 4\)"),
    (lambda q: blockwise.blockwise_attention(q[:, :, :2], q, q, scale=1.0, causal=True),
     r"causal needs as many queries as keys, got Tq=2 and Tk=5"),
    (lambda q: blockwise.blockwise_attention(q, q, q, scale=1.0, q_channels=q),
     r"^q_channels and k_channels go together, shaped \(B or 1, H, Tq, C\) and \(B or 1, 1, Tk, C\): got"),
])
def test_error_messages_carry_the_expected_shapes(call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(2, 2, 5, 4))


def test_the_band_kernel_without_a_floor_adds_zeros():
    g = torch.Generator().manual_seed(17)
    q, k, v = randn(g, 1, 2, 7, 4), randn(g, 1, 2, 7, 4), randn(g, 1, 2, 7, 6)
    key_band, value_band = randn(g, 3, 4), randn(g, 3, 6)
    got = band.band_attention(q, k, v, key_band, value_band, scale=0.5, block=3)
    want = band.band_attention(q, k, v, key_band, value_band, torch.zeros(6, dtype=torch.float64), scale=0.5, block=3)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
