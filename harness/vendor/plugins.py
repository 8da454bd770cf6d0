"""A vendor's kubelet plugin on the local backend's real node(s), as spec.kubeletPlugin describes it.

The plugin is a host process of the local cluster (`process.start`: its own session, recorded under
the cluster's `pids/`, its output in `logs/vendor-plugin-<node>.log`), so `cluster down` stops it
even after a crash of the run. It is stopped as a whole process group: a vendor's command may be a
wrapper script whose children must go too. Its record (`vendor-plugins.json` in the cluster
directory, named to the suite by setup.PLUGINS_OPTION) lets a test restart it (`VendorPlugin.restart`).

The placeholders of spec.kubeletPlugin are the node's real host paths, `node_paths`; the command
`dra-harness cluster node-paths` prints the same for vendors who start their plugin themselves.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.backends.local import process, state
from harness.backends.local.realnode import plugins
from harness.backends.local.realnode.reboot import reboot as reboot_node
from harness.backends.local.state import ClusterState
from harness.core.errors import ComponentError, ConfigError, HarnessError, Problem
from harness.core.nodelayout import RealNodeRecord, records
from harness.k8s.client import Clients

READY_TIMEOUT = 60.0  # registration socket and first slices; the example driver needs ~1 s
STOP_GRACE = 10.0  # SIGTERM -> SIGKILL: the kubelet plugin library shuts its gRPC servers down in this time


def node_paths(cluster: ClusterState, node: RealNodeRecord) -> dict[str, str]:
    """The values of the spec.kubeletPlugin placeholders for one real node (vendor.PLUGIN_PLACEHOLDERS)."""
    dirs = node.dirs
    return {"nodeName": node.name, "registrationDir": str(dirs.plugins_registry), "pluginsDir": str(dirs.plugins),
            "cdiDir": str(dirs.cdi), "kubeconfig": str(cluster.kubeconfig)}


def real_nodes(kubeconfig: str | Path, source: str, field_name: str = "spec.kubeletPlugin"):
    """(local cluster, its real nodes) of the cluster this kubeconfig reaches; ConfigError naming
    `field_name` where the harness cannot start a plugin there."""
    cluster = state.find_by_kubeconfig(kubeconfig)
    how = ("remove spec.kubeletPlugin and start your plugin yourself, or use a cluster from "
           "`dra-harness cluster up --real-nodes 1`")
    if cluster is None:
        raise ConfigError([Problem(source, field_name, f"the harness starts a kubelet plugin only on a real node of "
                                   f"a local dra-harness cluster; {kubeconfig} is not the kubeconfig of one", how)])
    nodes = records(cluster.data)
    if not nodes:
        raise ConfigError([Problem(source, field_name, f"cluster {cluster.name!r} has no real node (only simulated "
                                   "nodes, where no kubelet runs a plugin)", how)])
    return cluster, nodes


@dataclass
class VendorPlugin:
    """The vendor's plugin process on one real node."""

    cluster_dir: Path
    node: str
    argv: list[str]
    env: dict[str, str]
    registration_dir: Path
    drivers: tuple[str, ...]
    kubeconfig: Path
    started_at: float = 0.0  # wall clock of the last start: its registration socket must be newer

    @property
    def name(self) -> str:
        return f"vendor-plugin-{self.node}"

    @property
    def log(self) -> Path:
        return self.cluster_dir / "logs" / f"{self.name}.log"

    def running(self):
        found = process.recorded(self.cluster_dir).get(self.name)
        return found if found is not None and process.alive(found) else None

    def start(self, timeout: float = READY_TIMEOUT, wait_for_slices: bool = False) -> None:
        """Start it and wait until it registers with the kubelet (a new `<driver>...reg.sock`) and, on a
        first start, until its ResourceSlices for this node are published."""
        self.started_at = time.time()
        offset = self.log.stat().st_size if self.log.exists() else 0
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as handle:  # restarts append: mark where each run begins
            handle.write(f"--- dra-harness: starting {' '.join(self.argv)} ---\n")
        running = process.start(self.name, self.argv, self.cluster_dir, env=self.env)
        deadline = time.monotonic() + timeout
        clients = None
        try:
            while True:
                if not process.alive(running):
                    code = process.exit_code(running)
                    raise ComponentError(self.name, f"exited during start (status {code})", log_file=self.log,
                                         log_tail=_tail_from(self.log, offset),
                                         hint="check spec.kubeletPlugin.command and args in the vendor file")
                ready = self._registered()
                if ready and wait_for_slices:
                    if clients is None:
                        clients = Clients(self.kubeconfig)
                    ready = self._has_slices(clients)
                if ready:
                    return
                if time.monotonic() > deadline:
                    what = ("ResourceSlices of " + ", ".join(self.drivers) + f" on node {self.node}"
                            if self._registered() else f"a registration socket of {', '.join(self.drivers)} in "
                            f"{self.registration_dir}")
                    self.stop(kill=True)
                    raise ComponentError(self.name, f"not ready after {timeout:.0f}s: no {what}", log_file=self.log,
                                         log_tail=_tail_from(self.log, offset))
                time.sleep(0.1)
        finally:
            if clients is not None:
                clients.close()

    def _registered(self) -> bool:
        try:
            entries = list(os.scandir(self.registration_dir))
        except OSError:
            return False
        return any(entry.name.startswith(self.drivers) and entry.name.endswith("reg.sock")
                   and entry.stat().st_mtime >= self.started_at - 1 for entry in entries)

    def _has_slices(self, k8s: Clients) -> bool:
        return any(k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver},spec.nodeName={self.node}")
                   .items for driver in self.drivers)

    def stop(self, kill: bool = False) -> list[str]:
        """Stop its whole process group: SIGTERM, SIGKILL after STOP_GRACE (at once with `kill`: a
        crash). Signalled as a group, so children it forked meanwhile go too. Returns what survived."""
        running = self.running()
        leftovers = []
        if running is not None:
            group = running.pid  # its own session (process.start), so its own process group
            for sig, grace in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, 5.0)):
                if kill and sig == signal.SIGTERM:
                    continue
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + grace
                while _members(group) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if not _members(group):
                    break
            survivors = _members(group)
            if survivors:
                leftovers = [f"{self.name}: process group {group} ({', '.join(map(str, survivors))}) survived SIGKILL"]
        (self.cluster_dir / "pids" / f"{self.name}.json").unlink(missing_ok=True)
        return leftovers

    def restart(self, kill: bool = True, timeout: float = READY_TIMEOUT) -> None:
        """Stop it (by default a crash: SIGKILL, state only in its checkpoint) and start it again."""
        self.stop(kill=kill)
        self.start(timeout)

    def reboot_node(self, timeout: float = READY_TIMEOUT) -> None:
        """Reboot its node (realnode.reboot) once no other test uses the node: the plugin dies with it
        (SIGKILL) and starts again once the kubelet is back."""
        cluster = state.find_by_kubeconfig(self.kubeconfig)
        found = [r for r in records(cluster.data) if r.name == self.node] if cluster is not None else []
        if not found:
            raise HarnessError(f"cannot reboot node {self.node}: it is no real node of a local cluster reached "
                               f"through {self.kubeconfig}")
        with plugins.sole_user(found[0]):
            self.stop(kill=True)
            reboot_node(self.cluster_dir, found[0])
            self.start(timeout)

    def to_dict(self) -> dict:
        return {"clusterDir": str(self.cluster_dir), "node": self.node, "argv": self.argv, "env": self.env,
                "registrationDir": str(self.registration_dir), "drivers": list(self.drivers),
                "kubeconfig": str(self.kubeconfig)}

    @classmethod
    def from_dict(cls, data: dict) -> VendorPlugin:
        return cls(Path(data["clusterDir"]), data["node"], list(data["argv"]), dict(data["env"]),
                   Path(data["registrationDir"]), tuple(data["drivers"]), Path(data["kubeconfig"]))


def _members(group: int) -> list[int]:
    """Live processes of a process group; our own exited children are reaped on the way (an orphaned
    zombie waits for init and holds nothing)."""
    try:
        os.waitpid(group, os.WNOHANG)  # the group leader is our child when this process started it
    except (ChildProcessError, OSError):
        pass
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == group and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


def _tail_from(log: Path, offset: int, lines: int = 30) -> str:
    try:
        with open(log, "rb") as handle:
            handle.seek(offset)
            return "\n".join(handle.read()[-65536:].decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def load_plugins(record: str | Path | None) -> list[VendorPlugin]:
    """The plugins a run started, from its record file (the suite's PLUGINS_OPTION); none without one."""
    path = record
    if not path:
        return []
    try:
        return [VendorPlugin.from_dict(entry) for entry in json.loads(Path(path).read_text())]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise HarnessError(f"cannot read the vendor plugin record {path}: {err}") from None
