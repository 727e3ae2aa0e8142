"""The CUDA paths against float64 CPU references: the Triton RoPE kernel, every attention backend forward and
backward (FlexAttention compiled, with its backward), the tiny LM's loss and gradients, and ``posenc pretrained``.

Skipped without a GPU (CI has none); `benchmarks/scripts/gpu.sh` runs this file on a lent one.
"""

import contextlib
import copy

import pytest
import torch

from posenc import attention
from posenc.attention import serves
from posenc.encodings import build_for_model
from posenc.encodings.registry import one_axis
from posenc.kernels import dispatch, rope_cos_sin, rotate_pairs
from posenc.lm.model import LanguageModel, ModelConfig
from tests.helpers import mask_per_head

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
ATTENTION_ENCODINGS = one_axis(in_attention=True, from_positions=True)
SIZES = {"head_dim": 32, "num_heads": 4}
NARROWER = {"sandwich": {"sinusoid_dim": 32}}
FLOAT32 = 2e-4  # relative to the reference's largest magnitude: float32 sums over a few hundred keys
# CoPE interpolates its table at floor(p) of a sum of gates: where a sum lies within float32's rounding of an
# integer, float32 reads the other pair of rows (1.8e-3 measured on the CPU in float32 too)
LOOSER = {"cope": 1e-2}


@pytest.fixture(autouse=True)
def exact_float32(monkeypatch):
    """No TF32 in float32 products, so float32 on the GPU is float32; FlexAttention compiled, as users run it
    (conftest turns compiling off for the CPU suite)."""
    monkeypatch.setenv("POSENC_FLEX_COMPILE", "1")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with torch._dynamo.config.patch(recompile_limit=64):
        yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _relative_error(got: torch.Tensor, expected: torch.Tensor, floor: float = 1e-12) -> float:
    """Largest |got − expected| over the larger of expected's largest magnitude and ``floor``."""
    assert torch.isfinite(got).all()
    expected = expected.detach()
    return float((got.detach().double().cpu() - expected).abs().max() / expected.abs().max().clamp_min(floor))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_triton_rope_equals_the_float64_rotation_at_far_positions(layout, dtype, tolerance):
    """The encoding's CUDA path (one Triton launch for q and k) at positions near 2^20, values and gradients."""
    torch.manual_seed(0)
    rope = build_for_model("rope", sizes={"head_dim": 64, "num_heads": 8}, layout=layout)
    q_pos = torch.arange(2**20 - 300, 2**20)[None]
    k_pos = torch.arange(2**20 - 500, 2**20)[None]  # a KV cache longer than the queries
    q = torch.randn(2, 8, 300, 64).to(dtype)
    k = torch.randn(2, 8, 500, 64).to(dtype)
    q_gpu, k_gpu = (t.to(CUDA).requires_grad_() for t in (q, k))
    got = rope.to(CUDA).rotate(q_gpu, k_gpu, q_pos.to(CUDA), k_pos.to(CUDA))
    inv_freq, factor = rope.frequencies()
    expected_tables = [rope_cos_sin(p, inv_freq.double(), factor, torch.float64) for p in (q_pos, k_pos)]
    q64, k64 = (t.double().requires_grad_() for t in (q, k))
    expected = [rotate_pairs(x, *tables, layout) for x, tables in zip((q64, k64), expected_tables)]
    upstream = [torch.randn_like(e) for e in expected]
    got_grads = torch.autograd.grad(got, (q_gpu, k_gpu), [u.to(CUDA, dtype) for u in upstream])
    expected_grads = torch.autograd.grad(expected, (q64, k64), upstream)
    for a, b in zip((*got, *got_grads), (*expected, *expected_grads)):
        assert a.dtype == dtype and a.shape == b.shape
        assert _relative_error(a, b) < tolerance


