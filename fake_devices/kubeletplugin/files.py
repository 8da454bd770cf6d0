"""Crash-safe file updates: a reader (the CDI cache of a container runtime, a restarted plugin) sees
the old content or the new one, never a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write to a temporary file in the same directory, fsync it, rename it over `path`, fsync the
    directory. The temporary name starts with a dot and ends in .tmp, so CDI caches ignore it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def remove(path: Path) -> bool:
    """Delete `path` durably; True if it existed. A missing file is not an error (idempotent)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(Path(path).parent)
    return True


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
