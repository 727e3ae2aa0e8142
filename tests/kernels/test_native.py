"""Where the C++ kernels are built, and what a build killed midway leaves for the next process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from posenc.kernels import native, rope_cpu


def _turn_taken(directory: Path) -> bool | None:
    """Whether a process holds ``directory``'s build turn (None where there is no fcntl)."""
    if native.fcntl is None:
        return None
    with open(directory / native.TURN_FILE, "a") as probe:
        try:
            native.fcntl.flock(probe, native.fcntl.LOCK_EX | native.fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def turn_beside_a_live_build(directory: Path, inside=lambda: None) -> None:
    """Take ``directory``'s build turn while a live build's fresh lock is there, which that build removes 0.2 s
    later: nothing may be removed or said, and the lock is gone within the turn, where ``inside()`` runs too."""
    lock = lock_aged(directory, 0)

    def finish_build():
        time.sleep(0.2)
        lock.unlink()

    builder = threading.Thread(target=finish_build)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        builder.start()
        with native.build_turn(directory, poll_s=0.01):
            assert not lock.exists()
            inside()
    builder.join()


def notices_while(wait, release) -> list[str]:
    """The warnings ``wait()`` gives while another process's work goes on, which ``release()`` ends once the first
    warning is said (however slow the machine) and twenty more polls of 0.01 s have passed (a notice said at each
    would show)."""
    def finish_once_said(said):
        deadline = time.monotonic() + 30
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        release()

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        other = threading.Thread(target=finish_once_said, args=(said,))
        other.start()
        wait()
    other.join()
    return [str(w.message) for w in said]


def lock_aged(directory: Path, age_s: float) -> Path:
    lock = directory / "lock"
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_a_lock_left_by_a_killed_build_is_removed_with_a_warning(tmp_path):
    lock = lock_aged(tmp_path, native.STALE_LOCK_S + 5)
    (tmp_path / "build.ninja").write_text("kept")
    with pytest.warns(UserWarning, match=r"removed a build lock 60[0-9] s old, left by a build that was killed"):
        native.wait_for_build_lock(tmp_path)
    assert not lock.exists() and (tmp_path / "build.ninja").read_text() == "kept"


def test_a_live_builds_lock_is_waited_for_not_removed(tmp_path):
    """A lock younger than the limit belongs to a build still running: wait until that build removes it."""
    lock = lock_aged(tmp_path, native.STALE_LOCK_S - 30)
    removed_at = []

    def finish_build():
        time.sleep(0.3)
        removed_at.append(time.monotonic())
        lock.unlink()

    builder = threading.Thread(target=finish_build)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        builder.start()
        native.wait_for_build_lock(tmp_path, poll_s=0.01)
        returned_at = time.monotonic()
    builder.join()
    assert removed_at and returned_at >= removed_at[0]


def test_a_long_wait_is_said_once_naming_the_lock_and_how_to_end_it(tmp_path):
    """A process killed while torch loaded a finished build leaves a lock as fresh as a live build's: a wait past
    the notice says so, once, rather than hang silently for up to ten minutes."""
    lock = lock_aged(tmp_path, 0)
    said = notices_while(lambda: native.wait_for_build_lock(tmp_path, poll_s=0.01, notice_after_s=0.05), lock.unlink)
    assert said == [
        f"posenc: waiting for another process's build to remove {lock}; if no other process is building (one was "
        f"killed), delete the lock, or it is removed once {native.STALE_LOCK_S:.0f} s old"]


def test_no_lock_returns_at_once(tmp_path):
    started = time.monotonic()
    native.wait_for_build_lock(tmp_path, stale_after_s=0.0, poll_s=10.0)
    assert time.monotonic() - started < 1.0


BUILD_IN_A_TURN = """
import pathlib, sys, time
from posenc.kernels import native
folder = pathlib.Path(sys.argv[1])
with native.build_turn(folder):
    (folder / "lock").touch()  # as torch's build does, inside the turn
    print("building", flush=True)
    time.sleep(120)
"""


@pytest.mark.skipif(native.fcntl is None, reason="no fcntl (Windows): the age rule alone")
def test_a_lock_left_by_a_process_killed_in_its_turn_is_removed_at_once(tmp_path, monkeypatch):
    """The OS frees a killed process's flock, and its id stays in the turn file: the next process takes the turn,
    finds that process gone, and removes its lock however fresh (the age rule would wait ten minutes)."""
    builder = subprocess.Popen([sys.executable, "-c", BUILD_IN_A_TURN, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert builder.stdout.readline() == b"building\n" and (tmp_path / "lock").exists()
        assert _turn_taken(tmp_path)
    finally:
        builder.kill()
        builder.wait()
        builder.stdout.close()
    started = time.monotonic()
    killed = f"^posenc: removed a build lock left by process {builder.pid}, which was killed: "
    with pytest.warns(UserWarning, match=killed):
        with native.build_turn(tmp_path, poll_s=0.01):
            assert not (tmp_path / "lock").exists()
            assert (tmp_path / native.TURN_FILE).read_text() == f"{socket.gethostname()} {os.getpid()}"
    assert time.monotonic() - started < 60 and (tmp_path / native.TURN_FILE).read_text() == ""
    assert not native._runs(builder.pid) and native._runs(os.getpid())

    def another_users(pid, signal):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(native.os, "kill", another_users)
    assert native._runs(builder.pid)  # a process of another user's runs: its lock is not a dead one's


@pytest.mark.skipif(native.fcntl is None, reason="no fcntl (Windows): the age rule alone")
@pytest.mark.parametrize("owner", ["none", "this process", "another host"])  # ids alike in every xdist worker
def test_a_lock_of_no_killed_turn_of_this_host_is_left_to_the_age_rule(tmp_path, owner):
    """An older posenc builds without a turn, a process of another host may share the cache, and a process still
    running is no dead one's: their fresh lock is waited for, not removed."""
    recorded = {"none": "", "this process": f"{socket.gethostname()} {os.getpid()}", "another host": "elsewhere 12345"}
    (tmp_path / native.TURN_FILE).write_text(recorded[owner])
    turn_beside_a_live_build(tmp_path)


@pytest.mark.skipif(native.fcntl is None, reason="no fcntl (Windows): the age rule alone")
def test_a_live_process_turn_is_waited_for_and_its_lock_left_to_it(tmp_path):
    """Another process building holds the turn and its lock; it removes the lock and ends its turn, then this one
    takes it, finding nothing to remove. A flock on a second opening of the file stands in for the other process:
    Linux and macOS refuse it to the first opening, in one process as across two."""
    other = open(tmp_path / native.TURN_FILE, "a")
    native.fcntl.flock(other, native.fcntl.LOCK_EX)
    lock = lock_aged(tmp_path, 0)
    finished_at = []

    def finish_build():
        time.sleep(0.3)
        lock.unlink()
        finished_at.append(time.monotonic())
        other.close()  # ends its turn

    builder = threading.Thread(target=finish_build)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing removed, no notice (the wait is short)
        builder.start()
        with native.build_turn(tmp_path, poll_s=0.01):
            turn_at = time.monotonic()
    builder.join()
    assert finished_at and turn_at >= finished_at[0]


@pytest.mark.skipif(native.fcntl is None, reason="no fcntl (Windows): the age rule alone")
def test_a_long_wait_for_the_turn_is_said_once(tmp_path):
    other = open(tmp_path / native.TURN_FILE, "a")
    native.fcntl.flock(other, native.fcntl.LOCK_EX)

    def take_the_turn():
        with native.build_turn(tmp_path, poll_s=0.01, notice_after_s=0.05):
            pass

    said = notices_while(take_the_turn, other.close)
    assert said == [f"posenc: waiting for another process to build or load {tmp_path.name}"]


def test_without_fcntl_the_turn_is_the_age_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "fcntl", None)
    stale = lock_aged(tmp_path, native.STALE_LOCK_S + 5)
    with pytest.warns(UserWarning, match=r"removed a build lock 60[0-9] s old"):
        with native.build_turn(tmp_path):
            assert not stale.exists()
    assert not (tmp_path / native.TURN_FILE).exists()  # no turn file where no flock can be taken


@pytest.mark.skipif(native.fcntl is None, reason="no fcntl (Windows): the age rule alone")
def test_a_filesystem_that_refuses_flocks_falls_back_to_the_age_rule(tmp_path, monkeypatch):
    """Some network filesystems answer flock with ENOLCK: the kernels still build, under the age rule."""
    def refused(turn, operation):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(native.fcntl, "flock", refused)
    (tmp_path / native.TURN_FILE).write_text("")

    def no_one_recorded():  # no turn held: no process recorded as in it
        assert (tmp_path / native.TURN_FILE).read_text() == ""

    turn_beside_a_live_build(tmp_path, inside=no_one_recorded)


def test_a_turn_file_that_cannot_be_opened_falls_back_to_the_age_rule(tmp_path, monkeypatch):
    """In a shared cache the turn file may be another user's: the kernels still build, under the age rule."""
    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(native, "open", refused, raising=False)
    stale = lock_aged(tmp_path, native.STALE_LOCK_S + 5)
    with pytest.warns(UserWarning, match=r"removed a build lock 60[0-9] s old"):
        with native.build_turn(tmp_path):
            assert not stale.exists()


def test_load_builds_in_its_own_named_folder_once_a_stale_lock_is_gone(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("POSENC_CPU_KERNELS", "1")
    name = rope_cpu.build_name(rope_cpu.SOURCE.read_bytes())
    (tmp_path / name).mkdir()
    lock = lock_aged(tmp_path / name, 3600)
    calls = []

    def fake_build(**kwargs):
        calls.append((kwargs, lock.exists(), _turn_taken(tmp_path / name)))
        return "built"

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_build)
    with pytest.warns(UserWarning, match="removed a build lock 3600 s old"):  # no turn of its: the age rule
        assert native.load(rope_cpu.PREFIX, rope_cpu.SOURCE, "RoPE's C++ CPU kernel") == "built"
    (kwargs, lock_present, turn_taken), = calls
    assert not lock_present and turn_taken in (True, None)  # built within its turn (None: no fcntl here)
    assert _turn_taken(tmp_path / name) in (False, None)  # and the turn ended with the build
    assert kwargs["name"] == name and kwargs["build_directory"] == str(tmp_path / name)
    assert kwargs["sources"] == [str(tmp_path / name / "rope_cpu.cpp")]  # the copy beside the build, not the checkout's
    assert kwargs["extra_include_paths"] == [str(tmp_path / name)]


def test_the_build_compiles_a_copy_written_only_where_it_is_missing_or_differs(tmp_path):
    """A second checkout of the same source must find the build current: ninja rebuilds on a new path or date."""
    staged = native.staged_source(rope_cpu.SOURCE, tmp_path)
    assert staged == tmp_path / "rope_cpu.cpp" and staged.read_bytes() == rope_cpu.SOURCE.read_bytes()
    headers = sorted(path.name for path in native.HEADERS.glob("*.h"))
    assert "cpu_tiles.h" in headers and sorted(path.name for path in tmp_path.glob("*.h")) == headers
    assert b"".join((tmp_path / name).read_bytes() for name in headers) == native.headers()
    os.utime(staged, (1_000_000, 1_000_000))
    (tmp_path / "cpu_tiles.h").write_text("// an older header")
    native.staged_source(rope_cpu.SOURCE, tmp_path)
    assert staged.stat().st_mtime == 1_000_000, "an unchanged copy must keep its date"
    assert (tmp_path / "cpu_tiles.h").read_bytes() == (native.HEADERS / "cpu_tiles.h").read_bytes()
    assert not list(tmp_path.glob(".*partial"))


def test_the_name_carries_the_environment_whose_headers_it_was_built_with():
    source = rope_cpu.SOURCE.read_bytes()
    assert native.build_name("p", source, includes="/a/torch/include") != native.build_name("p", source,
                                                                                           includes="/b/torch/include")
    assert native.build_name("p", source) == native.build_name("p", source, includes=native.include_folders())
    assert "torch" in native.include_folders() and "python" in native.include_folders().lower()


def test_an_unwritable_cache_means_the_pytorch_form(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(blocker))
    monkeypatch.setenv("POSENC_CPU_KERNELS", "1")
    with pytest.warns(UserWarning, match="RoPE's C\\+\\+ CPU kernel could not be built, using the PyTorch form"):
        assert native.load(rope_cpu.PREFIX, rope_cpu.SOURCE, "RoPE's C++ CPU kernel") is None


def test_the_name_carries_the_python_it_was_built_for():
    source = rope_cpu.SOURCE.read_bytes()
    names = {native.build_name("p", source, python=python) for python in ("3.11", "3.12", "3.13t")}
    assert len(names) == 3
    assert native.build_name("p", source) == native.build_name("p", source, python=native.python_abi())
    assert native.python_abi().startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
