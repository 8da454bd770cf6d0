"""Room on disk, judged before work starts, and said plainly when a disk fills anyway.

A local cluster's etcd preallocates its write-ahead log (64 MiB a segment): measured, a fresh cluster
directory takes 123 MiB before any test runs. On a full filesystem etcd used to die with a Go panic
whose tail never said why; now `up` refuses first, naming the directory and the space it has.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from harness.core import paths
from harness.core.errors import HarnessError

NO_SPACE = "no space left on device"
# What a full or read-only place raises while writing: said as a located error, not a traceback.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def _existing(directory: Path) -> Path:
    """`directory`, or the nearest ancestor that exists (what it would be created in)."""
    existing = directory
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    return existing


def free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(_existing(directory)).free
    except OSError:
        return None


def require_room(directory: Path, needed: int, what: str, hint: str) -> None:
    """HarnessError unless `directory` (or where it would be made) is writable with `needed` bytes free."""
    existing = _existing(directory)
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only or not os.access(existing, os.W_OK | os.X_OK):
        why = "a read-only file system" if read_only else "not writable by this user"
        raise HarnessError(f"{what} {directory}: {existing} is {why}", hint=hint)
    free = free_bytes(directory)
    if free is not None and free < needed:
        raise HarnessError(f"{what} {directory}: {free >> 20} MiB free on its filesystem, needs about "
                           f"{needed >> 20} MiB", hint=hint)


def explain_no_space(log_text: str, directory: Path) -> str:
    """' (the filesystem of DIR is full: N MiB free)' when a component's log says the disk filled, else ''."""
    if NO_SPACE not in log_text.lower():
        return ""
    free = free_bytes(directory)
    return f" (the filesystem of {directory} is full: {'?' if free is None else free >> 20} MiB free)"


def write_error(err: OSError, writing: Path | None = None) -> HarnessError:
    """A located error for a write that a full or read-only filesystem refused (the file, why, room);
    `writing`: the file meant, when the error names none (a failed write() does not)."""
    where = Path(err.filename) if err.filename else writing
    # write_atomic writes `<file>.tmp` first: name the file meant.
    shown = where.with_name(where.name[:-4]) if where is not None and where.name.endswith(".tmp") else where
    free = free_bytes(where.parent) if where is not None else None
    room = "" if free is None else f" ({free >> 20} MiB free on its filesystem)"
    return HarnessError(f"cannot write {shown or 'a file'}: {err.strerror or err}{room}",
                        hint=f"free some space there, or point the run elsewhere (--report-dir, {paths.STATE_ENV}, "
                             f"{paths.CACHE_ENV})")
