"""RoPE frequency scalings as data: a config dict in, (inv_freq, attention_factor) out.

The dict is the one a Hugging Face ``config.json`` holds under ``rope_parameters`` /
``rope_scaling``, e.g. ``{"rope_type": "yarn", "factor": 4.0,
"original_max_position_embeddings": 2048}``, and every formula follows
transformers 5.23 (``modeling_rope_utils.py``) operation for operation in float32,
so the frequencies agree bit for bit where transformers defines them. ``ntk``
(static NTK-aware, base·s^(d/(d-2))) is the one type transformers does not have.

Each scaling is a pure function ``(params, dim, seq_len) -> (inv_freq, attention_factor)``
where dim = int(head_dim · partial_rotary_factor) is the rotated width; the registry
``SCALINGS`` maps ``rope_type`` to the function and the keys it reads.

Three things are called "partial rotary" and differ:
  - ``partial_rotary_factor`` (most types): the first int(Dh·f) channels rotate, with
    frequencies spread over that narrower width, pairs (c, c + Dh·f/2);
  - ``proportional`` (p-RoPE, Gemma 4): frequencies spread over the *whole* head,
    base^(-2i/Dh), and only the fastest int(f·Dh/2) pairs rotate; the slow rest get
    frequency 0 (NoPE channels), pairs (c, c + Dh/2);
  - ``RoPE(rotary_heads=n)``: whole heads rotate or not (see ``rotary.py``).

Hugging Face configs with several layer types (Gemma 3: ``sliding_attention`` and
``full_attention``) may hold one dict per type; ``layer_scalings`` splits them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from .. import checks

COMMON_KEYS = ("rope_type", "rope_theta", "partial_rotary_factor")


def _exponents(dim: int) -> Tensor:
    """2i/dim for i < dim/2, float32, computed as transformers does. (dim/2,)"""
    return torch.arange(0, dim, 2, dtype=torch.int64).float() / dim


def _default(p: dict, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    return 1.0 / (p["rope_theta"] ** _exponents(dim)), 1.0


def _linear(p: dict, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    inv_freq, _ = _default(p, dim, seq_len)
    return inv_freq / p["factor"], 1.0


def _ntk(p: dict, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    base = p["rope_theta"] * p["factor"] ** (dim / (dim - 2))
    return 1.0 / (base ** _exponents(dim)), 1.0


def _dynamic(p: dict, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    original = p["original_max_position_embeddings"]
    seq_len = original if seq_len is None else max(seq_len, original)
    factor = p["factor"]
    base = p["rope_theta"] * ((factor * seq_len / original) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** _exponents(dim)), 1.0


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature term 0.1·mscale·ln(s) + 1 (1 when s <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_ramp_bounds(p: dict, dim: int) -> tuple[float, float]:
    """Frequency indices where YaRN's ramp starts and ends (from beta_fast / beta_slow)."""
    base, original = p["rope_theta"], p["original_max_position_embeddings"]

    def index_for(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = index_for(p.get("beta_fast") or 32), index_for(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn(p: dict, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    factor = p["factor"]
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
        else:
            attention_factor = yarn_mscale(factor)
    low, high = yarn_ramp_bounds(p, dim)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: keep the original frequency (extrapolate); 0: divide by factor
    wavelength_scale = p["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim)
    extrapolated, interpolated = 1.0 / wavelength_scale, 1.0 / (factor * wavelength_scale)
    return interpolated * (1 - keep) + extrapolated * keep, attention_factor


def _longrope(p: dict, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    original = p["original_max_position_embeddings"]
    factor = p.get("factor")
    if factor is None:
        factor = p["max_position_embeddings"] / original
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    for which in ("short_factor", "long_factor"):  # both, so a wrong long list is not found only past `original`
        factors = torch.as_tensor(p[which])
        if factors.shape != (dim // 2,):
            raise ValueError(f"{which} must have dim/2 = {dim // 2} entries, got {factors.numel()}")
    long = seq_len is not None and seq_len > original
    ext = torch.tensor(p["long_factor"] if long else p["short_factor"], dtype=torch.float32)
    return 1.0 / (ext * p["rope_theta"] ** _exponents(dim)), attention_factor


def _proportional(p: dict, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    """p-RoPE: dim is the full head width here (``Scaling.full_width``)."""
    rotated = int(p["partial_rotary_factor"] * dim // 2)
    fast = 1.0 / (p["rope_theta"] ** (torch.arange(0, 2 * rotated, 2, dtype=torch.int64).float() / dim))
    inv_freq = torch.cat((fast, torch.zeros(dim // 2 - rotated)))
    return inv_freq / p.get("factor", 1.0), 1.0


def _llama3(p: dict, dim: int, seq_len: int | None) -> tuple[Tensor, float]:
    inv_freq, _ = _default(p, dim, seq_len)
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    original = p["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


@dataclass(frozen=True)
class Scaling:
    compute: Callable[[dict, int, int | None], tuple[Tensor, float]]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    #: True when the frequencies change with the sequence length (recomputed per call).
    length_dependent: bool = False
    #: True when the frequencies span the whole head and partial_rotary_factor zeroes the slow
    #: ones (p-RoPE), instead of narrowing the rotated width.
    full_width: bool = False


SCALINGS: dict[str, Scaling] = {
    "default": Scaling(_default),
    "linear": Scaling(_linear, ("factor",)),
    "ntk": Scaling(_ntk, ("factor",)),
    "dynamic": Scaling(_dynamic, ("factor", "original_max_position_embeddings"), length_dependent=True),
    "yarn": Scaling(
        _yarn,
        ("factor", "original_max_position_embeddings"),
        ("beta_fast", "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim"),
    ),
    "longrope": Scaling(
        _longrope,
        ("short_factor", "long_factor", "original_max_position_embeddings"),
        ("factor", "max_position_embeddings", "attention_factor"),
        length_dependent=True,
    ),
    "llama3": Scaling(_llama3, ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")),
    "proportional": Scaling(_proportional, (), ("factor",), full_width=True),
}


def is_per_layer_type(rope_parameters: dict | None) -> bool:
    """True for a Hugging Face dict that holds one scaling dict per layer type, e.g.
    ``{"sliding_attention": {...}, "full_attention": {...}}``."""
    return isinstance(rope_parameters, Mapping) and bool(rope_parameters) and all(
        isinstance(v, dict) or v is None for v in rope_parameters.values())


def layer_scalings(rope_parameters: dict, base: float = 10000.0) -> dict[str, dict]:
    """Per-layer-type ``rope_parameters`` -> {layer type: validated scaling dict}; a flat dict
    (one scaling for every layer) comes back under the key ``"all"``. Types saved as None
    (layers without RoPE) are left out."""
    if not is_per_layer_type(rope_parameters):
        return {"all": normalize_scaling(rope_parameters, base)}
    return {layer: normalize_scaling(params, base) for layer, params in rope_parameters.items() if params is not None}


def normalize_scaling(scaling: dict | None, base: float = 10000.0) -> dict:
    """Validate a scaling dict and fill in defaults; returns a new dict.

    Accepts the legacy key ``type`` for ``rope_type``. Raises ValueError for an
    unknown ``rope_type``, keys no scaling type reads (typos), missing required keys
    and ``factor < 1``.
    """
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ValueError(f"scaling must be None or a dict (a Hugging Face rope_parameters / rope_scaling), e.g. "
                         f"{{'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 4096}}, got "
                         f"{scaling!r}")
    if is_per_layer_type(scaling):
        raise ValueError(f"this rope_parameters dict holds one scaling per layer type ({', '.join(scaling)}); "
                         "a RoPE takes one of them, e.g. scaling=rope_parameters['full_attention'] "
                         "(posenc.layer_scalings splits them)")
    params = dict(scaling or {})
    if "type" in params:
        params.setdefault("rope_type", params.pop("type"))
    read_by_a_type = sorted((set(params) - set(COMMON_KEYS)) & set().union(*(s.required + s.optional
                                                                             for s in SCALINGS.values())))
    if "rope_type" not in params and read_by_a_type:  # plain RoPE would ignore them: no scaling, silently
        raise ValueError(f"the scaling dict gives {read_by_a_type} but no rope_type to read them; name one of "
                         f"{sorted(set(SCALINGS) - {'default'})}")
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", base)
    params.setdefault("partial_rotary_factor", 1.0)
    rope_type = checks.choice("rope_type", params["rope_type"], tuple(SCALINGS))
    spec = SCALINGS[rope_type]
    # Keys of other types are accepted and ignored, as in a pasted config.json; typos are not.
    known = set(COMMON_KEYS).union(*(set(s.required) | set(s.optional) for s in SCALINGS.values()))
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"unknown keys {unknown} in the scaling dict; valid keys: {sorted(known)}")
    missing = [key for key in spec.required if params.get(key) is None]
    if missing:
        raise ValueError(f"rope_type={rope_type!r} needs {missing} in the scaling dict")
    checks.positive_float("rope_theta", params["rope_theta"], minimum=1.0)
    prf = params["partial_rotary_factor"]
    if not isinstance(prf, (int, float)) or not 0 < prf <= 1:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {prf!r}")
    if params.get("factor") is not None:
        checks.positive_float("factor", params["factor"], minimum=1.0, inclusive=True)
    if "original_max_position_embeddings" in params:
        checks.positive_int("original_max_position_embeddings", params["original_max_position_embeddings"])
    _check_numbers(params)
    if rope_type == "longrope" and params.get("factor") is None and "max_position_embeddings" not in params:
        raise ValueError("rope_type='longrope' needs 'factor' or 'max_position_embeddings' in the scaling dict")
    if rope_type == "llama3" and not params["high_freq_factor"] > params["low_freq_factor"]:
        raise ValueError("llama3 scaling needs high_freq_factor > low_freq_factor")
    if rope_type == "yarn" and (params.get("beta_fast") or 32) < (params.get("beta_slow") or 1):
        raise ValueError(f"yarn scaling needs beta_fast >= beta_slow (its ramp runs from beta_fast rotations down to "
                         f"beta_slow; transformers only warns), got beta_fast={params.get('beta_fast')} and "
                         f"beta_slow={params.get('beta_slow')} (None: 32 and 1)")
    return params


#: the numeric keys a scaling type reads -> (smallest value, whether it is allowed): each finite where given
_NUMBERS = {"attention_factor": (0.0, False), "beta_fast": (0.0, False), "beta_slow": (0.0, False),
            "mscale": (0.0, True), "mscale_all_dim": (0.0, True), "low_freq_factor": (0.0, False),
            "high_freq_factor": (0.0, False)}


def _check_numbers(params: dict) -> None:
    """The scaling's numeric keys, where given (not None): each a finite number in its range; LongRoPE's factor
    lists lists of finite numbers > 0 (their length is checked against the head width where it is known)."""
    for key, (minimum, inclusive) in _NUMBERS.items():
        if params.get(key) is not None:
            checks.positive_float(key, params[key], minimum=minimum, inclusive=inclusive)
    for key in ("short_factor", "long_factor"):
        factors = params.get(key)
        if factors is not None and (not isinstance(factors, (list, tuple)) or not all(
                isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < math.inf for f in factors)):
            raise ValueError(f"{key} must be a list of finite numbers > 0 (one per rotated pair), got {factors!r}")
    if params.get("max_position_embeddings") is not None:
        checks.positive_int("max_position_embeddings", params["max_position_embeddings"])


def rotary_dim(head_dim: int, partial_rotary_factor: float = 1.0, rope_type: str = "default") -> int:
    """Channels the frequencies span: int(head_dim · partial_rotary_factor), as transformers computes
    it; the whole head for a full-width type (``proportional``), whose slow channels have frequency 0."""
    return head_dim if SCALINGS[rope_type].full_width else int(head_dim * partial_rotary_factor)


def rope_frequencies(
    head_dim: int, scaling: dict | None = None, *, seq_len: int | None = None
) -> tuple[Tensor, float]:
    """Inverse frequencies and attention factor of RoPE under a scaling dict.

    Args:
        head_dim: Dh, the per-head width.
        scaling: a Hugging Face ``rope_parameters`` dict (None: plain RoPE, base 10000).
        seq_len: current sequence length, read by ``dynamic`` and ``longrope``.
    Returns:
        inv_freq (F,) float32 with F = int(Dh · partial_rotary_factor) // 2 (Dh // 2 for
        ``proportional``, zeros past the rotated pairs), and the
        factor that scales both cos and sin (so logits scale by its square).
    """
    checks.positive_int("head_dim", head_dim)
    params = normalize_scaling(scaling)
    dim = rotary_dim(head_dim, params["partial_rotary_factor"], params["rope_type"])
    if dim < 2 or dim % 2:
        raise ValueError(
            f"the rotary dim int(head_dim * partial_rotary_factor) must be an even integer >= 2, "
            f"got {dim} (head_dim={head_dim}, partial_rotary_factor={params['partial_rotary_factor']})"
        )
    if params["rope_type"] in ("ntk", "dynamic") and dim <= 2:
        raise ValueError(f"rope_type={params['rope_type']!r} needs a rotary dim > 2 (its exponent is d/(d-2)), got {dim}")
    if seq_len is not None:
        checks.positive_int("seq_len", seq_len)
    return SCALINGS[params["rope_type"]].compute(params, dim, seq_len)
