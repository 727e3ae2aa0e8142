"""Fine-tune a transformers RoPE model for a longer context: PoSE, its control, or full-length windows.

Every step reads ``batch`` random windows of ``window`` + 1 tokens of training text and trains next-token loss
at position ids that depend on the mode:
  - ``pose``: PoSE's skip-wise ids (``posenc.skipwise_positions``): a ``window``-token sequence whose ids cover
    ``[0, target)``, so a model sees the target's positions and distances on windows no longer than its context;
  - ``control``: the same windows with plain ids 0..window−1, so a comparison with ``pose`` isolates what the
    positions bought from what the text (domain) did;
  - ``full``: windows of the whole target length, plain ids (for a GPU).
With ``lora`` > 0 only LoRA adapters on the attention projections train through ``peft``, plus every norm and the
embeddings (LongLoRA, Chen et al. 2023, found both necessary for long context); they are merged into plain
weights at the end. Otherwise every parameter trains. AdamW, linear warmup then cosine decay to 10%.

Resumable: ``last.pt`` (the trainable tensors, optimizer, data generator, step, losses, curve) is written
atomically every ``checkpoint_every`` steps and at every curve point; a run killed at any instant continues from
it and ends where the uninterrupted run ends. Under ``torchrun`` the ranks train a copy sharded with FSDP2
(``sharding.py``: each holds 1/N of the trained parameters, gradients and optimizer state); every rank draws the
same global batch and trains on rows ``rank::world_size``, gradients averaged, so N processes follow one process's
run. Checkpoints hold whole tensors keyed by name: a run may resume under another number of processes.
Finished: ``model.safetensors`` (every parameter, merged) then ``adapt.json`` (metrics and curve).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm.auto import tqdm

from .. import checks, storage
from . import sharding
from ..lm.train import learning_rate
from ..positions import skipwise_positions

MODES = ("pose", "control", "full")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class AdaptConfig:
    mode: str
    target: int  # the context the model is being extended to
    window: int  # tokens per training sequence (the target itself for "full")
    steps: int
    lr: float
    batch: int = 1
    chunks: int = 2
    lora: int = 0  # LoRA rank; 0 = full fine-tuning
    warmup: int = 2
    checkpoint_every: int = 10
    seed: int = 0

    def __post_init__(self):
        checks.choice("--finetune", self.mode, MODES)
        checks.positive_int("--to", self.target, minimum=2)
        checks.positive_int("--finetune-window", self.window, minimum=2)
        checks.positive_int("--finetune-steps", self.steps)
        checks.positive_float("--finetune-lr", self.lr)
        checks.positive_int("--finetune-batch", self.batch)
        checks.positive_int("--pose-chunks", self.chunks)
        checks.positive_int("--finetune-warmup", self.warmup, minimum=0)
        checks.positive_int("checkpoint_every", self.checkpoint_every)
        if self.lora != 0:
            checks.positive_int("--lora", self.lora)
        if self.mode == "full" and self.window != self.target:
            raise ValueError(f"--finetune full trains on windows of --to ({self.target}) tokens; got a window of "
                             f"{self.window}")
        if self.window > self.target:
            raise ValueError(f"--finetune-window ({self.window}) must be at most --to ({self.target})")


def check_lora_rank(rank: object) -> None:
    """``--lora R``: R >= 1 (leave the option out for full fine-tuning)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"--lora must be a rank >= 1 (leave it out for full fine-tuning), got {rank!r}")


def position_ids(config: AdaptConfig, generator: torch.Generator) -> torch.Tensor:
    """(batch, window) int64 ids for one step."""
    target = config.target if config.mode == "pose" else config.window
    return skipwise_positions(config.batch, config.window, target, min(config.chunks, config.window), generator)


def with_lora(model, rank: int):
    """``model`` wrapped by peft with rank-``rank`` adapters on the attention projections; norms and embeddings
    are made trainable too. Returns the peft model (``merged`` turns it back into a plain one)."""
    from peft import LoraConfig, get_peft_model

    check_lora_rank(rank)
    wrapped = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                               target_modules=list(LORA_TARGETS)))
    for name, parameter in wrapped.named_parameters():
        if "norm" in name or "embed_tokens" in name:
            parameter.requires_grad_(True)
    return wrapped


