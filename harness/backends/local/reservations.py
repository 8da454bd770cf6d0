"""Machine-wide reservations of what a local cluster picks from a space all clusters share.

Loopback ports and real-node subnets are chosen seconds before anything binds or routes them, and
clusters of different state directories (parallel test workers, two users' terminals) cannot see
each other's state files. So a choice is recorded here, in one file per key (`port-24321`,
`subnet-10.200.5.0_24`) naming the cluster's directory and the process that made it, under a lock, and
everyone else skips it. A reservation holds while its cluster's directory exists or its maker lives.
When a cluster is removed, its reservations are released. One left by a killed `up` (directory gone,
maker dead) or half written is stale, and is ignored and swept.

The directory is per user. One of that name that another user made is not used; then only the
checks of what the machine really has (a bind, its routes) remain.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.backends.local import process
from harness.core.files import write_atomic
from harness.core.locking import file_lock


def directory() -> Path:
    return Path(tempfile.gettempdir()) / f"dra-harness-reservations-{os.getuid()}"


class Book:
    """The reservations, while the lock is held (from `open_book`)."""

    def __init__(self, root: Path | None):
        self.root = root

    def taken(self, key: str) -> bool:
        """Whether another live cluster (or this one) holds `key`."""
        return self.root is not None and _holds(self.root / key)

    def taken_keys(self, prefix: str) -> list[str]:
        """The held keys starting with `prefix`."""
        if self.root is None:
            return []
        return sorted(e.name for e in self.root.iterdir() if e.name.startswith(prefix) and _holds(e))

    def reserve(self, key: str, holder: Path) -> None:
        if self.root is not None:
            write_atomic(self.root / key, json.dumps({"cluster": str(holder), "madeBy": process.identity()}))


@contextlib.contextmanager
def open_book() -> Iterator[Book]:
    """The reservations, locked: checking a key and reserving it is one step. Not reentrant: a
    process holds one `open_book` at a time."""
    root = directory()
    root.mkdir(mode=0o700, exist_ok=True)
    if root.stat().st_uid != os.getuid():
        yield Book(None)
        return
    with file_lock(root / ".lock"):
        yield Book(root)


def _holds(entry: Path) -> bool:
    try:
        data = json.loads(entry.read_text())
        cluster, made_by = Path(data["cluster"]), data["madeBy"]
    except (OSError, ValueError, KeyError, TypeError):  # none, or half-written by a killed process
        return False
    return cluster.is_dir() or process.alive(process.Running("reservation", **process.identity_fields(made_by)))


def release(holder: Path) -> None:
    """Drop the reservations of the cluster at `holder`, and any stale one met on the way."""
    if not directory().is_dir():
        return
    with open_book() as book:
        for entry in book.root.iterdir() if book.root else ():
            if entry.name == ".lock":
                continue
            if entry.name.endswith(".tmp"):  # a write that a killed process left half done
                entry.unlink(missing_ok=True)
                continue
            try:
                mine = json.loads(entry.read_text()).get("cluster") == str(holder)
            except (OSError, ValueError, AttributeError):
                mine = False
            if mine or not _holds(entry):
                entry.unlink(missing_ok=True)
