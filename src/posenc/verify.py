"""``posenc verify``: the seeds' checkable claims, measured on this device and dtype.

Each check returns rows (check, encoding, measured error, tolerance, passed). A
"differs" check passes when the error is *above* its threshold (e.g. an encoding
must break permutation equivariance). Tolerances scale with dtype and with the
largest position used:

    tolerance = base(dtype) · (1 + log2(1 + max_position) / 20)
    base: float64 1e-10, float32 1e-4, bfloat16 5e-2

Oracles here are written from the formulas, independently of the code they check.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import torch

from . import attention, rope_frequencies, sinusoidal_table
from .attention import serves
from .encodings import build_for_model
from .encodings import RoPE, Sinusoidal
from .encodings.registry import ENTRIES, baseline, having, name_of, one_axis, symmetric
from .encodings.rotary import apply_rope
from .kernels.channels import attend_with_channels

BASE_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 5e-2}
HEADS, HEAD_DIM, LENGTH = 4, 16, 12
DIFFERS = 1e-3  # a positional encoding must move outputs by more than this

# the sizes of the checks' heads, for whichever of them an encoding's constructor takes; 32 sinusoids (Sandwich's
# default 128 is sized for model-wide heads)
SIZES = {"head_dim": HEAD_DIM, "num_heads": HEADS, "sinusoid_dim": 32}


def attention_encodings() -> tuple[str, ...]:
    """What ``attention()`` takes from positions alone, read from the registry when a check runs."""
    return one_axis(in_attention=True, from_positions=True)


@dataclass
class Check:
    check: str
    encoding: str
    error: float
    tolerance: float | None  # None: reported for information, not judged
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def tolerance_rule() -> str:
    return ("Tolerance = base(dtype) * (1 + log2(1 + largest position) / 20), base: float64 1e-10, float32 1e-4, "
            "bfloat16 5e-2; 'must exceed' rows pass when a positional encoding moves outputs by more than "
            f"{DIFFERS:g}.")


def tolerance(dtype: torch.dtype, max_position: int) -> float:
    return BASE_TOLERANCE[dtype] * (1 + math.log2(1 + max_position) / 20)


def _within(check, encoding, error, tol, detail="") -> Check:
    return Check(check, encoding, float(error), tol, bool(error <= tol), detail)


def _differs(check, encoding, error, detail="") -> Check:
    return Check(check, encoding, float(error), DIFFERS, bool(error > DIFFERS), detail + " (must exceed)")


def _draw(*shape: int, device, dtype) -> torch.Tensor:
    """Standard normal draws made on the CPU in float32, then moved: every device and dtype checks the same
    numbers (a GPU's own generator once drew Kerple parameters that all clamped to its floor)."""
    return torch.randn(*shape).to(device=device, dtype=dtype)


def _encoding(name: str, device, dtype):
    enc = build_for_model(name, sizes=SIZES)
    with torch.no_grad():
        for parameter in enc.parameters():
            parameter.normal_(0, 0.5)  # trained tables are not near zero; neither are these (drawn on the CPU)
    return enc.to(device=device, dtype=dtype)


def _qkv(device, dtype, batch=2, q_len=LENGTH, k_len=LENGTH):
    return tuple(_draw(batch, HEADS, t, HEAD_DIM, device=device, dtype=dtype) for t in (q_len, k_len, k_len))


@torch.no_grad()
def check_permutation(device, dtype) -> list[Check]:
    """Seed 004 Part I: attention without positions is permutation-equivariant; with them it is not."""
    rows, tol = [], tolerance(dtype, LENGTH)
    perm = torch.randperm(LENGTH).to(device)
    for name in attention_encodings():
        enc = _encoding(name, device, dtype)
        q, k, v = _qkv(device, dtype)
        causal = ENTRIES[name].cls.causal_only  # no bidirectional form (stick-breaking): the causal order changes
        out = attention(q, k, v, enc, causal=causal)
        shuffled = attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], enc, causal=causal)
        error = (shuffled - out[:, :, perm]).abs().max().item()
        rows.append(_within("permutation equivariant", name, error, tol) if name == baseline()
                    else _differs("permutation changes outputs" + (" (causal)" if causal else ""), name, error))
    return rows


