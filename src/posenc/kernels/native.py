"""Building posenc's C++ CPU kernels: compiled on first use by ``torch.utils.cpp_extension`` (about 15 s
once per kernel), cached in ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``) under a name that
carries a hash of the source, the flags, the Python and torch versions and install folders and the CPU, so two
versions of posenc, or two environments, never rebuild over, or load, each other's build, and a build for one CPU's
instructions (``-march=native``: the tiles' exp and bias loops need its vector width) never runs on another that
shares the cache. The source and headers are compiled from a copy in the build's folder, not from the checkout:
ninja rebuilds when a source's path or date changes, which a second clone of the same source would otherwise do
(a fresh clone's test run rebuilt every kernel, and the first checkout rebuilt them again after it). ``POSENC_CPU_KERNELS=0`` switches every kernel off; where one cannot be built (no C++ compiler or ninja) it
is None and its callers use the PyTorch form, warned once.

A build holds a ``lock`` file in its folder; torch waits for it to go, with no limit. A process killed while it
built or loaded (a test run interrupted in its first minute) leaves it behind, and every later process would wait
forever. So posenc builds and loads only in its turn (``build_turn``): holding an ``flock`` on ``posenc.flock``
beside it, which the OS frees when the process ends, however it ends, with its host and process id written there
until the turn ends. A ``lock`` found in a turn whose last holder is a process of this host that no longer runs is
removed at once, warned, before torch looks; any other stale ``lock`` once it is ``STALE_LOCK_S`` old.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import socket
import sys
import sysconfig
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

CFLAGS = ("-O3", "-fopenmp", "-march=native")
LDFLAGS = ("-fopenmp",)
STALE_LOCK_S = 600.0  # a build takes 10-60 s; a lock this old belongs to a build that was killed
NOTICE_AFTER_S = 10.0  # a wait this long is said, in case the lock's build was killed
TURN_FILE = "posenc.flock"


HEADERS = Path(__file__).parent  # the kernels' shared headers: cpu_tiles.h, fire_cpu.h


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


def python_abi() -> str:
    """The running Python's version and ABI flags (``3.11``, ``3.13t``): a module built for one does not load in
    another."""
    return f"{sys.version_info.major}.{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"


def include_folders() -> str:
    """Where the compiler finds torch's and Python's headers (and the linker torch's libraries): each environment
    has its own, and they are written into the build's commands."""
    from torch.utils.cpp_extension import include_paths

    return " ".join([*include_paths(), sysconfig.get_paths()["include"]])


def build_name(prefix: str, source: bytes, torch_version: str = torch.__version__, cpu: str | None = None,
               python: str | None = None, includes: str | None = None) -> str:
    """The extension's name for this source (and the shared headers), Python, torch, their folders and CPU: what
    was built, and for what, decides where it is cached."""
    cpu = cpu_identity() if cpu is None else cpu
    python = python_abi() if python is None else python
    includes = include_folders() if includes is None else includes
    parts = [source, headers(), torch_version.encode(), " ".join(CFLAGS + LDFLAGS).encode(), cpu.encode(),
             python.encode(), includes.encode()]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()
    return f"{prefix}_{digest[:16]}"


def build_directory(name: str) -> Path:
    """The folder a build named ``name`` is made and cached in: ``TORCH_EXTENSIONS_DIR`` (or torch's default
    root) / name, created."""
    from torch.utils.cpp_extension import get_default_build_root

    directory = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def staged_source(source: Path, directory: Path) -> Path:
    """The copy of ``source`` in ``directory``, with the shared headers beside it: each file written (atomically)
    only where it is missing or differs, so a build that is current stays so whichever checkout asks for it."""
    for path in (source, *sorted(HEADERS.glob("*.h"))):
        copy, text = directory / path.name, path.read_bytes()
        if not copy.is_file() or copy.read_bytes() != text:
            partial = copy.with_name(f".{copy.name}.{os.getpid()}.partial")
            partial.write_bytes(text)
            os.replace(partial, copy)
    return directory / source.name


def wait_for_build_lock(directory: Path, stale_after_s: float = STALE_LOCK_S, poll_s: float = 0.5,
                        notice_after_s: float = NOTICE_AFTER_S) -> None:
    """Return once ``directory`` holds no build lock: at once where there is none, when a live build removes it, or
    after removing it (warned) once it is ``stale_after_s`` seconds old. A wait past ``notice_after_s`` is
    warned once, naming the lock: a process killed while torch loaded the build leaves one too."""
    lock = directory / "lock"
    started, noticed = time.monotonic(), False
    while True:
        try:
            age_s = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age_s >= stale_after_s:
            warnings.warn(f"posenc: removed a build lock {age_s:.0f} s old, left by a build that was killed: {lock}",
                          stacklevel=3)
            lock.unlink(missing_ok=True)
            return
        if not noticed and time.monotonic() - started >= notice_after_s:
            warnings.warn(f"posenc: waiting for another process's build to remove {lock}; if no other process is "
                          f"building (one was killed), delete the lock, or it is removed once {stale_after_s:.0f} s "
                          "old", stacklevel=3)
            noticed = True
        time.sleep(poll_s)


@contextlib.contextmanager
def build_turn(directory: Path, poll_s: float = 0.5, notice_after_s: float = NOTICE_AFTER_S) -> Iterator[None]:
    """Within the block, this process alone of posenc's builds or loads in ``directory``: it holds the ``flock`` on
    ``directory / TURN_FILE``, waiting while another live process does (a wait past ``notice_after_s`` is warned
    once), and writes its host and process id there until the block ends. A torch ``lock`` found with the id of a
    process of this host that no longer runs was left by a process killed in its turn, and is removed, warned.
    Any other lock (an older posenc's, another host's), and every lock where no flock can be had (no ``fcntl``, a
    filesystem that refuses flocks, another user's turn file): ``wait_for_build_lock``'s age rule."""
    with contextlib.ExitStack() as stack:
        turn = _opened_turn(directory, stack)
        if turn is not None and _wait_for_turn(turn, directory.name, poll_s, notice_after_s):
            _clear_a_killed_turn(turn, directory, poll_s, notice_after_s)
            _record(turn, f"{socket.gethostname()} {os.getpid()}")
            stack.callback(_record, turn, "")  # left in place only by a process killed in its turn
        else:
            wait_for_build_lock(directory, poll_s=poll_s, notice_after_s=notice_after_s)
        yield


def _opened_turn(directory: Path, stack: contextlib.ExitStack):
    """``directory / TURN_FILE`` open for reading and writing, closed (its flock freed) with ``stack``; None without
    ``fcntl`` or where it cannot be opened (another user's, in a shared cache)."""
    if fcntl is None:
        return None
    try:
        return stack.enter_context(open(directory / TURN_FILE, "a+"))
    except OSError:
        return None


def _wait_for_turn(turn, name: str, poll_s: float, notice_after_s: float) -> bool:
    """Hold the flock on the open file ``turn`` once no other process does: True; False where its filesystem takes
    no flocks (some network ones)."""
    started, noticed = time.monotonic(), False
    while True:
        try:
            fcntl.flock(turn, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if not noticed and time.monotonic() - started >= notice_after_s:
                warnings.warn(f"posenc: waiting for another process to build or load {name}", stacklevel=5)
                noticed = True
            time.sleep(poll_s)
        except OSError:
            return False


def _clear_a_killed_turn(turn, directory: Path, poll_s: float, notice_after_s: float) -> None:
    """Remove torch's lock where the last turn's process, of this host, no longer runs; else the age rule."""
    lock = directory / "lock"
    if not lock.exists():
        return
    turn.seek(0)
    owner = turn.read().split()
    if len(owner) == 2 and owner[0] == socket.gethostname() and owner[1].isdigit() and not _runs(int(owner[1])):
        warnings.warn(f"posenc: removed a build lock left by process {owner[1]}, which was killed: {lock}",
                      stacklevel=5)
        lock.unlink(missing_ok=True)
    else:
        wait_for_build_lock(directory, poll_s=poll_s, notice_after_s=notice_after_s)


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _record(turn, text: str) -> None:
    turn.seek(0)
    turn.truncate()
    turn.write(text)
    turn.flush()


def load(prefix: str, source: Path, what: str):
    """The compiled module of ``source``, or None where kernels are off or it cannot be built (warned with
    ``what``, the kernel's name in the message)."""
    if os.environ.get("POSENC_CPU_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils.cpp_extension import load as compile_and_load

        name = build_name(prefix, source.read_bytes())
        directory = build_directory(name)
        with build_turn(directory):
            staged = staged_source(source, directory)
            return compile_and_load(name=name, sources=[str(staged)], build_directory=str(directory),
                                    extra_include_paths=[str(directory)], extra_cflags=list(CFLAGS),
                                    extra_ldflags=list(LDFLAGS), verbose=False)
    except Exception as error:  # noqa: BLE001 - any build failure means "use the PyTorch form"
        warnings.warn(f"posenc: {what} could not be built, using the PyTorch form ({error})", stacklevel=3)
        return None


def loader(source_name: str, what: str) -> Callable[[], Any]:
    """The loader of the C++ kernel ``kernels/<source_name>``: called, its compiled module, built on first use under
    the prefix ``posenc_<its stem>``, or None where kernels are off or it cannot be built (warned once, with
    ``what``)."""
    source = Path(__file__).with_name(source_name)

    @functools.cache
    def extension():
        return load("posenc_" + source.stem, source, what)

    return extension


def runs_here(x: torch.Tensor, extension: Callable[[], Any]) -> bool:
    """Whether a CPU kernel runs on x's device here: CPU, eager (not inside a ``torch.compile`` graph), built."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling() and extension() is not None
