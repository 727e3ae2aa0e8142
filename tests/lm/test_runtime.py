"""What a results file names to be reproduced: the commit (marked when tracked files differ from it, absent
outside a checkout), the versions and the CPU, and the sentence reports end with."""

import platform
import subprocess

import pytest
import torch

from posenc import __version__
from posenc.lm import runtime


def git(folder, *args):
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)


def test_the_commit_of_a_checkout_is_named_and_a_modified_one_is_marked(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert runtime.git_commit(tmp_path) == head and len(head) == 40
    (tmp_path / "untracked.txt").write_text("not part of the code\n")
    assert runtime.git_commit(tmp_path) == head  # untracked files are not the code
    (tmp_path / "a.py").write_text("x = 2\n")
    assert runtime.git_commit(tmp_path) == head + "+modified"


def test_outside_a_checkout_there_is_no_commit(tmp_path, monkeypatch):
    monkeypatch.delenv(runtime.COMMIT_VARIABLE, raising=False)
    assert runtime.git_commit(tmp_path) is None


def test_a_commit_vouched_for_by_the_caller_wins_over_the_checkouts(tmp_path, monkeypatch):
    """A lent GPU machine gets the working tree beside an older commit's git metadata: gpu.sh's caller names it."""
    monkeypatch.setenv(runtime.COMMIT_VARIABLE, "89cadbdbf669ae9189723b121f6d4d10f9f566ff")
    assert runtime.git_commit(tmp_path) == "89cadbdbf669ae9189723b121f6d4d10f9f566ff"


@pytest.fixture
def fresh_provenance():
    """provenance() as at a process's start, and forgotten after the test (it is read once per process)."""
    runtime.provenance.cache_clear()
    yield
    runtime.provenance.cache_clear()


def test_provenance_names_versions_commit_and_cpu(monkeypatch, fresh_provenance):
    monkeypatch.setattr(runtime, "git_commit", lambda: "0123456789abcdef0123456789abcdef01234567+modified")
    monkeypatch.setattr(runtime, "cpu_model", lambda: "AMD EPYC 9B14")
    facts = runtime.provenance()
    assert {key: facts[key] for key in ("posenc", "torch", "python", "commit", "cpu")} == {
        "posenc": __version__, "torch": torch.__version__, "python": platform.python_version(),
        "commit": "0123456789abcdef0123456789abcdef01234567+modified", "cpu": "AMD EPYC 9B14"}
    assert runtime.provenance_line({**facts, "posenc": "0.9", "torch": "2.13.0", "python": "3.11.2"}) == (
        "posenc 0.9 (commit 0123456789ab+modified), torch 2.13.0, Python 3.11.2, CPU AMD EPYC 9B14.")
    assert runtime.provenance_line({**facts, "commit": None}).startswith(f"posenc {__version__}, torch")


def test_a_run_names_the_commit_it_started_from_not_the_one_it_ended_at(monkeypatch, fresh_provenance):
    """The CLI reads provenance before the work: a commit made while a long run goes on does not relabel it."""
    from posenc.cli import main

    monkeypatch.setattr(runtime, "git_commit", lambda: "a" * 40)
    assert main(["report", "--check", "no-such-file.md"]) == 2  # refused, but after provenance was read
    monkeypatch.setattr(runtime, "git_commit", lambda: "b" * 40)  # committed while the run went on
    assert runtime.provenance()["commit"] == "a" * 40


def test_provenance_names_the_libraries_and_the_gpu(fresh_provenance):
    """Every results file names transformers', gguf's, peft's… versions where installed (None where not) and the
    GPU (None without one), beside torch, Python, the commit and the CPU."""
    import importlib.metadata

    facts = runtime.provenance()
    assert set(facts) == {"posenc", "torch", "python", "commit", "cpu", "gpu", "libraries"}
    assert facts["libraries"]["transformers"] == importlib.metadata.version("transformers")
    assert set(facts["libraries"]) == set(runtime.LIBRARIES)
    assert facts["gpu"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    assert runtime._installed_version("no-such-package-posenc") is None
