"""The pretrained model and what is measured on it: loading (a local model, SmolLM2, or a tiny random Llama),
the tokens of the text, each method's rope_parameters, and next-token loss at every position in chunks."""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ... import hf
from ...extension.methods import method_scaling
from ...lm.corpora import named_corpus
from ...lm.data import text_corpus
from .config import PretrainedConfig


TINY_CONTEXT = 512  # the smoke model's context: its first half holds four planted keys of ~55 byte tokens


class ByteTokens:
    """The smoke model's tokenizer: UTF-8 bytes."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i % 256 for i in ids).decode("utf-8", errors="replace")


class HFTokens:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def tiny_llama(seed: int = 0, context: int = 64):
    """A random 2-layer Llama over bytes (vocab 256), RoPE theta 10,000, ``context`` positions: built offline.
    Weights drawn with std 0.2 (not 0.02), so attention, and so the loss, depends on positions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=0,
                         eos_token_id=1, tie_word_embeddings=True, initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


def load_model(config: PretrainedConfig):
    """(model, tokens) for the config's model."""
    if config.model == "tiny":
        return tiny_llama(config.seed, TINY_CONTEXT), ByteTokens()
    model, tokenizer = hf.load(config.model)
    if tokenizer is None:
        raise ValueError(f"{config.model} has no tokenizer (tokenizer.json); posenc pretrained needs one")
    return model, HFTokens(tokenizer)


def method_parameters(method: str, factor: float, original: int, theta: float, own: dict) -> dict:
    """The rope_parameters of ``method``; ``none`` is the model's own (unscaled) config."""
    if method == "none":
        return dict(own)
    return method_scaling(method, factor, original, base=theta)


@contextmanager
def layer_progress(decoder, label: str):
    """A progress bar (with ETA) advanced by every layer of one long forward pass through ``decoder``."""
    layers = list(getattr(decoder, "layers", []))
    bar = tqdm(total=len(layers), desc=label, leave=False, dynamic_ncols=True)

    def advance(*_) -> None:  # a forward hook that returns something replaces the layer's output
        bar.update(1)

    hooks = [layer.register_forward_hook(advance) for layer in layers]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        bar.close()


def decoder_and_head(model):
    """(the decoder stack, the output projection) of a causal LM, a peft-wrapped one included (its ``.model`` is
    the wrapped CausalLM, not the decoder)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.lm_head


@torch.no_grad()
def prefill(model, tokens: torch.Tensor, chunk: int = 2048, label: str = "forward", keep_cache: bool = False):
    """Next-token loss (nats) at every position of one window, from hidden states in chunks, and (with
    ``keep_cache``) the KV cache the questions of a retrieval continue from.

    tokens: (T,) int64. Returns ((T - 1,) float32, cache or None). Never holds more than chunk × vocab logits.
    """
    device = next(model.parameters()).device
    decoder, head = decoder_and_head(model)
    with layer_progress(decoder, f"{label} ({tokens.shape[0] - 1:,} tokens)"):
        out = decoder(input_ids=tokens[None].to(device), use_cache=keep_cache)
    hidden = out.last_hidden_state[0]  # (T, D)
    losses = []
    for start in range(0, tokens.shape[0] - 1, chunk):
        end = min(start + chunk, tokens.shape[0] - 1)
        logits = head(hidden[start:end]).float()  # (chunk, V)
        losses.append(F.cross_entropy(logits, tokens[start + 1 : end + 1].to(device), reduction="none").cpu())
    return torch.cat(losses), (out.past_key_values if keep_cache else None)


def position_losses(model, tokens: torch.Tensor, chunk: int = 2048, label: str = "forward") -> torch.Tensor:
    """``prefill``'s losses alone: (T - 1,) float32 for tokens (T,)."""
    return prefill(model, tokens, chunk, label)[0]


def binned(losses: torch.Tensor, bins: int) -> dict:
    """Mean loss per equal bin of positions; NaN marks positions that are not scored (a needle's tokens)."""
    edges = [round(i * losses.shape[0] / bins) for i in range(bins + 1)]
    return {"bin_edges": edges, "loss": [losses[a:b].nanmean().item() for a, b in zip(edges[:-1], edges[1:])]}