def _encoding(name: str) -> torch.nn.Module:
    torch.manual_seed(1)
    encoding = build_for_model(name, sizes=SIZES, **NARROWER.get(name, {}))
    with torch.no_grad():  # learned parameters away from their initial values, so a wrong gradient shows
        for parameter in encoding.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return encoding


@pytest.mark.parametrize("name", ["alibi", "fire"])
def test_compiled_flex_masks_each_head_with_its_own_mask(name):
    """A mask per head whose first head keeps every pair, 300 tokens (three of Flex's 128-token blocks): compiled
    FlexAttention skips a block its block mask calls full, so a block mask built for one head and shared by all
    would let the other heads read keys their masks drop. Eager on the CPU in float64 is the reference."""
    encoding = _encoding(name)
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, 300, 32, generator=generator) for _ in range(3))
    mask = mask_per_head(4, 300)
    expected = attention(*(t.double() for t in (q, k, v)), copy.deepcopy(encoding).double(), causal=False,
                         mask=mask, backend="eager")
    with torch.no_grad():
        got = attention(q.to(CUDA), k.to(CUDA), v.to(CUDA), encoding.to(CUDA), causal=False, mask=mask.to(CUDA),
                        backend="flex")
    assert _relative_error(got, expected, floor=1.0) < FLOAT32


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ATTENTION_ENCODINGS)
def test_every_cuda_backend_equals_float64_eager_values_and_gradients(name, causal):
    """Each backend that serves the encoding on CUDA (eager, sdpa, flex compiled) against eager in float64 on the
    CPU: outputs, and the gradients of q, k, v and every learned parameter. 300 queries: not a multiple of any
    kernel's tile."""
    encoding = _encoding(name)
    if causal is False and encoding.causal_only:
        pytest.skip(f"{name} is causal only")
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 4, 300, 32) for _ in range(3))
    upstream = torch.randn(2, 4, 300, 32, dtype=torch.float64)
    reference = copy.deepcopy(encoding).double()
    inputs64 = [t.double().requires_grad_() for t in (q, k, v)]
    expected_out = attention(*inputs64, reference, causal=causal, backend="eager")
    expected = [expected_out, *torch.autograd.grad(expected_out, [*inputs64, *reference.parameters()], upstream)]
    on_gpu = copy.deepcopy(encoding).to(CUDA)
    inputs = [t.to(CUDA).requires_grad_() for t in (q, k, v)]
    served = [b for b in ("eager", "sdpa", "flex") if serves(b, on_gpu, *inputs)]
    assert "eager" in served
    # sdpa once under each form it may time on a GPU (a form that does not serve leaves the choice to the timing)
    runs = [(b, form) for b in served for form in (("tiles", "channels", "mask", "flex") if b == "sdpa" else (None,))]
    for backend, form in runs:
        with dispatch.force(form) if form else contextlib.nullcontext():
            out = attention(*inputs, on_gpu, causal=causal, backend=backend)
        grads = torch.autograd.grad(out, [*inputs, *on_gpu.parameters()], upstream.to(CUDA, out.dtype))
        for what, got, want in zip(("output", "dq", "dk", "dv", *(n for n, _ in on_gpu.named_parameters())),
                                   (out, *grads), expected):
            # floor 1: a gradient that is zero in exact arithmetic (FIRE's last bias shifts whole rows) is held
            # to float32's absolute rounding instead
            assert _relative_error(got, want, floor=1.0) < LOOSER.get(name, FLOAT32), f"{backend} {form}: {what}"


def test_forms_are_timed_on_the_gpu_and_remembered_under_its_name():
    """A learned bias with a gradient: sdpa times the mask and FlexAttention on the GPU and keeps the faster, under
    a key that names the GPU."""
    encoding = _encoding("t5").to(CUDA)
    q, k, v = (torch.randn(2, 4, 1024, 32, device=CUDA, requires_grad=True) for _ in range(3))
    attention(q, k, v, encoding, backend="sdpa").sum().backward()
    key = dispatch.shape_key("T5RelativeBias", q, k, v, causal=True, needs_grad=True)
    form = dispatch.chosen()[key]  # other tests in this process leave T5's choices for other shapes beside it
    assert key.startswith(torch.cuda.get_device_name()) and " train " in key and form in ("flex", "mask")
    entry = dispatch.storage.read_json(dispatch.cache_path())[key]
    assert set(entry["ms"]) == {"flex", "mask"} and entry["form"] == min(entry["ms"], key=entry["ms"].get)


