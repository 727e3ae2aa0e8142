"""Where a process runs: device, autocast dtype and its place in a DDP group (``torchrun``).

Every command that trains or evaluates reads this once at its start; ``barrier`` is a
no-op outside a process group, so single-process code needs no special case.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

#: how long a rank waits at a barrier: long measurements (extend --hf splits hours of them) end at one
GROUP_TIMEOUT = timedelta(hours=6)


@dataclass
class Runtime:
    """Where this process runs: device, precision and its place in a DDP group."""

    device: torch.device
    autocast_dtype: torch.dtype | None
    rank: int = 0
    world_size: int = 1
    label: str = field(default="")

    @classmethod
    def detect(cls, requested: str) -> "Runtime":
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        cuda = torch.cuda.is_available() and requested in ("auto", "cuda")
        if requested == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available here; use --device cpu or auto")
        if cuda:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        if world_size > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo", timeout=GROUP_TIMEOUT)
        name = torch.cuda.get_device_name(device) if cuda else f"cpu ({os.cpu_count()} cores)"
        return cls(device, torch.bfloat16 if cuda else None, rank, world_size, name)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()