def merged(model):
    """A plain transformers model: LoRA adapters added into their weights (a model without them is returned)."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def adapt(model, tokens: torch.Tensor, config: AdaptConfig, folder: Path, *, points: tuple[int, ...] = (),
          measure: Callable | None = None, rank: int = 0, world_size: int = 1, label: str = "fine-tune"):
    """Fine-tune ``model`` (a transformers causal LM with its scaling applied) and return (plain model, record).

    tokens: (N,) int64 training text, N > window. ``points``: steps at which ``measure(model) -> float`` is put in
    the curve (0: before training). A finished folder is loaded, not trained again.
    """
    folder = Path(folder)
    done, weights = folder / "adapt.json", folder / "model.safetensors"
    if done.exists() and weights.exists():
        model.load_state_dict(storage.load_weights(weights), strict=False)
        return model, storage.read_json(done)
    if tokens.shape[0] <= config.window + 1:
        raise ValueError(f"not enough training text: {tokens.shape[0]:,} tokens for windows of {config.window + 1}")
    if config.batch % world_size:
        raise ValueError(f"--finetune-batch ({config.batch}) must be divisible by the number of processes "
                         f"({world_size})")
    trained = with_lora(model, config.lora) if config.lora else model
    sharded = world_size > 1
    stepped = sharding.sharded_copy(trained, sharding.layer_classes(model)) if sharded else trained
    parameters = {n: p for n, p in stepped.named_parameters() if p.requires_grad}
    whole = {n: p for n, p in trained.named_parameters() if p.requires_grad}  # stepped's own, unless sharded
    optimizer = torch.optim.AdamW(list(parameters.values()), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed)
    start, losses, curve, elapsed = 0, [], {}, 0.0
    checkpoint = folder / "last.pt"
    if checkpoint.exists():
        state = storage.load_checkpoint(checkpoint)
        if "moments" not in state:
            raise ValueError(f"{checkpoint} was written by an older posenc; delete it to fine-tune from the start")
        sharding.load_parameters(stepped, parameters, state["trainable"], sharded)
        sharding.load_optimizer_state(parameters, optimizer, state["moments"])
        generator.set_state(state["generator"])
        start, losses, curve, elapsed = state["step"], state["losses"], state["curve"], state["elapsed"]
    device = next(model.parameters()).device
    began = time.perf_counter() - elapsed
    bar = tqdm(total=config.steps, initial=start, desc=label, disable=rank != 0, dynamic_ncols=True)
    for step in range(start, config.steps + 1):
        if step in points and str(step) not in curve and measure is not None:
            if sharded:  # every rank measures its whole model, given the trained values
                sharding.load_parameters(trained, whole, sharding.full_parameters(parameters), sharded=False)
            trained.eval()
            curve[str(step)] = measure(trained)
            _save(checkpoint, parameters, optimizer, generator, step, losses, curve, began, rank)
        if step == config.steps:
            break
        stepped.train()
        starts = torch.randint(0, tokens.shape[0] - config.window - 1, (config.batch,), generator=generator)
        windows = torch.stack([tokens[s : s + config.window + 1] for s in starts.tolist()])
        ids = position_ids(config, generator)
        rows = slice(rank, None, world_size)
        inputs, targets = windows[rows, :-1].to(device), windows[rows, 1:].to(device)
        logits = stepped(input_ids=inputs, position_ids=ids[rows].to(device)).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # sharded, the reduce-scatter averages the ranks' gradients
        torch.nn.utils.clip_grad_norm_(list(parameters.values()), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        optimizer.step()
        if sharded:  # the record holds the global batch's loss, as one process's does
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= world_size
        losses.append(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if (step + 1) % config.checkpoint_every == 0:
            _save(checkpoint, parameters, optimizer, generator, step + 1, losses, curve, began, rank)
    bar.close()
    if sharded:
        sharding.load_parameters(trained, whole, sharding.full_parameters(parameters), sharded=False)
    plain = merged(trained)
    record = {"config": asdict(config), "losses": losses, "curve": curve, "wall_time_s": time.perf_counter() - began}
    if rank == 0:
        storage.save_weights(weights, {n: p for n, p in plain.named_parameters()})
        storage.write_json(done, record)
        checkpoint.unlink(missing_ok=True)
    return plain, record


def _save(path, parameters, optimizer, generator, step, losses, curve, began, rank) -> None:
    """Write ``last.pt`` from rank 0; sharded, every rank first takes part in gathering the whole tensors."""
    trainable = sharding.full_parameters(parameters)
    moments = sharding.optimizer_state(parameters, optimizer)
    if rank == 0:
        storage.save_checkpoint(path, {"trainable": trainable, "moments": moments,
                                       "generator": generator.get_state(), "step": step, "losses": losses,
                                       "curve": curve, "elapsed": time.perf_counter() - began})
