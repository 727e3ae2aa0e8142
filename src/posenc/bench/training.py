"""Training-step time and activation memory per encoding, as ratios to NoPE in the same run.

The model is the default preset's (dim 128, 4 layers, 4 heads); a step is forward,
cross-entropy, backward and an AdamW update on one fixed batch of random bytes.
Activation memory is counted exactly rather than sampled: the bytes of every tensor
autograd saves for the backward pass (each storage once, parameters excluded).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..encodings.registry import baseline, one_axis
from ..kernels import dispatch
from ..lm.model import LanguageModel, ModelConfig
from .timing import round_robin


def _model(encoding: str, length: int, device: torch.device, backend: str = "auto") -> LanguageModel:
    """The default model; NoPE, the baseline, always on the "auto" backend."""
    backend = "auto" if encoding == baseline() else backend
    return LanguageModel(ModelConfig(encoding=encoding, max_positions=length, backend=backend)).to(device)


def _loss(model, tokens: torch.Tensor, autocast: torch.dtype | None = None) -> torch.Tensor:
    with torch.autocast(tokens.device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
        logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def bench_training_step(device: str = "cpu", shapes=((64, 32), (512, 8)), encodings=None, rounds: int = 7,
                        compile: bool = False, backend: str = "auto", autocast: torch.dtype | None = None
                        ) -> list[dict]:
    """Rows {encoding, length, batch, backend, form, ms, ratio (to none), ratio_low, ratio_high} per (length,
    batch); ``form``: what ``kernels.dispatch`` chose for its score terms at this length ("—" where nothing was
    chosen).

    With ``compile`` each model runs under ``torch.compile(fullgraph=True)``; compile time is
    spent in the warm-up calls and not counted here. ``backend``: every model's attention backend but NoPE's
    (which stays on "auto"); ``autocast``: the forward under autocast to this dtype (bf16 on a GPU), else float32.
    ``encodings``: names, NoPE's among them (default: every encoding the tiny LM trains).
    """
    device, encodings = torch.device(device), one_axis() if encodings is None else encodings
    rows = []
    # Every model instance is a new guard on the same forward code: allow one graph per model.
    limit = torch._dynamo.config.patch(recompile_limit=2 * len(encodings) * len(shapes))
    with limit:
        for length, batch in shapes:
            tokens = torch.randint(0, 256, (batch, length + 1), device=device)
            contenders, kinds = {}, {}
            for name in encodings:
                model = _model(name, length, device, backend)
                kinds[name] = type(model.encoding).__name__
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
                forward = torch.compile(model, fullgraph=True) if compile else model

                def step(forward=forward, optimizer=optimizer):
                    optimizer.zero_grad(set_to_none=True)
                    _loss(forward, tokens, autocast).backward()
                    optimizer.step()

                contenders[name] = step
            timed = round_robin(contenders, baseline=baseline(), rounds=rounds, device=device, warmup=2,
                                label=f"training L={length} B={batch}{' compiled' if compile else ''}")
            rows += [{"encoding": name, "length": length, "batch": batch, "compiled": compile,
                      "backend": "auto" if name == baseline() else backend,
                      "form": form_chosen(kinds[name], length), **numbers} for name, numbers in timed.items()]
    return rows


def form_chosen(kind: str, length: int) -> str:
    """The forms ``kernels.dispatch`` chose in this process for an encoding class's training calls of this length."""
    marks = (f"{kind} ", " train ", f" Tq={dispatch.bucket(length)} ")
    forms = {form for key, form in dispatch.chosen().items() if all(mark in f"{key} " for mark in marks)}
    return ", ".join(sorted(forms)) or "—"


def saved_activation_bytes(model: torch.nn.Module, tokens: torch.Tensor, autocast: torch.dtype | None = None) -> int:
    """Bytes autograd keeps for the backward pass of one loss, each storage once, parameters excluded."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = _loss(model, tokens, autocast)
    del loss
    return sum(storages.values())


def bench_activation_memory(device: str = "cpu", shapes=((64, 32), (512, 8)), encodings=None,
                            backend: str = "auto", autocast: torch.dtype | None = None) -> list[dict]:
    """Rows {encoding, length, batch, backend, mib, ratio (to none)}: activation memory of one training step
    (``backend``, ``autocast`` and ``encodings`` as in ``bench_training_step``)."""
    device = torch.device(device)
    rows = []
    for length, batch in shapes:
        tokens = torch.randint(0, 256, (batch, length + 1), device=device)
        measured = {name: saved_activation_bytes(_model(name, length, device, backend), tokens, autocast)
                    for name in (one_axis() if encodings is None else encodings)}
        rows += [{"encoding": name, "length": length, "batch": batch,
                  "backend": "auto" if name == baseline() else backend, "mib": size / 2**20,
                  "ratio": size / measured[baseline()]} for name, size in measured.items()]
    return rows
