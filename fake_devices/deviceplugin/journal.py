"""An append-only record of the kubelet's calls into a device plugin (JSON lines), so tests and the
migration report can see which devices the kubelet really allocated through the legacy path."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

FILE_NAME = "calls.jsonl"


class Journal:
    def __init__(self, path: Path | None):
        self.path = path
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, method: str, **details) -> None:
        if self.path is None:
            return
        line = json.dumps({"time": round(time.time(), 3), "method": method, **details}, sort_keys=True)
        with self._lock, open(self.path, "a") as handle:
            handle.write(line + "\n")
            handle.flush()


def read(path: Path) -> list[dict]:
    """Every recorded call, oldest first; [] when nothing was recorded yet. A torn last line (the
    plugin was killed mid-write) is skipped."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return parse(text)


def parse(text: str) -> list[dict]:
    """The calls of a journal's text (read elsewhere: a kind node's file); a torn last line is skipped."""
    calls = []
    for line in text.splitlines():
        try:
            calls.append(json.loads(line))
        except ValueError:
            continue
    return calls


def allocated_ids(calls: list[dict]) -> list[list[str]]:
    """The device IDs of every container the kubelet allocated, in call order."""
    return [list(c) for call in calls if call.get("method") == "Allocate" for c in call.get("containers", [])]
