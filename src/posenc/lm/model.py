"""A tiny byte-level decoder LM whose positional encoding is a config field.

The model calls the encoding's doors through one interface (``embed`` at the
input, ``attention(..., encoding)`` in every layer) and never asks which encoding
it holds. One encoding module is shared by all layers (as T5 shares its bias), unless
``layers`` gives some layers their own encoding and a window or chunk (``lm.layouts``).

Token embeddings follow GPT-2 (std 0.02, tied output head). A fixed sinusoid of
unit amplitude would drown them (Vaswani et al. instead scale embeddings by √D,
which trains markedly slower at this size for every other encoding), so the model
builds input-door encodings at the token embeddings' scale: a sinusoid of RMS 0.02
(``scale`` = 0.02·√2), a learned table initialised with std 0.02. At the same seed every encoding starts from
the same token embeddings and blocks (their own generator), so rows differ by their encodings alone.

Shapes: B batch, T tokens, D model width, H heads, Dh = D / H, V = 256 bytes.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import checks
from ..attention import BACKENDS, attention, attention_weights
from ..encodings import build_for_model
from ..encodings.positioned import PositionedEncoding
from .layouts import check_layers

EMBEDDING_STD = 0.02  # GPT-2's initialisation of every weight and of the token embeddings


@dataclass(frozen=True)
class ModelConfig:
    encoding: str = "rope"
    encoding_kwargs: dict = field(default_factory=dict)  # passed to posenc.build on top of the sizes
    dim: int = 128
    num_layers: int = 4
    num_heads: int = 4
    mlp_ratio: int = 4
    vocab_size: int = 256  # bytes
    max_positions: int = 256  # rows of a learned table: the training length
    backend: str = "auto"
    attention_sink: bool = False  # a learned sink logit per head and layer (posenc.kernels.sinks)
    # per layer ({} = global, the model's encoding; or its own encoding and a window or chunk: lm.layouts); () = all
    layers: tuple = ()

    def __post_init__(self):
        checks.positive_int("dim", self.dim)
        checks.positive_int("num_layers", self.num_layers)
        checks.positive_int("num_heads", self.num_heads)
        checks.positive_int("mlp_ratio", self.mlp_ratio)
        checks.positive_int("vocab_size", self.vocab_size)
        checks.positive_int("max_positions", self.max_positions)
        checks.choice("backend", self.backend, BACKENDS)
        if self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by num_heads ({self.num_heads})")
        object.__setattr__(self, "layers", check_layers(self.layers, self.num_layers))

    def layer(self, index: int) -> dict:
        """Layer ``index``'s entry: {} when it is global with the model's encoding."""
        return self.layers[index] if self.layers else {}

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    def to_dict(self) -> dict:
        return asdict(self)


class KVCache:
    """Keys and values of past tokens, per layer, with their positions.

    Keys are stored rotated, once, at their own positions, so a decoding step rotates
    only its new key and no cos/sin is recomputed for the history. When the rotation
    depends on the context length (``encoding.length_dependent``: dynamic NTK, LongRoPE),
    keys are stored unrotated instead and the whole history is rotated with the current
    length's frequencies at every step: in the first layer step t then equals the full pass
    over t + 1 tokens; deeper layers' cached keys come from hidden states computed at the
    shorter lengths before (as with transformers' dynamic NTK and a cache), so there a step
    differs from the full pass (1e-6 at initialisation in a 2-layer model, 1e-3 once
    attention sharpens; tests/lm/test_model.py checks one layer to 1e-9).
    """

    def __init__(self, num_layers: int):
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers
        self.gates: list[Tensor | None] = [None] * num_layers  # (B, H, T_cached): FoX's log forget gates
        self.positions: Tensor | None = None  # (B or 1, T_cached)
        self.contiguous = True  # positions are 0..T_cached-1, as the model makes them by default

    @property
    def length(self) -> int:
        return 0 if self.positions is None else self.positions.shape[-1]

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, H, T_new, Dh) keys/values of ``layer``; returns all of them."""
        if self.keys[layer] is not None:
            k = torch.cat((self.keys[layer], k), dim=2)
            v = torch.cat((self.values[layer], v), dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def extend_gates(self, layer: int, log_forget: Tensor) -> Tensor:
        """Append (B, H, T_new) log forget gates of ``layer`` (FoX); returns all of them, one per cached key."""
        if self.gates[layer] is not None:
            log_forget = torch.cat((self.gates[layer], log_forget), dim=-1)
        self.gates[layer] = log_forget
        return log_forget

    def keeps_unrotated(self, encoding) -> bool:
        """Whether keys are stored before rotation (and the history re-rotated every step)."""
        return encoding.length_dependent

    def trim(self) -> None:
        """Called after every forward pass; a plain cache keeps everything."""


class StreamingCache(KVCache):
    """StreamingLLM's cache (Xiao et al. 2023, arXiv:2309.17453): the first ``sink_tokens`` tokens and
    the last ``window`` ones, so decoding runs on past the trained length in bounded memory.

    Positions are slots in the cache, not places in the text: after each pass the kept tokens are
    renumbered 0..n−1 and the next token comes at n, so the model never sees a distance beyond
    ``sink_tokens + window``. Keys are therefore stored before rotation and the history is rotated
    at its slot positions every step. Meant for relative encodings (RoPE, ALiBi, ...): an input-door
    encoding has already mixed the original positions into the cached values.
    """

    def __init__(self, num_layers: int, sink_tokens: int = 4, window: int = 256):
        super().__init__(num_layers)
        self.sink_tokens = checks.positive_int("sink_tokens", sink_tokens, minimum=0)
        self.window = checks.positive_int("window", window)

    def keeps_unrotated(self, encoding) -> bool:
        return True

    def trim(self) -> None:
        length, kept = self.length, self.sink_tokens + self.window
        if length > kept:
            index = torch.cat((torch.arange(self.sink_tokens), torch.arange(length - self.window, length)))
            index = index.to(self.keys[0].device)
            self.keys = [k.index_select(2, index) for k in self.keys]
            self.values = [v.index_select(2, index) for v in self.values]
            self.gates = [None if g is None else g.index_select(2, index) for g in self.gates]  # the kept tokens'
        self.positions = torch.arange(min(length, kept), device=self.positions.device)[None]
        self.contiguous = True


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, window: int | None = None, chunk: int | None = None):
        super().__init__()
        self.config = config
        self.window, self.chunk = window, chunk  # local attention (lm.layouts); None: global
        self.attn_norm = nn.LayerNorm(config.dim)
        self.qkv = nn.Linear(config.dim, 3 * config.dim, bias=False)
        self.attn_out = nn.Linear(config.dim, config.dim, bias=False)
        self.mlp_norm = nn.LayerNorm(config.dim)
        self.mlp = nn.Sequential(
            nn.Linear(config.dim, config.mlp_ratio * config.dim),
            nn.GELU(),
            nn.Linear(config.mlp_ratio * config.dim, config.dim),
        )
        self.sink = nn.Parameter(torch.zeros(config.num_heads)) if config.attention_sink else None  # (H,)

    def forward(self, x, at: PositionedEncoding, cache: KVCache | None, layer: int, maps: list | None = None) -> Tensor:
        """x: (B, T, D); ``at``: the encoding at this pass's positions, shared by every block. Returns (B, T, D).

        With ``maps`` a list, appends this layer's attention weights (B, H, T, T_cached + T).
        """
        batch, length, _ = x.shape
        heads, head_dim = self.config.num_heads, self.config.head_dim
        normed = self.attn_norm(x)
        qkv = self.qkv(normed).view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (B, H, T, Dh) views of this block's own projection
        if cache is not None and cache.keeps_unrotated(at.encoding):
            k, v = cache.extend(layer, k, v)  # unrotated history: (B, H, T_cached + T, Dh)
            q, k = at.rotate(q, k)  # rotated with this step's frequencies
        else:
            # The block owns q and k, so they are rotated inside the projection's storage:
            # what SDPA keeps for backward is then that storage, not two new tensors.
            q, k = at.new_tokens().rotate(q, k, in_place=True)
            if cache is not None:
                k, v = cache.extend(layer, k, v)  # rotated keys, each rotated once: (B, H, T_cached + T, Dh)
        done = at.after_rotation()
        if done.encoding.has_token_gates:  # FoX: this layer's forget gates from its own input, the cache's before
            gates = done.encoding.log_forget(normed, layer)
            done = done.with_gates(gates if cache is None else cache.extend_gates(layer, gates))
        span = {"window": self.window, "chunk": self.chunk}
        if maps is not None:
            maps.append(attention_weights(q, k, done, sink=self.sink, **span))
        y = attention(q, k, v, done, backend=self.config.backend, sink=self.sink, **span)
        x = x + self.attn_out(y.transpose(1, 2).reshape(batch, length, -1))
        return x + self.mlp(self.mlp_norm(x))


class LanguageModel(nn.Module):
    """Decoder-only byte LM. The positional encoding comes from ``config.encoding``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        sizes = {"dim": config.dim, "head_dim": config.head_dim, "num_heads": config.num_heads,
                 "num_layers": config.num_layers, "max_positions": config.max_positions, "scale": EMBEDDING_STD * 2**0.5,
                 "init_std": EMBEDDING_STD}
        # The modules every encoding shares draw from their own generator, seeded by one draw of the global one
        # made before the encoding draws anything: at the same seed, every encoding starts from the same token
        # embeddings and blocks, whatever its own parameters consume.
        shared = torch.Generator().manual_seed(int(torch.randint(0, 2**62, ())))
        self.encoding = build_for_model(config.encoding, sizes=sizes, **config.encoding_kwargs)
        self.layer_encodings, self._encoding_of_layer = self._local_encodings(config, sizes)
        self.blocks = nn.ModuleList(Block(config, config.layer(i).get("window"), config.layer(i).get("chunk"))
                                    for i in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.dim)
        for encoding in (self.encoding, self.layer_encodings):  # their linear maps and tables (FIRE's MLP), from
            encoding.apply(self._init_weights)  # the global generator
        for module in (self.embed, self.blocks):
            module.apply(functools.partial(self._init_weights, generator=shared))
        for block in self.blocks:  # GPT-2: shrink residual branches with depth
            for weight in (block.attn_out.weight, block.mlp[2].weight):
                nn.init.normal_(weight, std=EMBEDDING_STD / (2 * config.num_layers) ** 0.5, generator=shared)

    @staticmethod
    def _local_encodings(config: ModelConfig, sizes: dict) -> tuple[nn.ModuleList, list[int | None]]:
        """The local layers' own encodings, one module per distinct (name, kwargs), and for each layer the index
        of its own, or None where it takes the model's encoding."""
        modules, index_of, of_layer = nn.ModuleList(), {}, []
        for layer in range(config.num_layers):
            entry = config.layer(layer)
            if "encoding" not in entry:
                of_layer.append(None)
                continue
            kwargs = entry.get("encoding_kwargs", {})
            kind = (entry["encoding"], repr(sorted(kwargs.items())))
            if kind not in index_of:
                encoding = build_for_model(entry["encoding"], sizes=sizes, **kwargs)
                if encoding.has_input:
                    raise ValueError(f"layers[{layer}]: {entry['encoding']!r} acts on the input embeddings, not in "
                                     "a layer; give it as the model's encoding")
                index_of[kind] = len(modules)
                modules.append(encoding)
            of_layer.append(index_of[kind])
        return modules, of_layer

    @staticmethod
    def _init_weights(module: nn.Module, generator: torch.Generator | None = None) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=EMBEDDING_STD, generator=generator)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def parameter_counts(self) -> dict[str, int]:
        """{'model': parameters outside the encoding, 'encoding': the encoding's own}."""
        encoding = sum(p.numel() for module in (self.encoding, self.layer_encodings) for p in module.parameters())
        return {"model": sum(p.numel() for p in self.parameters()) - encoding, "encoding": encoding}

    def forward(
        self, tokens: Tensor, positions: Tensor | None = None, cache: KVCache | None = None, maps: list | None = None
    ) -> Tensor:
        """tokens: (B, T) int64 bytes; positions: (T,) or (B, T), default continuing the cache.

        Returns logits (B, T, V). With a cache the new keys/values are appended to it;
        with ``maps`` a list, each layer's attention weights (B, H, T, Tk) are appended.
        """
        batch, length = self._checked_tokens(tokens, cache)
        start = 0 if cache is None else cache.length
        contiguous = positions is None and (cache is None or cache.contiguous)
        if positions is None:  # the model's own: not read back to be checked (a GPU would wait for it)
            positions = torch.arange(start, start + length, device=tokens.device)[None]  # (1, T)
        else:
            positions = checks.positions("positions", positions, length, batch).to(tokens.device)
        k_pos = positions
        if cache is not None:
            if cache.positions is not None:
                k_pos = torch.cat((cache.positions.expand(positions.shape[0], -1), positions), dim=-1)
            cache.positions, cache.contiguous = k_pos, contiguous
        # Built once here, shared by every block: RoPE's cos/sin, score biases, masks.
        seq_len = start + length if contiguous else None  # known without reading positions
        at = self.encoding.at(positions, k_pos, seq_len=seq_len, contiguous=contiguous)
        local = [encoding.at(positions, k_pos, seq_len=seq_len, contiguous=contiguous)
                 for encoding in self.layer_encodings]
        x = self.encoding.embed(self.embed(tokens), positions, seq_len)  # (B, T, D)
        for layer, block in enumerate(self.blocks):
            own = self._encoding_of_layer[layer]
            x = block(x, at if own is None else local[own], cache, layer, maps)
        if cache is not None:
            cache.trim()
        return F.linear(self.final_norm(x), self.embed.weight)  # tied output head: (B, T, V)

    def _checked_tokens(self, tokens: Tensor, cache: KVCache | None) -> tuple[int, int]:
        """(B, T) of ``tokens``, refused unless a (B, T) integer tensor of ids below the vocabulary (their values
        read only outside a compiled graph, as positions are), with a cache of one entry per layer."""
        vocab = self.config.vocab_size
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or 0 in tokens.shape or tokens.dtype.is_floating_point \
                or tokens.is_complex() or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must be a (B, T) integer tensor of ids in [0, {vocab}), B, T >= 1, got "
                             f"{getattr(tokens, 'dtype', type(tokens))} {tuple(getattr(tokens, 'shape', ()))}")
        if not torch.compiler.is_compiling():
            low, high = torch.stack(torch.aminmax(tokens)).tolist()  # one read back, not two
            if low < 0 or high >= vocab:
                raise ValueError(f"tokens must be ids in [0, {vocab}) (vocab_size), got {low if low < 0 else high}")
        if cache is not None and len(cache.keys) != self.config.num_layers:
            raise ValueError(f"the cache holds {len(cache.keys)} layers but the model has {self.config.num_layers}: "
                             f"make it with KVCache(model.config.num_layers)")
        held = None if cache is None or cache.keys[0] is None else cache.keys[0].shape[0]
        if held is not None and held != tokens.shape[0]:
            raise ValueError(f"the cache holds a batch of {held} sequences but tokens has B={tokens.shape[0]}: a cache "
                             f"continues the sequences it was filled with (start a new KVCache for others)")
        return tokens.shape
