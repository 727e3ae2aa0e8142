"""Building posenc's C++ CPU kernels: compiled on first use by ``torch.utils.cpp_extension`` (about 30 s
once per kernel), cached in ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``) under a name that
carries a hash of the source, the flags, the torch version and the CPU, so two checkouts or versions of posenc
never rebuild over, or load, each other's build, and a build for one CPU's instructions (``-march=native``: the
tiles' exp and bias loops need its vector width) never runs on another that shares the cache. ``POSENC_CPU_KERNELS=0`` switches every kernel off; where one
cannot be built (no C++ compiler or ninja) it is None and its callers use the PyTorch form, warned once.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import warnings
from pathlib import Path

import torch

CFLAGS = ("-O3", "-fopenmp", "-march=native")
LDFLAGS = ("-fopenmp",)


HEADERS = Path(__file__).parent  # the kernels' shared header, cpu_tiles.h


def headers() -> bytes:
    """The shared headers' text: a change to one is a change to every kernel that includes it."""
    return b"".join(path.read_bytes() for path in sorted(HEADERS.glob("*.h")))


@functools.cache
def cpu_identity() -> str:
    """The CPU's model name and instruction-set flags (``/proc/cpuinfo``), or what ``platform`` says elsewhere."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(dict.fromkeys(wanted))  # each distinct line once (one per core otherwise)


def build_name(prefix: str, source: bytes, torch_version: str = torch.__version__, cpu: str | None = None) -> str:
    """The extension's name for this source (and the shared headers), torch and CPU: what was built, and for what,
    decides where it is cached."""
    cpu = cpu_identity() if cpu is None else cpu
    parts = [source, headers(), torch_version.encode(), " ".join(CFLAGS + LDFLAGS).encode(), cpu.encode()]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()
    return f"{prefix}_{digest[:16]}"


def load(prefix: str, source: Path, what: str):
    """The compiled module of ``source``, or None where kernels are off or it cannot be built (warned with
    ``what``, the kernel's name in the message)."""
    if os.environ.get("POSENC_CPU_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load as compile_and_load

        return compile_and_load(name=build_name(prefix, source.read_bytes()), sources=[str(source)],
                                extra_include_paths=[str(HEADERS)], extra_cflags=list(CFLAGS),
                                extra_ldflags=list(LDFLAGS), verbose=False)
    except Exception as error:  # noqa: BLE001 - any build failure means "use the PyTorch form"
        warnings.warn(f"posenc: {what} could not be built, using the PyTorch form ({error})", stacklevel=3)
        return None
