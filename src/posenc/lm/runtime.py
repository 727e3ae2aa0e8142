"""Where a process runs: device, autocast dtype and its place in a DDP group (``torchrun``), and what a results
file must name to be reproduced (``provenance``).

Every command that trains or evaluates reads this once at its start; ``barrier`` is a
no-op outside a process group, so single-process code needs no special case.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .. import __version__

#: how long a rank waits at a barrier: long measurements (pretrained splits hours of them) end at one
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

    def broadcast_float(self, value: float) -> float:
        """Rank 0's ``value`` on every rank (a choice every rank must follow); ``value`` itself in one process."""
        if self.world_size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.float64,
                              device=self.device if dist.get_backend() == "nccl" else "cpu")
        dist.broadcast(tensor, src=0)
        return tensor.item()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's marketing name from ``cpuinfo`` (Linux), else what ``platform`` knows."""
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


COMMIT_VARIABLE = "POSENC_SOURCE_COMMIT"


def git_commit(folder: Path = Path(__file__).resolve().parent) -> str | None:
    """The commit of the git checkout ``folder`` is in, "+modified" when tracked files differ from it; None when
    posenc runs from an installed copy (no checkout) or git is missing. ``POSENC_SOURCE_COMMIT``, where set, names
    it instead: a lent GPU machine receives the working tree with the git metadata of an older commit."""
    if os.environ.get(COMMIT_VARIABLE):
        return os.environ[COMMIT_VARIABLE]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                                 capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+modified" if changed else "")


#: the packages whose versions every results file names where installed (None where not)
LIBRARIES = ("transformers", "gguf", "peft", "accelerate", "triton", "numpy")


@functools.cache
def provenance() -> dict:
    """{"posenc", "torch", "python", "commit", "cpu", "gpu", "libraries"}: what every results file names, so a number
    can be traced to the code and the machine that made it (ratios and even float sums move between CPU models).
    Read once per process, at its first call, which ``posenc``'s CLI makes before any work: a run that ends after a
    commit still names the commit it started from. ``gpu``: the first CUDA device's name, None without one."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"posenc": __version__, "torch": torch.__version__, "python": platform.python_version(),
            "commit": git_commit(), "cpu": cpu_model(), "gpu": gpu,
            "libraries": {name: _installed_version(name) for name in LIBRARIES}}


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def provenance_line(facts: dict) -> str:
    """The one sentence a report ends with."""
    commit = f" (commit {facts['commit'][:12]}{'+modified' if facts['commit'].endswith('+modified') else ''})" \
        if facts.get("commit") else ""
    return (f"posenc {facts['posenc']}{commit}, torch {facts['torch']}, Python {facts['python']}, "
            f"CPU {facts['cpu']}.")
