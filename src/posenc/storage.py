"""Files written atomically (temp file in the same folder + rename) and read safely.

A run killed at any instant leaves either the old file or the new one, never half
of one. Checkpoints are read with ``torch.load(weights_only=True)`` (no unpickling
of arbitrary objects); final weights are safetensors.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(temp_path)``, then rename the temp file over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(temp)
        os.chmod(temp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    return path


def writable(flag: str, path: str | os.PathLike | None) -> None:
    """The folder of the output file ``flag`` names, made now, before the work whose results it will hold: a
    ValueError naming the flag where the file cannot be written there (a file in the way, no permission) or where
    ``path`` is a folder."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag}: {path} is a folder; name a file in it")
    output_folder(flag, path.parent, path)


def output_folder(flag: str, folder: str | os.PathLike, wanted: str | os.PathLike | None = None) -> Path:
    """``folder`` (that ``flag`` names, or that holds the file ``wanted``), made if missing: a ValueError naming the
    flag where it cannot be."""
    folder = check_folder(flag, folder, wanted)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{flag}: cannot write {wanted or folder} ({error.strerror or error})") from None
    return folder


def check_folder(flag: str, folder: str | os.PathLike, wanted: str | os.PathLike | None = None) -> Path:
    """``folder``, unmade: a ValueError naming ``flag`` where a file (or a link to nothing) stands at it or at one of
    its parents, so that a run refuses it before any work rather than when it first writes."""
    folder = Path(folder)
    blocker = next((p for p in (folder, *folder.parents) if (p.exists() or p.is_symlink()) and not p.is_dir()), None)
    if blocker is not None:
        raise ValueError(f"{flag}: cannot write {wanted or folder}: {blocker} is not a folder")
    existing = next(p for p in (folder, *folder.parents, Path.cwd()) if p.is_dir())
    try:  # a file made and removed where the first write will go: permissions, a read-only or special file system
        handle, probe = tempfile.mkstemp(dir=existing, prefix=".posenc-probe-")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise ValueError(f"{flag}: cannot write {wanted or folder}: {existing} refuses new files "
                         f"({error.strerror or error})") from None
    return folder


def write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda temp: Path(temp).write_text(text))


def write_json(path: str | os.PathLike, data) -> Path:
    return write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike):
    """A JSON file's value; a ValueError naming the file where it is not JSON (cut short, or edited by hand)."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}): it was cut short or edited by hand") from None


def save_checkpoint(path: str | os.PathLike, state: dict) -> Path:
    """A resumable training state (tensors, numbers, strings, nested dicts/lists)."""
    return atomic_write(path, lambda temp: torch.save(state, temp))


def _damaged(path: str | os.PathLike, error: Exception) -> ValueError:
    return ValueError(f"{path} is damaged or truncated ({type(error).__name__}: {error}); delete it and run "
                      "again with --resume: the stage that wrote it is redone")


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict:
    """A state written by save_checkpoint; tensors only, never arbitrary pickled objects."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as error:
        raise _damaged(path, error) from None


def save_weights(path: str | os.PathLike, state_dict: dict) -> Path:
    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in state_dict.items()}
    return atomic_write(path, lambda temp: save_file(tensors, temp))


def load_weights(path: str | os.PathLike) -> dict:
    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise
    except (SafetensorError, OSError, ValueError) as error:
        raise _damaged(path, error) from None


def installed_file(package: str, relative: str, missing: str) -> Path:
    """A data file shipped inside an installed package, found through its metadata (without importing it);
    ``missing``: the ValueError's message when the package or the file is not there."""
    try:
        path = Path(importlib.metadata.distribution(package).locate_file(relative))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.exists():
        raise ValueError(missing)
    return path


@functools.cache
def file_sha256(path: Path) -> str:
    """The sha256 of a file, read once per process."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
