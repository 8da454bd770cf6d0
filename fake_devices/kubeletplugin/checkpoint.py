"""The plugin's memory of prepared claims, on disk, so a restarted plugin still knows them.

One JSON file per driver in the state directory, `<driver>.checkpoint.json`, replaced atomically on
every change and guarded by a SHA-256 of its claims. Each entry keeps the claim's reference, the
devices returned to the kubelet and the CDI spec written for it, so a restarted plugin answers a
repeated Prepare identically, restores a CDI file that went missing, and Unprepare removes the
right file. A file that is unreadable, fails its checksum or belongs to another driver or node
stops the plugin with the reason: guessing would risk answering the kubelet wrongly.

Two instances of one driver may share the file during an upgrade (rolling update: the kubelet may
prepare a claim through one and unprepare it through the other). So every read first re-reads a
file that another process replaced (compared by inode, size and mtime), and every change is a
read-modify-write under an exclusive flock on `<file>.lock`: no instance overwrites another's entry.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from fake_devices.kubeletplugin import files

KIND = "DRAHarnessKubeletPluginCheckpoint"
VERSION = 1


class CheckpointError(Exception):
    pass


def _checksum(claims: dict) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class Checkpoint:
    def __init__(self, path: Path, driver: str, node: str):
        self.path = Path(path)
        self.driver, self.node = driver, node
        self._lock = threading.RLock()
        self._claims: dict[str, dict] = {}
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime) of the file last read or written

    @classmethod
    def file_for(cls, state_dir: Path, driver: str) -> Path:
        return Path(state_dir) / f"{driver}.checkpoint.json"

    def load(self) -> "Checkpoint":
        with self._lock:
            signature = self._signature()
            self._claims = self._read() if signature is not None else {}
            self._seen = signature
        return self

    def _signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _refresh(self) -> None:
        """Re-read the file if another instance replaced it since we last read or wrote it."""
        if self._signature() != self._seen:
            self.load()

    @contextlib.contextmanager
    def _shared_change(self) -> Iterator[None]:
        """Exclusive across processes (flock) and threads, with the newest file content loaded."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path.with_name(self.path.name + ".lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                self._refresh()
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self) -> dict[str, dict]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {err}") from None
        try:
            data = json.loads(text)
            claims = data["claims"]
            stored = data["checksum"]
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"checkpoint {self.path} is corrupt ({err}); move it away to start "
                                  "without prepared claims") from None
        if data.get("kind") != KIND or data.get("version") != VERSION:
            raise CheckpointError(f"checkpoint {self.path} is {data.get('kind')} version {data.get('version')}, "
                                  f"expected {KIND} version {VERSION}")
        if _checksum(claims) != stored:
            raise CheckpointError(f"checkpoint {self.path} fails its checksum (edited or damaged); move it away "
                                  "to start without prepared claims")
        if (data.get("driver"), data.get("node")) != (self.driver, self.node):
            raise CheckpointError(f"checkpoint {self.path} belongs to driver {data.get('driver')} on node "
                                  f"{data.get('node')}, not {self.driver} on {self.node}: use a state directory "
                                  "per driver and node")
        return claims

    def get(self, uid: str) -> dict | None:
        with self._lock:
            self._refresh()
            entry = self._claims.get(uid)
            return copy.deepcopy(entry) if entry is not None else None

    def claims(self) -> dict[str, dict]:
        with self._lock:
            self._refresh()
            return copy.deepcopy(self._claims)

    def put(self, uid: str, entry: dict) -> None:
        """Record a prepared claim and write the file; on a failed write nothing is recorded."""
        with self._shared_change():
            before = self._claims.get(uid)
            self._claims[uid] = copy.deepcopy(entry)
            try:
                self._save()
            except OSError:
                if before is None:
                    self._claims.pop(uid, None)
                else:
                    self._claims[uid] = before
                raise

    def delete(self, uid: str) -> bool:
        with self._shared_change():
            entry = self._claims.pop(uid, None)
            if entry is None:
                return False
            try:
                self._save()
            except OSError:
                self._claims[uid] = entry
                raise
            return True

    def _save(self) -> None:
        data = {"kind": KIND, "version": VERSION, "driver": self.driver, "node": self.node,
                "claims": self._claims, "checksum": _checksum(self._claims)}
        files.atomic_write(self.path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), mode=0o600)
        self._seen = self._signature()