@torch.no_grad()
def check_dog_bites_man(device, dtype) -> list[Check]:
    """Same three words in two orders: same outputs up to permutation only without an encoding."""
    rows, tol = [], tolerance(dtype, 3)
    words = _draw(3, HEADS * HEAD_DIM, device=device, dtype=dtype)  # dog, bites, man
    projections = [_draw(HEADS * HEAD_DIM, HEADS * HEAD_DIM, device=device, dtype=dtype) / 8 for _ in range(3)]
    sizes = {"dim": HEADS * HEAD_DIM, "max_positions": 3, "init_std": 1.0}
    encodings = {name: _encoding(name, device, dtype) for name in attention_encodings()}
    for name in one_axis(in_attention=False):  # input-door encodings
        encodings[name] = build_for_model(name, sizes=sizes).to(device=device, dtype=dtype)

    def run(sentence: torch.Tensor, enc, causal: bool) -> torch.Tensor:
        x = enc.embed(sentence[None], torch.arange(3, device=device)[None])  # (1, 3, D)
        q, k, v = (p_x.view(1, 3, HEADS, HEAD_DIM).transpose(1, 2) for p_x in (x @ p for p in projections))
        return attention(q, k, v, enc, causal=causal)  # (1, H, 3, Dh)

    reverse = torch.tensor([2, 1, 0], device=device)
    for name, enc in encodings.items():
        causal = ENTRIES[name].cls.causal_only  # no bidirectional form: the causal order tells the sentences apart
        dog_bites_man, man_bites_dog = run(words, enc, causal), run(words[reverse], enc, causal)
        error = (man_bites_dog - dog_bites_man[:, :, reverse]).abs().max().item()
        if name == baseline():
            rows.append(_within("dog bites man = man bites dog (permuted)", name, error, tol))
        elif name in symmetric():  # scores of |i − j| alone (FIRE's of max(L, i) too, constant for three words)
            rows.append(_within("dog bites man = man bites dog: symmetric in |i-j|, blind to reversal", name, error, tol))
        else:
            rows.append(_differs("dog bites man != man bites dog", name, error))
    return rows


@torch.no_grad()
def check_rope(device, dtype) -> list[Check]:
    """RoPE: scores depend only on offsets; norms preserved; the two layouts agree up to a permutation."""
    shift = 2**20 - LENGTH
    tol = tolerance(dtype, shift + LENGTH)
    inv_freq, _ = rope_frequencies(HEAD_DIM)
    q, k, _ = _qkv(device, dtype)
    pos = torch.arange(LENGTH, device=device)[None]
    scores = [apply_rope(q, p, inv_freq) @ apply_rope(k, p, inv_freq).transpose(-1, -2) for p in (pos, pos + shift)]
    scale = scores[0].abs().max().item()
    offsets = (scores[1].double() - scores[0].double()).abs().max().item() / scale
    rotated = apply_rope(q, pos + shift, inv_freq)
    norms = ((rotated.double().norm(dim=-1) - q.double().norm(dim=-1)).abs() / q.double().norm(dim=-1)).max().item()
    pairs = HEAD_DIM // 2
    perm = torch.tensor([c for i in range(pairs) for c in (i, i + pairs)], device=device)
    half = apply_rope(q, pos + shift, inv_freq, layout="half")
    inter = apply_rope(q[..., perm], pos + shift, inv_freq, layout="interleaved")
    layouts = (inter.double() - half[..., perm].double()).abs().max().item()
    rope = name_of(RoPE)
    return [
        _within("scores depend only on offsets (shift 2^20, relative)", rope, offsets, tol),
        _within("norms preserved (relative)", rope, norms, tol),
        _within("interleaved = permuted half", rope, layouts, tol),
    ]


