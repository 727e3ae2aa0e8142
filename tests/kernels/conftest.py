"""Fixtures of the kernel tests: an empty forms cache, and a clock the timed contenders drive."""

import pytest

from posenc.kernels import dispatch


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache file and no choice made yet in this process."""
    path = tmp_path / "forms.json"
    monkeypatch.setenv(dispatch.CACHE_VARIABLE, str(path))
    monkeypatch.delenv(dispatch.FORCE_VARIABLE, raising=False)
    monkeypatch.setattr(dispatch, "_chosen", {})
    return path


@pytest.fixture
def clock(monkeypatch):
    """time.perf_counter driven by the contenders, so the fastest is known."""
    state = {"now": 0.0}
    monkeypatch.setattr(dispatch.time, "perf_counter", lambda: state["now"])
    return state
