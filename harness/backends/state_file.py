"""What a backend keeps of each cluster it made, in `<its state directory>/<name>/state.yaml`: one typed
record for every backend, so `down`, `status`, `list` and a later process (after a crash, from another
terminal) read any cluster the same way.

Every record has the cluster's `name`, its `backend` and its `phase` (starting, running, failed); the
rest is the backend's own (local: ports, binaries, real nodes; kind: node and driver images; existing:
the user's kubeconfig and what was deployed into it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.core.files import write_atomic

STATE_FILE = "state.yaml"


@dataclass
class ClusterState:
    directory: Path
    data: dict

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def backend(self) -> str:
        return self.data.get("backend", "")

    @property
    def phase(self) -> str:
        return self.data.get("phase", "?")

    @phase.setter
    def phase(self, value: str) -> None:
        self.data["phase"] = value

    @property
    def kubeconfig(self) -> Path:
        """The cluster's kubeconfig: the one the backend wrote into the directory, or the user's it names."""
        given = self.data.get("kubeconfig")
        return Path(given) if given else self.directory / "kubeconfig"

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_atomic(self.directory / STATE_FILE, yaml.safe_dump(self.data, sort_keys=False))


def create(directory: Path, name: str, fields: dict, record: type[ClusterState] = ClusterState) -> ClusterState:
    """A new cluster's record (`fields`: its backend, phase and the backend's own), saved at once;
    FileExistsError when the directory is there already (another `up` of the same name got there first)."""
    directory.mkdir(parents=True, exist_ok=False)
    state = record(directory, {"name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **fields})
    state.save()
    return state


def load(directory: Path, not_found: Callable[[], Exception], record: type[ClusterState] = ClusterState) -> ClusterState:
    """The record in `directory`; `not_found()` is raised where there is none."""
    try:
        data = yaml.safe_load((directory / STATE_FILE).read_text()) or {}
    except FileNotFoundError:
        raise not_found() from None
    data.setdefault("name", directory.name)
    return record(directory, data)


def exists(directory: Path) -> bool:
    return (directory / STATE_FILE).is_file()


def names(root: Path) -> list[str]:
    """The clusters with a record under `root` (each a directory of its own)."""
    return sorted(p.name for p in root.iterdir() if exists(p)) if root.is_dir() else []