@pytest.mark.parametrize("name", one_axis())
def test_language_model_loss_and_gradients_on_cuda_equal_the_cpu(name):
    """The tiny LM's training loss and every parameter's gradient on CUDA (auto backend) equal the same model's on
    the CPU in float64."""
    torch.manual_seed(3)
    model = LanguageModel(ModelConfig(encoding=name, dim=64, num_layers=2, num_heads=2, max_positions=160))
    tokens = torch.randint(0, 256, (2, 161))

    def loss_and_grads(m, device, dtype):
        m = copy.deepcopy(m).to(device=device, dtype=dtype)
        ids = tokens.to(device)
        logits = m(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        return loss, torch.autograd.grad(loss, list(m.parameters()))

    loss64, grads64 = loss_and_grads(model, "cpu", torch.float64)
    loss, grads = loss_and_grads(model, CUDA, torch.float32)
    assert abs(loss.item() - loss64.item()) < 1e-4
    # every parameter's gradient in one vector: relative to the model's largest gradient
    assert _relative_error(torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in grads64])) < 1e-3


def test_extend_hf_on_cuda_gives_the_cpus_numbers(tmp_path):
    """``posenc pretrained`` on the smoke preset's tiny Llama, zero-shot rows through both attention registries
    (Self-Extend, STRING, DCA) and the context control: every document's loss and every planted key's
    log-probability on CUDA equal the CPU's (float32 both; argmax answers of a random model can flip on a tie, so
    they are not compared)."""
    from posenc.experiments.pretrained import PretrainedConfig, run

    config = PretrainedConfig.from_preset("smoke", methods=("none", "yarn", "self-extend", "string", "dca"),
                                          finetune="none", retrieval_format="made-up-twice")
    on = {device: run(config, tmp_path / device, device=device, log=lambda *_: None) for device in ("cpu", "cuda")}
    assert on["cuda"]["device"] == torch.cuda.get_device_name()
    rows = on["cpu"]["rows"]
    assert set(on["cuda"]["rows"]) == set(rows) == {"none", "yarn", "self-extend", "string", "dca"}
    for name, row in rows.items():
        for cpu, cuda in zip(row["test"], on["cuda"]["rows"][name]["test"], strict=True):
            for part in ("first", "inside", "past"):
                assert cuda[part] == pytest.approx(cpu[part], abs=1e-4), (name, part)
            cpu_keys = [key["log_prob"] for key in cpu["retrieval"]]
            assert [key["log_prob"] for key in cuda["retrieval"]] == pytest.approx(cpu_keys, abs=1e-3), name
    past = {device: [document["past"] for document in on[device]["control"]["test"]] for device in on}
    assert past["cuda"] == pytest.approx(past["cpu"], abs=1e-4)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-5), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("causal", [True, False])
