"""A local cluster's state directory and its `state.yaml`.

The state file records everything needed to inspect or tear down a cluster after the process that
started it is gone (crash, Ctrl-C, another terminal): backend, ports, binaries, features, nodes.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.backends.common import validate_name  # noqa: F401  (state.validate_name for local callers)
from harness.backends.local import reservations
from harness.core import paths
from harness.core.errors import ClusterNotFound
from harness.core.files import write_atomic
from harness.core.nodelayout import records

STATE_FILE = "state.yaml"


def cluster_dir(name: str) -> Path:
    return paths.clusters_dir() / name


@dataclass
class ClusterState:
    directory: Path
    data: dict

    @property
    def name(self) -> str:
        return self.data["name"]

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def ports(self) -> dict[str, int]:
        return dict(self.data.get("ports", {}))

    @property
    def all_ports(self) -> set[int]:
        """The components' ports and the real nodes' kubelet ports."""
        return set(self.ports.values()) | {port for node in records(self.data)
                                           for port in (node.kubelet_port, node.healthz_port)}

    def save(self) -> None:
        write_atomic(self.directory / STATE_FILE, yaml.safe_dump(self.data, sort_keys=False))


def create(name: str, data: dict) -> ClusterState:
    directory = cluster_dir(name)
    directory.mkdir(parents=True, exist_ok=False)
    state = ClusterState(directory, {"name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                     **data})
    state.save()
    return state


def load(name: str) -> ClusterState:
    directory = cluster_dir(name)
    try:
        data = yaml.safe_load((directory / STATE_FILE).read_text()) or {}
    except OSError:
        if directory.is_dir():  # a killed `up` before the state file was written
            return ClusterState(directory, {"name": name, "phase": "incomplete"})
        raise ClusterNotFound(f"no cluster named {name!r}",
                              hint="`dra-harness cluster list` shows the clusters that exist") from None
    return ClusterState(directory, data)


def all_names() -> list[str]:
    root = paths.clusters_dir()
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def find_by_kubeconfig(kubeconfig: Path | str) -> ClusterState | None:
    """The local cluster whose admin kubeconfig this is, or None: the vendor's kubelet plugin and the
    migration rehearsal start host processes on its real node, which only this machine's record names."""
    wanted = Path(kubeconfig).expanduser().resolve()
    for name in all_names():
        try:
            candidate = load(name)
        except Exception:  # a half-written state of another cluster is not this one
            continue
        if candidate.kubeconfig.resolve() == wanted:
            return candidate
    return None


def reserved_ports(except_name: str | None = None) -> set[int]:
    found: set[int] = set()
    for name in all_names():
        if name != except_name:
            try:
                found.update(load(name).all_ports)
            except Exception:  # a half-written state must not stop another cluster from starting
                continue
    return found


def remove(state: ClusterState) -> None:
    shutil.rmtree(state.directory, ignore_errors=True)
    reservations.release(state.directory)
