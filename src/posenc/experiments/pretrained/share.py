"""Which measurements of ``pretrained`` a process makes: one file per measurement, split between ``torchrun``'s
ranks, each written atomically so a killed run resumed with ``--resume`` loses no finished one."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ... import storage


class Share:
    """Which measurements this process makes: every process walks the same keys in the same order and takes every
    ``world_size``-th, from its ``rank`` on (one process takes them all)."""

    def __init__(self, rank: int = 0, world_size: int = 1):
        self.rank, self.world_size, self.seen, self.made = rank, world_size, 0, 0

    def measured(self, path: Path, measure: Callable[[], dict | list]) -> dict | list | None:
        """The measurement filed at ``path`` (made by ``measure`` and written atomically first, if not there yet),
        or None where it is another process's share."""
        mine = self.seen % self.world_size == self.rank
        self.seen += 1
        if not mine:
            return None
        if path.exists():
            return storage.read_json(path)
        self.made += 1
        record = measure()
        storage.write_json(path, record)
        return record
