"""Writes are atomic (a write that dies midway, even by SIGKILL, leaves the old file whole), shared-readable, and
checkpoints never unpickle arbitrary objects."""

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from posenc import storage


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temp(tmp_path):
    path = storage.write_text(tmp_path / "results.json", '{"old": 1}\n')

    def half_then_fail(temp):
        Path(temp).write_text('{"new": ')
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        storage.atomic_write(path, half_then_fail)
    assert path.read_text() == '{"old": 1}\n' and list(tmp_path.iterdir()) == [path]
    assert os.stat(path).st_mode & 0o777 == 0o644  # shared like any result, not mkstemp's 0600


def test_a_write_killed_midway_leaves_the_old_file_whole(tmp_path):
    path = storage.write_text(tmp_path / "results.json", "old\n")
    started = tmp_path / "started"
    script = (f"import time; from pathlib import Path; from posenc import storage\n"
              f"def slow(temp):\n"
              f"    Path(temp).write_text('half of the new')\n"
              f"    Path({str(started)!r}).touch()\n"
              f"    time.sleep(60)\n"
              f"storage.atomic_write({str(path)!r}, slow)\n")
    process = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while not started.exists() and time.time() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert started.exists() and path.read_text() == "old\n"


def test_checkpoints_refuse_pickled_objects(tmp_path):
    path = tmp_path / "last.pt"
    path.write_bytes(pickle.dumps({"step": 3, "hook": print}))  # an arbitrary object to call on load
    with pytest.raises(ValueError, match="damaged or truncated"):
        storage.load_checkpoint(path)
    storage.save_checkpoint(path, {"step": 3, "weights": torch.ones(2)})
    assert storage.load_checkpoint(path)["step"] == 3


def test_the_temp_file_sits_beside_the_target_so_the_rename_stays_on_one_filesystem(tmp_path):
    seen = []
    path = tmp_path / "deep" / "er" / "results.json"  # folders made on the way
    storage.atomic_write(path, lambda temp: (seen.append(Path(temp)), Path(temp).write_text("x")))
    temp = seen[0]
    assert temp.parent == path.parent and temp.name.startswith(".results.json.") and temp.name.endswith(".tmp")
    assert path.read_text() == "x"


def test_json_is_written_indented_in_the_callers_key_order():
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = storage.write_json(Path(folder) / "r.json", {"b": 1, "a": [1, 2]})
        assert path.read_text() == json.dumps({"b": 1, "a": [1, 2]}, indent=2) + "\n"
        assert storage.read_json(path) == {"b": 1, "a": [1, 2]}


def test_a_damaged_checkpoint_names_its_path_and_the_error(tmp_path):
    path = tmp_path / "last.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError) as raised:
        storage.load_checkpoint(path)
    message = str(raised.value)
    assert str(path) in message and "Error" in message.split("(")[1] and "--resume" in message


def test_checkpoints_saved_with_an_arbitrary_object_are_refused_not_run(tmp_path):
    """torch.save pickles what it is given; loading that with weights_only=False would import and keep it."""
    path = tmp_path / "last.pt"
    torch.save({"step": 3, "hook": print}, path)
    with pytest.raises(ValueError, match="damaged or truncated .*UnpicklingError"):
        storage.load_checkpoint(path)


def test_checkpoints_load_onto_the_device_asked_for(tmp_path):
    path = storage.save_checkpoint(tmp_path / "last.pt", {"weights": torch.ones(2)})
    assert storage.load_checkpoint(path, device="meta")["weights"].device.type == "meta"


def test_the_damaged_message_says_what_to_do(tmp_path):
    path = tmp_path / "last.pt"
    path.write_bytes(b"x")
    with pytest.raises(ValueError) as raised:
        storage.load_checkpoint(path)
    assert str(raised.value).endswith("; delete it and run again with --resume: the stage that wrote it is redone")


