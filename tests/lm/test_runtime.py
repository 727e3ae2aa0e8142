"""What a results file names to be reproduced: the commit (marked when tracked files differ from it, absent
outside a checkout), the versions and the CPU, and the sentence reports end with."""

import os
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


@pytest.fixture
def machine(monkeypatch):
    """``machine(gpus, env, grouped)``: torch.cuda and the process group as on a machine with ``gpus`` GPUs (none
    here), with torchrun's ``env`` set; returns the list their calls are recorded in."""
    calls = []

    def make(gpus: int, env: dict | None = None, grouped: bool = False) -> list:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: calls.append(("name", device)) or "H200")
        monkeypatch.setattr(runtime.dist, "is_initialized", lambda: grouped)
        monkeypatch.setattr(runtime.dist, "init_process_group",
                            lambda backend=None, timeout=None: calls.append(("group", backend, timeout)))
        monkeypatch.setattr(runtime.dist, "barrier", lambda: calls.append(("barrier",)))
        for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
            monkeypatch.delenv(name, raising=False)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        return calls

    return make


def test_one_process_without_a_gpu_runs_on_the_cpu_in_float32(machine):
    calls = machine(gpus=0)
    found = runtime.Runtime.detect("auto")
    assert found == runtime.Runtime(torch.device("cpu"), None, 0, 1, f"cpu ({os.cpu_count()} cores)")
    assert runtime.Runtime.detect("cpu") == found
    found.barrier()
    assert calls == []  # no GPU touched, no group, no barrier
    with pytest.raises(ValueError) as refusal:
        runtime.Runtime.detect("cuda")
    assert str(refusal.value) == "--device cuda: no CUDA device is available here; use --device cpu or auto"


@pytest.mark.parametrize("requested", ["auto", "cuda"])
def test_a_torchrun_rank_takes_its_local_gpu_in_bf16_and_joins_an_nccl_group(machine, requested):
    calls = machine(gpus=2, env={"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    found = runtime.Runtime.detect(requested)
    gpu = torch.device("cuda", 1)
    assert found == runtime.Runtime(gpu, torch.bfloat16, 3, 4, "H200")
    assert calls == [("set_device", gpu), ("group", "nccl", runtime.GROUP_TIMEOUT), ("name", gpu)]
    found.barrier()
    assert calls[-1] == ("barrier",)


def test_cpu_asked_for_on_a_gpu_machine_takes_the_cpu_and_a_gloo_group(machine):
    calls = machine(gpus=1, env={"WORLD_SIZE": "2", "RANK": "1"})
    found = runtime.Runtime.detect("cpu")
    assert (found.device, found.autocast_dtype, found.rank, found.world_size) == (torch.device("cpu"), None, 1, 2)
    assert calls == [("group", "gloo", runtime.GROUP_TIMEOUT)]
    found.barrier()
    assert calls[-1] == ("barrier",)


def test_a_group_already_made_is_joined_not_made_again(machine):
    calls = machine(gpus=1, env={"WORLD_SIZE": "2", "RANK": "0"}, grouped=True)
    found = runtime.Runtime.detect("auto")
    assert (found.device, found.world_size) == (torch.device("cuda", 0), 2)
    assert ("group", "nccl", runtime.GROUP_TIMEOUT) not in calls


def test_the_cpus_name_is_read_from_cpuinfo_whole_else_from_platform(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_bytes(b"processor\t: 0\nvendor_id\t: Authentic\xffAMD\nmodel name\t: AMD EPYC 9B14: rev 2 \n"
                        b"model name\t: a second core\n")
    assert runtime.cpu_model(cpuinfo) == "AMD EPYC 9B14: rev 2"  # a byte that is not UTF-8 elsewhere is no matter
    missing = tmp_path / "none"
    monkeypatch.setattr(platform, "processor", lambda: "Intel64 Family 6")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert runtime.cpu_model(missing) == "Intel64 Family 6"
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert runtime.cpu_model(missing) == "x86_64"
    monkeypatch.setattr(platform, "machine", lambda: "")
    assert runtime.cpu_model(missing) == "unknown CPU"


def test_an_unmodified_commit_is_named_without_a_mark():
    facts = {"posenc": "0.9", "torch": "2.13.0", "python": "3.11.2", "cpu": "AMD EPYC 9B14", "commit": "c" * 40}
    assert runtime.provenance_line(facts) == (
        "posenc 0.9 (commit cccccccccccc), torch 2.13.0, Python 3.11.2, CPU AMD EPYC 9B14.")


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_every_rank_follows_rank_zeros_choice_sent_in_float64_from_where_its_backend_sends(monkeypatch, backend):
    """One process keeps its own value; in a group, the value rank 0 sends (the group's broadcast stood in for),
    as float64 from the CPU for gloo and from the rank's GPU for NCCL (made on the CPU here: no GPU)."""
    made, sent, tensor = [], [], torch.tensor

    def make(values, dtype, device):
        made.append((values, dtype, str(device)))
        return tensor(values, dtype=dtype)

    def broadcast(value, src):
        sent.append(src)
        value.fill_(0.7)  # rank 0's value arrives

    monkeypatch.setattr(runtime.dist, "get_backend", lambda: backend)
    monkeypatch.setattr(runtime.dist, "broadcast", broadcast)
    monkeypatch.setattr(torch, "tensor", make)
    here = torch.device("cuda", 1)  # a rank on its GPU, in a group of either backend
    assert runtime.Runtime(here, None, 1, 1).broadcast_float(0.3) == 0.3 and made == sent == []
    assert runtime.Runtime(here, None, 1, 2).broadcast_float(0.3) == 0.7
    assert made == [([0.3], torch.float64, "cpu" if backend == "gloo" else "cuda:1")] and sent == [0]