def check_sinusoid_shift() -> list[Check]:
    """Seed 003: PE(p+7) = M_7 PE(p) by least squares over 100 positions (float64: a property of the formula)."""
    dim, shift, sinusoidal = 16, 7, name_of(Sinusoidal)
    rows = []
    for label, positions in (("positions 0..99", torch.arange(100)), ("positions 0..9999 step 101", torch.arange(100) * 101)):
        p = sinusoidal_table(positions, dim)
        shifted = sinusoidal_table(positions + shift, dim)
        m_t = torch.linalg.lstsq(p, shifted, driver="gelsd").solution
        residual = (p @ m_t - shifted).abs().max().item()
        rotation = torch.zeros(dim, dim, dtype=torch.float64)
        for i in range(dim // 2):
            w = shift / 10000 ** (2 * i / dim)
            rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]])
        distance = (m_t.t() - rotation).abs().max().item()
        rows.append(_within(f"PE(p+7) = M_7 PE(p), least-squares residual, {label}", sinusoidal, residual, 1e-10))
        if positions[-1] < 1000:  # the slow pairs barely turn over 0..99: M_7 is not pinned down there
            rows.append(Check(f"M_7 distance from 2x2 rotations (ill-posed), {label}", sinusoidal, distance,
                              None, True, "information only"))
        else:
            rows.append(_within(f"M_7 distance from 2x2 rotation blocks, {label}", sinusoidal, distance, 1e-6))
    return rows


@torch.no_grad()
def check_backends_and_cache(device, dtype) -> list[Check]:
    """Every backend agrees with eager, and KV-cache decoding equals the full pass, per encoding."""
    rows, tol = [], tolerance(dtype, LENGTH)
    for name in attention_encodings():
        enc = _encoding(name, device, dtype)
        q, k, v = _qkv(device, dtype)
        reference = attention(q, k, v, enc, backend="eager").double()
        for backend in ("eager", "sdpa", "flex"):
            if not serves(backend, enc, q, k, v):
                continue
            full = attention(q, k, v, enc, backend=backend)
            if backend != "eager":
                error = (full.double() - reference).abs().max().item()
                rows.append(_within(f"{backend} agrees with eager", name, error, tol))
            steps = [attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], enc, backend=backend,
                               q_positions=torch.tensor([t], device=device),
                               k_positions=torch.arange(t + 1, device=device)) for t in range(LENGTH)]
            error = (torch.cat(steps, dim=2).double() - full.double()).abs().max().item()
            rows.append(_within(f"KV-cache decoding = full pass ({backend})", name, error, tol))
    return rows


def check_gradients(device, dtype) -> list[Check]:
    """sdpa's gradients (q, k, v and every parameter of the encoding) = eager's in float64, per encoding it
    serves with a gradient: on CPU the learned biases run ``kernels.blockwise`` or ``kernels.offset_bias`` and
    Transformer-XL and Shaw ``kernels.offset_lookup`` there, each with a hand-written backward."""
    rows = []
    for name in attention_encodings():
        enc = _encoding(name, device, dtype)
        q, k, v = (t.requires_grad_() for t in _qkv(device, dtype))
        if not list(enc.parameters()) or not serves("sdpa", enc, q, k, v):
            continue
        reference_encoding = copy.deepcopy(enc).double()
        reference_inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
        upstream = torch.randn(q.shape, dtype=torch.float64).to(device)
        got = _gradients(attention(q, k, v, enc, backend="sdpa"), [q, k, v, *enc.parameters()], upstream)
        expected = _gradients(attention(*reference_inputs, reference_encoding, backend="eager"),
                              [*reference_inputs, *reference_encoding.parameters()], upstream)
        error = max(((a.double() - b).abs().max() / max(1.0, float(b.abs().max()))).item()
                    for a, b in zip(got, expected))
        rows.append(_within("sdpa gradients = eager's (q, k, v, parameters; relative)", name, error,
                            tolerance(dtype, LENGTH)))
    return rows


