import os
import shutil
import tempfile
import threading

import pytest
import torch
import tqdm

# The uncompiled FlexAttention path keeps the suite fast (the default on CPU); one test compiles it.
os.environ.setdefault("POSENC_FLEX_COMPILE", "0")
# Attention forms timed in the suite are remembered in its own file, never in the user's cache (removed at the end).
_FORMS_FOLDER = tempfile.mkdtemp(prefix="posenc-forms-")
os.environ["POSENC_FORMS_CACHE"] = os.path.join(_FORMS_FOLDER, "attention-forms.json")
# Under pytest-xdist the workers share the cores: one worker's OpenMP pool as wide as the machine would
# oversubscribe it (spinning threads of two pools slow both).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))
    # and the processes a test starts (a Triton interpreter check, a command line, torchrun) the same share: two
    # interpreter checks at once, each with a pool as wide as the machine, took 26 s where they take 17-23 s.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

# `make mutate` forks one process per mutant from this one. tqdm's default write lock is shared with forked
# children (a multiprocessing lock) and its monitor thread takes the thread lock every few seconds: a child forked
# while either is held waits on it forever, and the mutant reads as a timeout. A plain lock and no monitor here.
tqdm.tqdm.set_lock(threading.RLock())
tqdm.tqdm.monitor_interval = 0


def pytest_sessionstart(session):
    """Under two or more workers, each builds its share of the C++ kernels as it starts: built on first use
    instead, a worker that needs a kernel the other is building waits idle for it (a fresh clone builds all
    five, about 75 s on two cores)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if _WORKERS > 1 and worker.startswith("gw"):
        from posenc.kernels import gated_counts, offset_bias, offset_lookup, rope_cpu, sticks

        builds = (offset_bias.extension, offset_lookup.extension, gated_counts.extension, sticks.extension,
                  rope_cpu.extension)
        for build in builds[int(worker[2:])::_WORKERS]:
            build()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_FORMS_FOLDER, ignore_errors=True)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)