def test_the_triton_tiles_at_the_gpus_tile_sizes_equal_float64(dtype, tolerance, causal):
    """``tiles_triton`` at its GPU tiles (``tiles_triton._blocks``: bf16 128 × 64 forward and 64 × 64 backward,
    64 × 64 at explicit positions; float32 64 × 32 and 32 × 32) over 1,000 queries of a 1,100-key
    cache: an offset table (its gradient by diagonal sums), FoX's token values (causal), grouped-query heads and
    explicit positions, values and gradients against float64 on the CPU."""
    from posenc.kernels.tiles_triton import tiled_attention

    torch.manual_seed(4)
    q, k, v = torch.randn(2, 4, 1000, 64), torch.randn(2, 2, 1100, 64), torch.randn(2, 2, 1100, 64)
    lowest = 0 if causal else -1099
    table = torch.randn(4, 1100 - lowest)
    tokens = (torch.randn(1, 4, 1100) - 1).cumsum(-1) if causal else None
    shuffled = torch.randperm(1200)
    explicit = {"q_pos": shuffled[:1000][None], "k_pos": shuffled[100:1200][None]}
    span = int(explicit["q_pos"].max() - explicit["k_pos"].min()), int(explicit["q_pos"].min() - explicit["k_pos"].max())
    explicit_low = max(span[1], 0) if causal else span[1]
    explicit_table = torch.randn(4, span[0] - explicit_low + 1)
    for table_, low, tokens_, positions in ((table, lowest, tokens, {}), (explicit_table, explicit_low, None, explicit)):
        inputs = [x for x in (q, k, v, table_, tokens_) if x is not None]
        exact = [(x.to(dtype) if i < 3 else x).double().requires_grad_() for i, x in enumerate(inputs)]
        fast = [(x.to(CUDA, dtype) if i < 3 else x.to(CUDA)).requires_grad_() for i, x in enumerate(inputs)]
        expected = _tiles_reference(*exact[:4], low, exact[4] if tokens_ is not None else None, causal,
                                    **positions)
        got = tiled_attention(*fast[:3], scale=0.125, causal=causal, table=fast[3], lowest=low,
                              token_values=fast[4] if tokens_ is not None else None,
                              **{name: p.to(CUDA) for name, p in positions.items()})
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact, upstream)
        grads = torch.autograd.grad(got, fast, upstream.to(CUDA, dtype))
        for what, a, b in zip(("out", "dq", "dk", "dv", "table", "tokens"), (got, *grads), (expected, *wanted)):
            assert _relative_error(a, b) < tolerance, (what, positions != {})


@pytest.mark.parametrize("name, kwargs", [("alibi", {}), ("alibi", {"symmetric": True}), ("kerple", {}),
                                          ("kerple", {"variant": "power"}), ("t5", {"bidirectional": True}),
                                          ("sandwich", {}), ("fire", {"width": 8, "init_threshold": 300.0}),
                                          ("fire", {"width": 33, "init_threshold": 300.0})])
def test_the_triton_tiles_form_equals_float64_eager_at_long_context(name, kwargs):
    """``forms._tiles_form`` in float32 at 1,500 tokens (T5's last buckets then fill whole tiles; ALiBi, Kerple and
    FIRE, past its threshold from 300, run as formulas; FIRE's width 33 reads 64 segment keys): the output and the
    gradients of q, k, v and every parameter against float64 eager on the CPU, causal and (but for nothing)
    bidirectional."""
    import posenc
    from posenc.kernels import forms

    torch.manual_seed(5)
    encoding = posenc.build(name, num_heads=2, **kwargs)
    with torch.no_grad():
        for parameter in encoding.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    positions = torch.arange(1500)[None]
    q, k, v = (torch.randn(1, 2, 1500, 32) for _ in range(3))
    for causal in (True, False):
        reference = copy.deepcopy(encoding).double()
        exact = [x.double().requires_grad_() for x in (q, k, v)]
        expected = attention(*exact, reference, causal=causal, backend="eager")
        on_gpu = copy.deepcopy(encoding).to(CUDA)
        fast = [x.to(CUDA).requires_grad_() for x in (q, k, v)]
        at = on_gpu.at(positions.to(CUDA), positions.to(CUDA), contiguous=True)
        assert forms.tiles_serve(fast[0], at, causal)
        got = forms._tiles_form(*fast, at, causal, None, 32 ** -0.5, causal)
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact + list(reference.parameters()), upstream)
        grads = torch.autograd.grad(got, fast + list(on_gpu.parameters()), upstream.to(CUDA, torch.float32))
        for what, a, b in zip(("out", "dq", "dk", "dv", *(n for n, _ in on_gpu.named_parameters())), (got, *grads),
                              (expected, *wanted)):
            assert _relative_error(a, b, floor=1.0) < 1e-4, (name, kwargs, causal, what)