def _gradients(out: torch.Tensor, inputs: list[torch.Tensor], upstream: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(out, inputs, upstream.to(out.dtype)))


@torch.no_grad()
def check_score_channels(device, dtype) -> list[Check]:
    """ALiBi, Sandwich and Transformer-XL carried as extra q/k channels (the form ``attention()`` takes
    where that times faster) = their bias form in float64, near 0 and at offset 2^20."""
    rows = []
    for name in having(lambda cls: cls.has_score_channels):
        enc = _encoding(name, device, dtype)
        reference_encoding = copy.deepcopy(enc).double()
        q, k, v = _qkv(device, dtype)
        for start in (0, 2**20):
            positions = torch.arange(start, start + LENGTH, device=device)[None]
            if not enc.channels_exact(positions, positions, dtype, contiguous=True):
                continue
            reference = attention(q.double(), k.double(), v.double(), reference_encoding, q_positions=positions,
                                  k_positions=positions, backend="eager")
            at = enc.at(positions, positions, contiguous=True)
            scale = HEAD_DIM**-0.5
            content, query_side, key_side = at.score_channel_parts(q, k, scale)
            channels = attend_with_channels(content, k, v, query_side, key_side, scale=scale, is_causal=True)
            error = (channels.double() - reference).abs().max().item()
            rows.append(_within(f"channel form = bias form (offset {'2^20' if start else 0})", name, error,
                                tolerance(dtype, start + LENGTH)))
    return rows


def check_transformers() -> list[Check]:
    """RoPE frequencies and attention factors equal transformers' for every scaling type."""
    try:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return []
    cases = {
        "linear": {"factor": 4.0},
        "dynamic": {"factor": 4.0},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": 2048},
        "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
        "longrope": {"factor": 4.0, "short_factor": [1.0] * 32, "long_factor": [2.0] * 32,
                     "original_max_position_embeddings": 2048},
        "proportional": {"partial_rotary_factor": 0.25},  # with factor too in tests (5.23 warns of the key it reads)
    }
    rows = []
    for rope_type, params in cases.items():
        hf = LlamaConfig(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=2048,
                         rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, **params})
        theirs, their_factor = ROPE_INIT_FUNCTIONS[rope_type](hf, None, seq_len=4096)
        ours_params = {"rope_type": rope_type, **params}
        if rope_type == "dynamic":
            ours_params["original_max_position_embeddings"] = 2048
        ours, our_factor = rope_frequencies(64, ours_params, seq_len=4096)
        error = max((ours - theirs).abs().max().item(), abs(our_factor - their_factor))
        rows.append(_within("frequencies and attention factor = transformers", f"{name_of(RoPE)}+{rope_type}", error, 0.0))
    return rows


def run_checks(device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0) -> list[Check]:
    torch.manual_seed(seed)
    device = torch.device(device)
    return (check_permutation(device, dtype) + check_dog_bites_man(device, dtype) + check_rope(device, dtype)
            + check_sinusoid_shift() + check_backends_and_cache(device, dtype) + check_gradients(device, dtype)
            + check_score_channels(device, dtype) + check_transformers())


def format_table(rows: list[Check]) -> str:
    header = ("check", "encoding", "error", "tolerance", "result")
    def bound(r: Check) -> str:
        if r.tolerance is None:
            return "info"
        return ("> " if "must exceed" in r.detail else "<= ") + f"{r.tolerance:.1e}"

    body = [(r.check, r.encoding, f"{r.error:.2e}", bound(r), "pass" if r.passed else "FAIL") for r in rows]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(5)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in body]
    return "\n".join(lines)
