"""Shared builders for tests: every encoding at small sizes, with non-trivial tables."""

from __future__ import annotations

import torch

import posenc

HEADS, HEAD_DIM = 2, 8

# name -> kwargs, for a (B, HEADS, T, HEAD_DIM) attention; input-door ones take dim.
ATTENTION_ENCODINGS = {
    "none": {},
    "rope": {"head_dim": HEAD_DIM},
    "rope_interleaved_yarn": {"head_dim": HEAD_DIM, "layout": "interleaved",
                              "scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}},
    "rope_dynamic": {"head_dim": HEAD_DIM,
                     "scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}},
    "alibi": {"num_heads": HEADS},
    "alibi_symmetric": {"num_heads": HEADS, "symmetric": True},
    "t5": {"num_heads": HEADS, "num_buckets": 8, "max_distance": 16},
    "t5_interpolated": {"num_heads": HEADS, "bidirectional": True, "interpolate_factor": 2.0},
    "shaw": {"head_dim": HEAD_DIM, "num_heads": HEADS, "max_distance": 3},
    "transformer_xl": {"head_dim": HEAD_DIM, "num_heads": HEADS},
    "kerple_log": {"num_heads": HEADS, "variant": "log"},
    "kerple_power": {"num_heads": HEADS, "variant": "power"},
    "sandwich": {"num_heads": HEADS, "sinusoid_dim": 16},
    "fire": {"num_heads": HEADS, "width": 8, "init_threshold": 4.0},
    "xpos": {"head_dim": HEAD_DIM, "scale_base": 4.0},
    "cope": {"head_dim": HEAD_DIM, "max_positions": 6},
}


def seeded_randn(*shape, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A standard normal tensor drawn in float64 from its own generator at ``seed``, then cast to ``dtype``."""
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(dtype)


def mask_per_head(heads: int, length: int, seed: int = 3) -> torch.Tensor:
    """(1, heads, length, length) bool: random per head, except that the first head keeps every pair (its block mask
    is all full blocks) and every query keeps key 0."""
    mask = torch.rand(1, heads, length, length, generator=torch.Generator().manual_seed(seed)) > 0.5
    mask[:, 0] = True
    mask[..., 0] = True
    return mask


def make_encoding(key: str, dtype=torch.float64, heads: int = HEADS):
    name = key.split("_")[0] if key.startswith(("rope", "alibi", "t5", "kerple")) else key
    kwargs = {**ATTENTION_ENCODINGS[key], **({"num_heads": heads} if "num_heads" in ATTENTION_ENCODINGS[key] else {})}
    enc = posenc.build(name, **kwargs).to(dtype)
    with torch.no_grad():
        for parameter in enc.parameters():
            parameter.normal_(0, 0.5)  # big enough that positions change outputs visibly
    return enc


def qkv(batch=2, q_len=12, k_len=12, dtype=torch.float64):
    return (
        torch.randn(batch, HEADS, q_len, HEAD_DIM, dtype=dtype),
        torch.randn(batch, HEADS, k_len, HEAD_DIM, dtype=dtype),
        torch.randn(batch, HEADS, k_len, HEAD_DIM, dtype=dtype),
    )


def decoded_logits(model, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """A transformers model's logits (1, T, V) from a prefill of ``prefill`` tokens, then one token at a time from
    its KV cache: what a full pass over ``ids`` (1, T) must equal."""
    out = model(ids[:, :prefill], use_cache=True)
    steps, cache = [out.logits], out.past_key_values
    for t in range(prefill, ids.shape[1]):
        steps.append(model(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    return torch.cat(steps, 1)


def grouped_qkv(length: int, dim: int = 8, heads: int = 2, kv_heads: int = 1, seed: int = 0):
    """float64 q (1, heads, T, dim) and k, v (1, kv_heads, T, dim), seeded: the inputs of the position-map tests."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, length, dim, generator=g, dtype=torch.float64) for h in (heads, kv_heads, kv_heads))


def assert_swapped_attention_decodes_as_the_full_pass(switch, prefill: int) -> None:
    """A tiny random Llama whose attention ``switch(model)`` swaps through the registry (STRING, DCA): it changes
    the logits, KV-cache decoding after ``prefill`` tokens equals its full pass, and switching back to sdpa
    restores the model."""
    from posenc.experiments.pretrained.measure import tiny_llama
    from posenc.extension.self_extend import use_attention

    model = tiny_llama(0, 32).double()
    ids = torch.randint(0, 256, (1, 60), generator=torch.Generator().manual_seed(1))
    plain = model(ids).logits
    switch(model)
    full = model(ids).logits
    assert (full - plain).abs().max() > 1e-2
    torch.testing.assert_close(decoded_logits(model, ids, prefill), full)
    use_attention(model, "sdpa")
    torch.testing.assert_close(model(ids).logits, plain)


def kernel_calls(monkeypatch, module, function: str, form: str) -> list[dict]:
    """The keyword arguments of every call of ``module.function`` from attention(), with the attention form
    that reaches it forced (``kernels.dispatch``; it would otherwise be timed against the others)."""
    from posenc.kernels import dispatch

    monkeypatch.setenv(dispatch.FORCE_VARIABLE, form)
    calls = []
    original = getattr(module, function)

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, function, recording)
    return calls


def raising_on_call(function, call: int, error: type[BaseException] = KeyboardInterrupt):
    """``function``, except that its ``call``-th call raises ``error``: a run killed at that moment."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise error
        return function(*args, **kwargs)

    return counted


def failure_text(stderr: str, chars: int = 3000) -> str:
    """A failed subprocess's stderr without its progress bars (they hide the error that stopped it): its last
    ``chars`` characters."""
    lines = [line for line in stderr.replace("\r", "\n").splitlines()
             if line.strip() and "it/s]" not in line and "s/it]" not in line]
    return "\n".join(lines)[-chars:]


def saved_step_bytes(encodings, length: int = 512) -> dict[str, int]:
    """Bytes autograd keeps for the backward of a training step of the tiny LM per encoding, 2 sequences of
    ``length`` tokens, each model built from the same seed: what a kernel's "keeps what NoPE keeps" tests compare."""
    from posenc.bench.training import saved_activation_bytes
    from posenc.lm.model import LanguageModel, ModelConfig

    tokens = torch.randint(0, 256, (2, length + 1))
    sizes = {}
    for encoding in encodings:
        torch.manual_seed(0)
        sizes[encoding] = saved_activation_bytes(LanguageModel(ModelConfig(encoding=encoding, max_positions=length)),
                                                 tokens)
    return sizes
