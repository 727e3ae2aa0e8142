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

# `make mutate` forks one process per mutant from this one. tqdm's default write lock is shared with forked
# children (a multiprocessing lock) and its monitor thread takes the thread lock every few seconds: a child forked
# while either is held waits on it forever, and the mutant reads as a timeout. A plain lock and no monitor here.
tqdm.tqdm.set_lock(threading.RLock())
tqdm.tqdm.monitor_interval = 0


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_FORMS_FOLDER, ignore_errors=True)


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)
