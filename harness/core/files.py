"""Files the harness writes and reads back: atomic writes (a reader, or a run killed half-way, sees the old
content or the new, never a part) and the tail of a log."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str, mode: int | None = None) -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path` (atomic on one filesystem)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        if mode is not None:
            os.chmod(tmp, mode)
        tmp.replace(path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)  # a full disk leaves the old file whole and no half-written one
        if isinstance(err, OSError) and err.filename is None:  # a failed write() names no file: name it
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    return path


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a (log) file, read from its last 64 KiB; "" when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            return "\n".join(handle.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def lines_naming(path: Path, word: str, lines: int = 40, scan_bytes: int = 16 << 20) -> str:
    """The last `lines` lines of a (log) file that contain `word` (a test's namespace), read from its
    last `scan_bytes`; "" when there are none or it cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - scan_bytes))
            found = [line for line in handle.read().decode(errors="replace").splitlines() if word in line]
    except OSError:
        return ""
    return "\n".join(line[:2000] for line in found[-lines:])