def _tiles_reference(q, k, v, table, lowest, tokens, causal, q_pos=None, k_pos=None):
    """float64 softmax(q·kᵀ/8 + table[h, offset − lowest] + c_i − c_j)·v on the CPU."""
    heads, q_len, k_len = q.shape[1], q.shape[2], k.shape[2]
    k, v = (x.repeat_interleave(heads // x.shape[1], 1) for x in (k, v))
    if q_pos is None:
        q_pos, k_pos = torch.arange(k_len - q_len, k_len)[None], torch.arange(k_len)[None]
    offset = (q_pos[:, :, None] - k_pos[:, None, :])[:, None]
    entry = (offset - lowest).clamp(0, table.shape[1] - 1)
    logits = (q @ k.transpose(-1, -2)) * 0.125 + table[torch.arange(heads)[None, :, None, None], entry]
    if tokens is not None:
        logits = logits + (tokens[..., k_len - q_len:, None] - tokens[..., None, :])
    if causal:
        logits = logits.masked_fill(offset < 0, float("-inf"))
    return torch.softmax(logits, -1).nan_to_num(0.0) @ v


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("partial_rotary_factor", [1.0, 0.5])
def test_in_place_triton_rope_on_qkv_views_equals_the_float64_rotation(layout, dtype, tolerance,
                                                                       partial_rotary_factor):
    """The model's CUDA path: q and k, views of one qkv projection, rotated inside it (one in-place Triton launch)
    at positions near 2^20; values, gradients, and the v slice untouched, against float64 on the CPU."""
    from posenc.encodings.rotary import RoPE

    torch.manual_seed(0)
    rope = RoPE(64, layout=layout, scaling={"partial_rotary_factor": partial_rotary_factor})
    positions = torch.arange(2**20 - 300, 2**20)[None]
    x = torch.randn(2, 300, 3, 8, 64).to(dtype)  # (B, T, 3, H, Dh), as the projection's output
    leaf = x.to(CUDA).requires_grad_()
    qkv = leaf.clone().permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh); not a leaf, so it may be rotated in place
    q, k = qkv[0], qkv[1]
    pointers = q.data_ptr(), k.data_ptr()
    got = rope.to(CUDA).rotate_positioned(rope.at(positions.to(CUDA), positions.to(CUDA)), q, k, in_place=True)
    assert (got[0].data_ptr(), got[1].data_ptr()) == pointers  # rotated where they lie
    assert torch.equal(qkv[2].cpu(), x.permute(2, 0, 3, 1, 4)[2])
    inv_freq, factor = rope.frequencies()
    tables = rope_cos_sin(positions, inv_freq.double(), factor, torch.float64)
    x64 = x.double().requires_grad_()
    qkv64 = x64.permute(2, 0, 3, 1, 4)
    expected = [rotate_pairs(qkv64[i], *tables, layout) for i in (0, 1)]
    upstream = [torch.randn_like(e) for e in expected]
    (got_grad,) = torch.autograd.grad(got, leaf, [u.to(CUDA, dtype) for u in upstream])
    (expected_grad,) = torch.autograd.grad(expected, x64, upstream)
    for a, b in zip((*got, got_grad), (*expected, expected_grad)):
        assert a.dtype == dtype and a.shape == b.shape
        assert _relative_error(a, b) < tolerance


@pytest.mark.parametrize("name", ["cope", "stick-breaking", "fire", "shaw"])
def test_dense_paths_by_query_blocks_on_cuda_equal_float64(monkeypatch, name):
    """Past the logits budget a GPU forms dense attention one block of queries at a time (``kernels.query_blocks``,
    forced here at 600 queries in blocks of 128): values and the gradients of q, k, v and every parameter against
    float64 eager on the CPU."""
    from posenc.kernels import query_blocks

    encoding = _encoding(name)
    torch.manual_seed(6)
    q, k, v = (torch.randn(1, 4, 600, 32) for _ in range(3))
    reference = copy.deepcopy(encoding).double()
    exact = [x.double().requires_grad_() for x in (q, k, v)]
    expected = attention(*exact, reference, backend="eager")
    upstream = torch.randn_like(expected)
    wanted = torch.autograd.grad(expected, exact + list(reference.parameters()), upstream)
    monkeypatch.setattr(query_blocks, "GPU_DENSE_ELEMENTS", 4 * 600 * 128)
    on_gpu = copy.deepcopy(encoding).to(CUDA)
    fast = [x.to(CUDA).requires_grad_() for x in (q, k, v)]
    assert query_blocks.needed(fast[0], fast[1]) and query_blocks.rows_per_block(fast[0], fast[1]) == 128
    got = attention(*fast, on_gpu, backend="eager")
    grads = torch.autograd.grad(got, fast + list(on_gpu.parameters()), upstream.to(CUDA, torch.float32))
    for what, a, b in zip(("out", "dq", "dk", "dv", *(n for n, _ in on_gpu.named_parameters())), (got, *grads),
                          (expected, *wanted)):
        assert _relative_error(a, b, floor=1.0) < LOOSER.get(name, FLOAT32), (name, what)


@pytest.mark.parametrize("dtype, width, value_width, tolerance", [
    (torch.bfloat16, 8, 8, 5e-2), (torch.bfloat16, 256, 256, 5e-2), (torch.float32, 128, 128, 2e-5),
    (torch.bfloat16, 64, 512, 5e-2)])
def test_the_bias_tiles_and_stick_breaking_at_their_narrowest_and_widest_heads_equal_float64(dtype, width,
                                                                                           value_width, tolerance):
    """Head width 8 (held in blocks of 16, the narrowest a GPU's ``tl.dot`` takes), 256 in bf16 and 128 in float32
    (stick-breaking's 32 × 32 tiles there; its 64 × 64 did not fit at 256), and heads of 64 with values of 512 (by
    blocks of 256 columns, whose tiles fit): ALiBi in the bias tiles and stick-breaking over 300 queries of a
    400-key cache, grouped-query heads; values and the gradients of q, k and v against float64 eager on the CPU."""
    import posenc
    from posenc.kernels import forms, sticks_triton

    torch.manual_seed(5)
    q, k, v = torch.randn(2, 4, 300, width), torch.randn(2, 2, 400, width), torch.randn(2, 2, 400, value_width)
    q_pos, k_pos = torch.arange(100, 400), torch.arange(400)
    scale = width ** -0.5
    alibi, sticks = posenc.build("alibi", num_heads=4), posenc.build("stick-breaking", attend_current=True)
    at = copy.deepcopy(alibi).to(CUDA).at(q_pos[None].to(CUDA), k_pos[None].to(CUDA), contiguous=True)
    runs = {"alibi": lambda *x: forms._tiles_form(*x, at, True, None, scale, True),
            "stick-breaking": lambda *x: sticks_triton.stick_breaking_attention(*x, scale=scale, attend_current=True)}
    for name, encoding in (("alibi", alibi), ("stick-breaking", sticks)):
        exact = [x.to(dtype).double().requires_grad_() for x in (q, k, v)]
        expected = attention(*exact, encoding, backend="eager", scale=scale, q_positions=q_pos, k_positions=k_pos)
        upstream = torch.randn_like(expected)
        wanted = torch.autograd.grad(expected, exact, upstream)
        fast = [x.to(CUDA, dtype).requires_grad_() for x in (q, k, v)]
        got = runs[name](*fast)
        grads = torch.autograd.grad(got, fast, upstream.to(CUDA, dtype))
        for what, a, b in zip(("out", "dq", "dk", "dv"), (got, *grads), (expected, *wanted)):
            assert _relative_error(a, b) < tolerance, (name, what, dtype, width)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-5), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("attend_current", [False, True])