@functools.cache
def corpus_of(text: str | None, corpus: str = "stdlib"):
    """``--text`` or the named ``--corpus``, read once per process (the run reads its test, dev and train splits)."""
    return text_corpus(text) if text else named_corpus(corpus)


TRAIN_BYTES = 4_000_000  # fine-tuning text: at most this much of the train split (far more than a run reads)


def read_text_tokens(config: PretrainedConfig, tokens, split: str = "test", limit: int | None = None) -> torch.Tensor:
    """The ``split`` of the corpus in the model's tokens: (T,); at most ``limit`` bytes of it."""
    data = getattr(corpus_of(config.text, config.corpus), split).data[:limit]
    return torch.tensor(tokens.encode(bytes(data.tolist()).decode("utf-8", errors="replace")), dtype=torch.int64)


def long_documents(config: PretrainedConfig, tokens, split: str, count: int, length: int) -> list[dict]:
    """The first ``length`` tokens of ``count`` documents of ``split`` that are at least that long: one window per
    document (the unit every interval resamples), taken in turn from each source (the first path component of a
    name that has one: "kjv/Genesis" is from kjv). Within a source, ``config.draw`` orders them: "longest" first
    (the published runs), or "seeded": a random order drawn from ``config.seed`` and the split, where no source
    may give more than half of the documents when several do. Returns [{"file", "start": 0, "ids" (length,)
    int64}]."""
    part = getattr(corpus_of(config.text, config.corpus), split)
    ends = list(part.starts[1:]) + [len(part.data)]
    by_source: dict[str, list[tuple[str, list[int]]]] = {}
    for name, start, end in zip(part.files, part.starts, ends):
        if end - start > length:  # a token is at least one byte
            ids = tokens.encode(bytes(part.data[start:end].tolist()).decode("utf-8", errors="replace"))
            if len(ids) >= length:
                by_source.setdefault(name.split("/")[0] if "/" in name else "", []).append((name, ids))
    queues = [_ordered(documents, config, split) for documents in by_source.values()]
    if config.draw == "seeded" and len(queues) > 1:
        queues = [queue[: count // 2] for queue in queues]
    documents = [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]
    if len(documents) < count:
        capped = " (at most half from each source)" if config.draw == "seeded" and len(queues) > 1 else ""
        raise ValueError(f"not enough long text: the {split} split has {len(documents)} documents of at least "
                         f"{length:,} tokens{capped}; {count} are needed. Pass a --corpus or --text with more long "
                         "documents, a smaller --to, or fewer --documents / --dev-documents")
    return [{"file": name, "start": 0, "ids": torch.tensor(ids[:length], dtype=torch.int64)}
            for name, ids in documents[:count]]


def _ordered(documents: list[tuple[str, list[int]]], config: PretrainedConfig, split: str) -> list:
    """One source's long documents, longest first (ties by name), or in a seeded random order."""
    documents = sorted(documents, key=lambda d: (-len(d[1]), d[0]))
    if config.draw == "longest":
        return documents
    generator = torch.Generator().manual_seed(config.seed * 1_000 + ("train", "dev", "test").index(split))
    return [documents[i] for i in torch.randperm(len(documents), generator=generator).tolist()]


@torch.no_grad()
def sliding_losses(model, tokens: torch.Tensor, context: int, stride: int, start: int, chunk: int) -> torch.Tensor:
    """Next-token losses of positions ``start`` .. T−2 with at most ``context`` tokens of context: windows of
    ``context`` tokens that advance by ``stride``, each scoring only its last ``stride`` positions.
    tokens: (T,). Returns (T − 1 − start,)."""
    losses, position = [], start
    while position < tokens.shape[0] - 1:
        end = min(position + stride, tokens.shape[0] - 1)
        first = max(0, end - context)
        window = position_losses(model, tokens[first : end + 1], chunk, label="context control")
        losses.append(window[position - first :])
        position = end
    return torch.cat(losses)
