"""The record of what is in a binary cache directory, and its verification.

`manifest.json` holds, per group (kubernetes, etcd, kwok), the version, the source and the SHA-256
and size of every file. A file whose hash does not match is deleted and its group provided again:
a corrupt or partial binary is never used. Files are only ever moved into place whole (see
`install_file`), and the manifest is written after them, so an interrupted install leaves a group
that simply fails verification.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from harness.core.locking import file_lock

MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Serialise installs into one cache directory (parallel pytest workers, two terminals)."""
    directory.mkdir(parents=True, exist_ok=True)
    with file_lock(directory / ".lock"):
        yield


def load(directory: Path) -> dict:
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"groups": {}}
    return data if isinstance(data, dict) and isinstance(data.get("groups"), dict) else {"groups": {}}


def group_ok(directory: Path, recorded: dict, group: str, version: str) -> bool:
    """True when every file of the group is present with its recorded size and SHA-256."""
    entry = recorded["groups"].get(group)
    if not isinstance(entry, dict) or entry.get("version") != version or not isinstance(entry.get("files"), dict) \
            or not entry["files"]:
        return False  # missing, another version, or a hand-edited entry we cannot trust
    for name, info in entry["files"].items():
        if not isinstance(info, dict) or not {"size", "sha256"} <= set(info):
            return False
        path = directory / name
        try:
            if path.stat().st_size != info["size"] or sha256_file(path) != info["sha256"]:
                path.unlink(missing_ok=True)  # never leave a corrupt binary where it could be used
                return False
        except OSError:
            return False
    return True


def record(directory: Path, recorded: dict, group: str, version: str, names: tuple[str, ...],
           source: str) -> dict:
    files = {}
    for name in names:
        path = directory / name
        files[name] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    recorded = {"groups": dict(recorded["groups"])}
    recorded["groups"][group] = {"version": version, "source": source, "files": files,
                                 "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_atomic(directory / MANIFEST, json.dumps(recorded, indent=2, sort_keys=True).encode())
    return recorded


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install_file(source: Path, target: Path) -> None:
    """Copy a finished binary into the cache under a temporary name, then rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix="." + target.name + ".")
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                out.write(chunk)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