def test_stick_breaking_in_triton_tiles_at_the_gpus_tile_sizes_equals_float64(monkeypatch, dtype, tolerance,
                                                                             attend_current):
    """``sticks_triton`` at its GPU tiles (64 × 64) over 1,000 queries of a 1,100-key cache, grouped-query heads:
    values and the gradients of q, k and v against float64 stick-breaking on the CPU; then through
    ``attention(backend="auto")`` with the kernel offered (POSENC_STICKS_TRITON=1)."""
    import posenc
    from posenc.kernels import sticks_triton

    kernel_calls = []
    kernel = sticks_triton.stick_breaking_attention
    monkeypatch.setattr(sticks_triton, "stick_breaking_attention",
                        lambda *a, **kw: kernel_calls.append(1) or kernel(*a, **kw))
    torch.manual_seed(7)
    q, k, v = torch.randn(2, 4, 1000, 64), torch.randn(2, 2, 1100, 64), torch.randn(2, 2, 1100, 64)
    encoding = posenc.build("stick-breaking", attend_current=attend_current)
    exact = [x.to(dtype).double().requires_grad_() for x in (q, k, v)]
    positions = {"q_positions": torch.arange(100, 1100), "k_positions": torch.arange(1100)}
    expected = attention(*exact, encoding, backend="eager", scale=0.125, **positions)
    upstream = torch.randn_like(expected)
    wanted = torch.autograd.grad(expected, exact, upstream)
    monkeypatch.setenv("POSENC_STICKS_TRITON", "1")
    for run in (lambda *x: kernel(*x, scale=0.125, attend_current=attend_current),
                lambda *x: attention(*x, encoding, backend="auto", scale=0.125)):
        fast = [x.to(CUDA, dtype).requires_grad_() for x in (q, k, v)]
        got = run(*fast)
        grads = torch.autograd.grad(got, fast, upstream.to(CUDA, dtype))
        for what, a, b in zip(("out", "dq", "dk", "dv"), (got, *grads), (expected, *wanted)):
            assert _relative_error(a, b) < tolerance, (what, dtype, attend_current)
    assert kernel_calls == [1]  # attention(backend="auto") ran the Triton tiles, not eager's dense sums


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-5), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("name, kwargs", [("transformer_xl", {}), ("shaw", {"max_distance": 100})])
def test_lookups_in_triton_tiles_at_the_gpus_tile_sizes_equal_float64(monkeypatch, dtype, tolerance, name, kwargs):
    """``lookups_triton`` (64 × 64 tiles in bf16, 32 × 32 in float32) through ``attention(backend="auto")`` with the kernel offered
    (POSENC_LOOKUPS_TRITON=1): Transformer-XL over 1,000 queries of a 1,100-key cache (its lookups form, forced), and
    Shaw over 1,100 tokens with a band of 100 offsets (its band form); values and the gradients of q, k, v and every
    parameter of the encoding against float64 eager on the CPU."""
    import posenc
    from posenc.kernels import dispatch, lookups_triton

    kernel_calls = []
    kernel = lookups_triton.lookup_attention
    monkeypatch.setattr(lookups_triton, "lookup_attention", lambda *a, **kw: kernel_calls.append(1) or kernel(*a, **kw))
    torch.manual_seed(8)
    q_len = 1000 if name == "transformer_xl" else 1100
    q, k, v = torch.randn(2, 4, q_len, 64), torch.randn(2, 4, 1100, 64), torch.randn(2, 4, 1100, 64)
    encoding = posenc.build(name, head_dim=64, num_heads=4, **kwargs)
    with torch.no_grad():
        for parameter in encoding.parameters():  # Transformer-XL's biases start at zero: give their gradients a path
            parameter.normal_(0.0, 0.05)
    reference = copy.deepcopy(encoding).double()
    exact = [x.to(dtype).double().requires_grad_() for x in (q, k, v)]
    positions = {"q_positions": torch.arange(1100 - q_len, 1100), "k_positions": torch.arange(1100)}
    expected = attention(*exact, reference, backend="eager", scale=0.125, **positions)
    upstream = torch.randn_like(expected)
    wanted = torch.autograd.grad(expected, exact + list(reference.parameters()), upstream)
    monkeypatch.setenv("POSENC_LOOKUPS_TRITON", "1")
    on_gpu = copy.deepcopy(encoding).to(CUDA)
    fast = [x.to(CUDA, dtype).requires_grad_() for x in (q, k, v)]
    with dispatch.force("lookups"):
        got = attention(*fast, on_gpu, backend="auto", scale=0.125)
    grads = torch.autograd.grad(got, fast + list(on_gpu.parameters()), upstream.to(CUDA, dtype))
    names = ("out", "dq", "dk", "dv", *(n for n, _ in on_gpu.named_parameters()))
    for what, a, b in zip(names, (got, *grads), (expected, *wanted)):
        assert _relative_error(a, b) < tolerance, (name, what, dtype)
    assert kernel_calls == [1]  # attention(backend="auto") ran the Triton tiles


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-5), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("rows", [16, 64, 1100])
def test_cope_in_triton_tiles_at_the_gpus_tile_sizes_equals_float64(monkeypatch, dtype, tolerance, rows):
    """``counts_triton`` (32 × 32 tiles, windows of 32 table rows) over 1,000 queries of a 1,100-key cache, through
    ``attention(backend="auto")`` with the kernel offered (POSENC_COUNTS_TRITON=1): values and the gradients of q,
    k, v and the embeddings against float64 eager on the CPU; 16 rows fill every count within a tile or two, 1,100
    (one per key, as the tiny LM builds CoPE) never fill."""
    import posenc
    from posenc.kernels import counts_triton

    kernel_calls = []
    kernel = counts_triton.counts_attention
    monkeypatch.setattr(counts_triton, "counts_attention", lambda *a, **kw: kernel_calls.append(1) or kernel(*a, **kw))
    torch.manual_seed(9)
    q, k, v = torch.randn(2, 4, 1000, 64), torch.randn(2, 4, 1100, 64), torch.randn(2, 4, 1100, 64)
    encoding = posenc.build("cope", head_dim=64, max_positions=rows)
    with torch.no_grad():
        encoding.embeddings.normal_()  # they start at zero
    reference = copy.deepcopy(encoding).double()
    exact = [x.to(dtype).double().requires_grad_() for x in (q, k, v)]
    positions = {"q_positions": torch.arange(100, 1100), "k_positions": torch.arange(1100)}
    expected = attention(*exact, reference, backend="eager", scale=0.125, **positions)
    upstream = torch.randn_like(expected)
    wanted = torch.autograd.grad(expected, exact + [reference.embeddings], upstream)
    monkeypatch.setenv("POSENC_COUNTS_TRITON", "1")
    on_gpu = copy.deepcopy(encoding).to(CUDA)
    fast = [x.to(CUDA, dtype).requires_grad_() for x in (q, k, v)]
    got = attention(*fast, on_gpu, backend="auto", scale=0.125)
    grads = torch.autograd.grad(got, fast + [on_gpu.embeddings], upstream.to(CUDA, dtype))
    for what, a, b in zip(("out", "dq", "dk", "dv", "embeddings"), (got, *grads), (expected, *wanted)):
        assert _relative_error(a, b) < (0.15 if (what, dtype) == ("embeddings", torch.bfloat16) else tolerance), (
            what, dtype, rows)
    assert kernel_calls == [1]  # the one form offered: attention(backend="auto") ran the Triton tiles
