"""A local cluster's state directory and its `state.yaml`.

The state file records everything needed to inspect or tear down a cluster after the process that
started it is gone (crash, Ctrl-C, another terminal): backend, ports, binaries, features, nodes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.backends import state_file
from harness.backends.common import validate_name  # noqa: F401  (state.validate_name for local callers)
from harness.backends.local import reservations
from harness.core import paths
from harness.core.errors import ClusterNotFound
from harness.core.nodelayout import records

STATE_FILE = state_file.STATE_FILE


def cluster_dir(name: str) -> Path:
    return paths.clusters_dir() / name


@dataclass
class ClusterState(state_file.ClusterState):
    """A local cluster's record: the shared one (its kubeconfig in the directory), with the ports its
    components and real nodes hold."""

    @property
    def ports(self) -> dict[str, int]:
        return dict(self.data.get("ports", {}))

    @property
    def all_ports(self) -> set[int]:
        """The components' ports and the real nodes' kubelet ports."""
        return set(self.ports.values()) | {port for node in records(self.data)
                                           for port in (node.kubelet_port, node.healthz_port)}


def create(name: str, data: dict) -> ClusterState:
    made = state_file.create(cluster_dir(name), name, data, record=ClusterState)
    assert isinstance(made, ClusterState)
    return made


def load(name: str) -> ClusterState:
    directory = cluster_dir(name)

    def not_found() -> Exception:
        return ClusterNotFound(f"no cluster named {name!r}",
                               hint="`dra-harness cluster list` shows the clusters that exist")

    if directory.is_dir() and not state_file.exists(directory):  # a killed `up` before the state file was written
        return ClusterState(directory, {"name": name, "phase": "incomplete"})
    loaded = state_file.load(directory, not_found, record=ClusterState)
    assert isinstance(loaded, ClusterState)
    return loaded


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
