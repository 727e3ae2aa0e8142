"""Running a Triton check under TRITON_INTERPRET=1, which Triton reads when it is imported: in a child process, so
this one is untouched; and a stand-in for a GPU tensor, for the rules that decide what a GPU is offered."""

import os
import subprocess
import sys
from types import SimpleNamespace

import torch


def run_interpreted(script: str, timeout: float = 600, **env: str) -> str:
    """Runs ``script`` with ``python -c`` under the interpreter (and ``env``); returns its stdout, which must end in
    "ok" where the script prints it. Fails the test with the script's stderr when it exits non-zero."""
    result = subprocess.run([sys.executable, "-c", script], env={**os.environ, "TRITON_INTERPRET": "1", **env},
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-3000:]}"
    return result.stdout


def gpu_tensor(dtype: torch.dtype = torch.bfloat16, width: int = 64) -> SimpleNamespace:
    """What the offering rules read of a CUDA tensor (B, H, T, ``width``)."""
    return SimpleNamespace(is_cuda=True, device=torch.device("meta"), dtype=dtype, shape=(1, 1, 1, width))