def test_weights_round_trip_detached_contiguous_on_the_cpu(tmp_path):
    weight = torch.arange(6.0).reshape(2, 3).t().requires_grad_()  # a transposed view: not contiguous
    path = storage.save_weights(tmp_path / "w" / "model.safetensors", {"w": weight, "b": torch.ones(2)})
    loaded = storage.load_weights(path)
    assert set(loaded) == {"w", "b"} and torch.equal(loaded["w"], weight.detach()) and not loaded["w"].requires_grad
    path.write_bytes(path.read_bytes()[:20])  # cut short
    with pytest.raises(ValueError) as raised:
        storage.load_weights(path)
    message = str(raised.value)
    assert message.startswith(f"{path} is damaged or truncated (") and "--resume" in message
    assert message.split("(", 1)[1].split(":", 1)[0].endswith("Error")  # the reader's error, named


def test_an_installed_file_is_found_through_its_package_and_a_missing_one_says_so(tmp_path):
    found = storage.installed_file("torch", "torch/__init__.py", "no torch")
    assert found.name == "__init__.py" and found.exists()
    with pytest.raises(ValueError, match="^no such file$"):
        storage.installed_file("torch", "torch/not-a-file.txt", "no such file")
    with pytest.raises(ValueError, match="^no such package$"):
        storage.installed_file("posenc-no-such-package", "x", "no such package")


def test_a_json_file_cut_short_is_named_in_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"steps": 1')
    with pytest.raises(ValueError, match=r"config.json is not valid JSON \(.*\): it was cut short or edited by hand$"):
        storage.read_json(path)


def test_an_output_files_folder_is_made_before_the_work_or_refused_naming_the_flag(tmp_path):
    storage.writable("--json", None)  # no file asked for: nothing to do
    storage.writable("--json", tmp_path / "new" / "deeper" / "rows.json")
    assert (tmp_path / "new" / "deeper").is_dir() and not (tmp_path / "new" / "deeper" / "rows.json").exists()
    (tmp_path / "notes").write_text("a file")
    for target in (tmp_path / "notes" / "rows.json", tmp_path / "notes" / "sub" / "rows.json"):
        with pytest.raises(ValueError) as refusal:
            storage.writable("--json", target)
        assert str(refusal.value) == f"--json: cannot write {target}: {tmp_path / 'notes'} is not a folder"
    with pytest.raises(ValueError) as refusal:
        storage.writable("--markdown", tmp_path / "new")
    assert str(refusal.value) == f"--markdown: {tmp_path / 'new'} is a folder; name a file in it"


def test_a_folder_the_user_may_not_make_is_refused_naming_the_flag_and_why(tmp_path, monkeypatch):
    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refused)  # as a user without write access to tmp_path sees it
    with pytest.raises(ValueError) as refusal:
        storage.writable("--json", tmp_path / "new" / "rows.json")
    assert str(refusal.value) == f"--json: cannot write {tmp_path / 'new' / 'rows.json'} (Permission denied)"


def test_a_folder_that_refuses_new_files_is_refused_before_the_work_naming_the_flag(tmp_path, monkeypatch):
    """A folder that exists but takes no file (no permission, a read-only or special file system) was found only
    by the first write, after the work: ``verify --json`` ran every check, then lost them."""
    made = []

    def refused(dir, prefix):
        made.append(Path(dir))
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refused)  # as a user without write access to tmp_path sees it
    with pytest.raises(ValueError) as refusal:
        storage.check_folder("--out", tmp_path / "run" / "deeper")
    assert str(refusal.value) == (f"--out: cannot write {tmp_path / 'run' / 'deeper'}: {tmp_path} refuses new files "
                                  f"(Permission denied)")
    assert made == [tmp_path] and not (tmp_path / "run").exists()  # probed where the run would be made, made nothing
    monkeypatch.undo()
    assert storage.check_folder("--out", tmp_path / "run") == tmp_path / "run"
    assert list(tmp_path.iterdir()) == []  # the probe leaves no file behind


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, which takes no new file")
def test_verify_refuses_a_json_path_it_could_not_write_before_running_a_check(capsys, monkeypatch):
    from posenc import verify
    from posenc.cli import main
    monkeypatch.setattr(verify, "run_checks", lambda *args: pytest.fail("the checks ran"))
    assert main(["verify", "--device", "cpu", "--json", "/proc/posenc/verify.json"]) == 2
    assert "--json: cannot write /proc/posenc/verify.json: /proc refuses new files" in capsys.readouterr().err
