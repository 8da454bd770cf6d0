"""The fake driver's kubelet plugin on a real node: one host process per driver name.

The plugin registers through the kubelet's plugins_registry directory and writes CDI specs where
this node's containerd reads them. It runs as a host process (not a pod): the node has no image
with Python in it, and a host process needs no image at all. It is forked from a server that imported the
plugin once (forked.py). It is recorded like the cluster's other
processes, so `cluster down` stops it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil

from fake_devices.kubeletplugin import startup
from fake_devices.kubeletplugin.generated import podresources_v1_pb2, podresources_v1_pb2_grpc
from harness.backends.local import process
from harness.backends.local.realnode import forked, node
from harness.backends.local.realnode.deviceplugins import NodeDevicePlugins
from harness.backends.local.realnode.reboot import reboot as reboot_node
from harness.backends.local.realnode.sharing import WAIT, NodeUse
from harness.core.errors import ComponentError
from harness.core.nodelayout import RealNodeRecord

PODRESOURCES: Any = podresources_v1_pb2  # generated: its message classes are built at import time
READY_TIMEOUT = 120.0  # a deadline, not a wait: importing grpc + kubernetes took over 30 s on a loaded machine


def argv(node: RealNodeRecord, driver: str, kubeconfig: Path, instance: str | None, namespace: str | None,
         health_interval: float = 10.0, rolling_update_id: str | None = None) -> list[str]:
    dirs = node.dirs
    args = [sys.executable, "-m", "fake_devices.kubeletplugin", f"--driver={driver}", f"--node={node.name}",
            f"--kubeconfig={kubeconfig}", f"--plugins-dir={dirs.plugins}", f"--registry-dir={dirs.plugins_registry}",
            f"--cdi-dir={dirs.cdi}", f"--state-dir={dirs.plugin_state / driver}",
            f"--health-interval={health_interval}"]
    return args + instance_args(instance, namespace, rolling_update_id)


def instance_args(instance: str | None, namespace: str | None, rolling_update_id: str | None) -> list[str]:
    """The plugin's flags for whose faults it reports (fake-driver instance, its namespace) and, in an upgrade,
    which of two instances it is; shared with the kind backend's plugin pods."""
    pairs = (("instance", instance), ("namespace", namespace), ("rolling-update-id", rolling_update_id))
    return [f"--{flag}={value}" for flag, value in pairs if value]


def process_name(node: RealNodeRecord, driver: str, rolling_update_id: str | None = None) -> str:
    name = node.plugin_process(driver)
    return f"{name}-{rolling_update_id}" if rolling_update_id else name


def start(cluster_dir: Path, node: RealNodeRecord, driver: str, kubeconfig: Path, instance: str | None = None,
          namespace: str | None = None, timeout: float = READY_TIMEOUT,
          rolling_update_id: str | None = None) -> process.Running:
    """Start the plugin for `driver` and wait until it serves and the kubelet registered it. With a
    `rolling_update_id` it is a further instance beside the usual one (an upgrade in progress)."""
    starting = launch(cluster_dir, node, driver, kubeconfig, instance, namespace, rolling_update_id)
    return wait_ready(cluster_dir, node, starting, timeout)


@dataclass(frozen=True)
class Starting:
    """A plugin process launched and not yet known to be up: where in its log its start lines will appear."""
    driver: str
    rolling_update_id: str | None
    running: process.Running
    log: Path
    offset: int


def launch(cluster_dir: Path, node: RealNodeRecord, driver: str, kubeconfig: Path, instance: str | None = None,
           namespace: str | None = None, rolling_update_id: str | None = None) -> Starting:
    """Start the plugin's process (forked: realnode/forked.py) without waiting for it, so that several start side
    by side."""
    name = process_name(node, driver, rolling_update_id)
    log = cluster_dir / "logs" / f"{name}.log"
    offset = log.stat().st_size if log.exists() else 0  # a restarted plugin appends to the same log
    running = forked.start(name, argv(node, driver, kubeconfig, instance, namespace,
                                      rolling_update_id=rolling_update_id), cluster_dir)
    return Starting(driver, rolling_update_id, running, log, offset)


def wait_ready(cluster_dir: Path, node: RealNodeRecord, starting: Starting,
               timeout: float = READY_TIMEOUT) -> process.Running:
    """Wait until a launched plugin serves and the kubelet registered it (fake_devices.kubeletplugin.startup);
    one that exits, is refused or stays silent is stopped and named."""
    name, log = starting.running.name, starting.log
    deadline = time.monotonic() + timeout
    while True:
        with open(log, "rb") as handle:
            handle.seek(starting.offset)
            try:
                if startup.registered(handle.read().decode(errors="replace"), starting.driver):
                    return starting.running
            except startup.RegistrationRefused as err:
                stop(cluster_dir, node, starting.driver, rolling_update_id=starting.rolling_update_id)
                raise ComponentError(name, str(err), log_file=log, log_tail=process.tail(log)) from None
        if not process.alive(starting.running):
            (cluster_dir / "pids" / f"{name}.json").unlink(missing_ok=True)
            raise ComponentError(name, "exited during start", log_file=log, log_tail=process.tail(log))
        if time.monotonic() > deadline:
            # ours: never leave it running
            stop(cluster_dir, node, starting.driver, rolling_update_id=starting.rolling_update_id)
            raise ComponentError(name, f"not ready and registered with the kubelet after {timeout:.0f}s", log_file=log,
                                 log_tail=process.tail(log))
        time.sleep(0.05)


def stop(cluster_dir: Path, node: RealNodeRecord, driver: str, kill: bool = False,
         rolling_update_id: str | None = None) -> None:
    """Stop the plugin (SIGTERM, or SIGKILL to simulate a crash); its checkpoint stays."""
    stop_all(cluster_dir, node, [(driver, rolling_update_id)], kill)


def stop_all(cluster_dir: Path, node: RealNodeRecord, plugins: list[tuple[str, str | None]],
             kill: bool = False) -> None:
    """Stop several plugins (driver, rolling update id) side by side: all are signalled, then waited for."""
    recorded = process.recorded(cluster_dir)
    names = [process_name(node, driver, rolling_update_id) for driver, rolling_update_id in plugins]
    procs = []
    for running in (recorded.get(name) for name in names):
        if running is not None and process.alive(running):
            try:
                procs.append(psutil.Process(running.pid))
                if kill:
                    procs[-1].kill()
            except psutil.NoSuchProcess:  # ended on its own meanwhile
                pass
    process.terminate(procs, 0.0 if kill else 5.0)
    for name in names:
        (cluster_dir / "pids" / f"{name}.json").unlink(missing_ok=True)


class NodePlugins:
    """The kubelet plugins one user (a test, a CLI command) runs on a real node; `close()` stops them."""

    def __init__(self, cluster_dir: Path, node: RealNodeRecord, kubeconfig: Path):
        self.cluster_dir, self.node, self.kubeconfig = cluster_dir, node, kubeconfig
        self._started: dict[str, tuple[str | None, str | None]] = {}
        self._upgrades: set[tuple[str, str]] = set()  # (driver, rolling update id) of further instances
        # A share of the node while this user runs plugins there; a kubelet restart or a reboot needs the node
        # alone, so it never disturbs another test (pytest -n 2) in the middle of its pods.
        self.use = NodeUse(node)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def cdi_dir(self) -> Path:
        return self.node.dirs.cdi

    @property
    def kubelet_root(self) -> Path:
        return self.node.dirs.kubelet_root

    @property
    def plugins_registry(self) -> Path:
        return self.node.dirs.plugins_registry

    @property
    def plugins_dir(self) -> Path:
        return self.node.dirs.plugins

    def read(self, path: Path) -> str:
        """A file of the node (here: of this machine, under the node's directories)."""
        return Path(path).read_text()

    def names(self, directory: Path, pattern: str = "*") -> list[str]:
        """Names of the entries of a node directory matching a shell pattern (sorted; none if it is missing)."""
        return sorted(p.name for p in Path(directory).glob(pattern))

    def plugin_socket(self, driver: str) -> Path | None:
        """The plugin's DRA service socket, for a client on this machine."""
        return self.node.dirs.plugins / driver / "dra.sock"

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's PodResources API (k8s.io/kubelet podresources v1), under its --root-dir."""
        return self.node.dirs.kubelet_root / "pod-resources" / "kubelet.sock"

    def pod_resources(self, pod: str, namespace: str) -> bytes | None:
        """The kubelet's PodResources `Get` for a pod over its socket: the serialized answer, None for a pod the
        kubelet does not know."""
        channel = grpc.insecure_channel(f"unix://{self.pod_resources_socket}")
        try:
            request = PODRESOURCES.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
            return podresources_v1_pb2_grpc.PodResourcesListerStub(channel).Get(request, timeout=10).SerializeToString()
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNKNOWN) and "not found" in \
                    (err.details() or "").lower():
                return None
            raise
        finally:
            channel.close()

    def device_plugins(self) -> NodeDevicePlugins:
        """Legacy device plugins on this node (host processes; the migration tests), the node held meanwhile."""
        self.use.share()
        return NodeDevicePlugins(self.cluster_dir, self.node)

    def hold(self) -> None:
        """Count as a user of the node until close(), with no plugin of ours started: a test that runs other
        things there (legacy device plugins) must not see its kubelet restarted by another test meanwhile."""
        self.use.share()

    def will_disrupt(self) -> None:
        """Say, before running anything on the node, that this user will restart its kubelet or reboot it
        (sharing.NodeUse.will_disrupt): waits for the node's other restarting user, if any, to close."""
        self.use.will_disrupt()

    def run(self, driver: str, instance: str | None = None, namespace: str | None = None) -> None:
        self.use.share()
        self._started[driver] = (instance, namespace)  # first: close() stops it even if the start fails
        start(self.cluster_dir, self.node, driver, self.kubeconfig, instance, namespace)

    def run_for(self, fake_driver) -> tuple[str, ...]:
        """Run a plugin for every driver name of a fake_devices FakeDriver, started side by side; returns the
        names once every one is ready."""
        config = fake_driver.config
        drivers = tuple(fake_driver.drivers.all())
        self.use.share()
        starting = []
        for driver in drivers:
            self._started[driver] = (config.instance, config.namespace)  # first: close() stops it even if it fails
            starting.append(launch(self.cluster_dir, self.node, driver, self.kubeconfig, config.instance,
                                   config.namespace))
        for each in starting:
            wait_ready(self.cluster_dir, self.node, each)
        return drivers

    def stop(self, driver: str, kill: bool = False) -> None:
        stop(self.cluster_dir, self.node, driver, kill=kill)

    def restart(self, driver: str, kill: bool = True) -> None:
        """Stop (by default: crash) and start the plugin again, as a driver upgrade or crash would."""
        instance, namespace = self._started[driver]
        self.stop(driver, kill=kill)
        self.run(driver, instance, namespace)

    def run_instance(self, driver: str, rolling_update_id: str, timeout: float = READY_TIMEOUT) -> None:
        """Start another instance of `driver`'s running plugin beside it, with its own socket names
        (`<driver>-<id>-reg.sock`, `dra-<id>.sock`): the first half of an upgrade."""
        instance, namespace = self._started[driver]
        self._upgrades.add((driver, rolling_update_id))
        start(self.cluster_dir, self.node, driver, self.kubeconfig, instance, namespace, timeout=timeout,
              rolling_update_id=rolling_update_id)

    def stop_instance(self, driver: str, rolling_update_id: str) -> None:
        stop(self.cluster_dir, self.node, driver, rolling_update_id=rolling_update_id)
        self._upgrades.discard((driver, rolling_update_id))

    def log(self, driver: str, rolling_update_id: str | None = None) -> Path:
        return self.cluster_dir / "logs" / f"{process_name(self.node, driver, rolling_update_id)}.log"

    def log_text(self, driver: str, rolling_update_id: str | None = None) -> str:
        """Everything the plugin of `driver` printed so far, across its restarts (one file)."""
        try:
            return self.log(driver, rolling_update_id).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def restart_kubelet(self, wait_for_others: float = WAIT) -> None:
        """Restart the node's kubelet (see node.restart_kubelet); the plugins keep running. Waits
        until no other user of the node runs plugins there, and keeps new ones out meanwhile."""
        with self.use.alone(wait_for_others):
            node.restart_kubelet(self.cluster_dir, self.node)

    def reboot(self, wait_for_others: float = WAIT) -> None:
        """Reboot the node (reboot.reboot): its plugins of this user die with it (SIGKILL) and start again
        once the kubelet is back. Has the node alone meanwhile, as a kubelet restart does."""
        with self.use.alone(wait_for_others):
            for driver in self._started:
                stop(self.cluster_dir, self.node, driver, kill=True)
            reboot_node(self.cluster_dir, self.node)
            for driver, (instance, namespace) in self._started.items():
                start(self.cluster_dir, self.node, driver, self.kubeconfig, instance, namespace)

    def cdi_specs(self, driver: str | None = None) -> list[Path]:
        prefix = f"{driver}-" if driver else ""
        return sorted(p for p in self.cdi_dir.glob(f"{prefix}*.json"))

    def close(self) -> None:
        try:
            stop_all(self.cluster_dir, self.node, [*self._upgrades, *((driver, None) for driver in self._started)])
            self._upgrades.clear()
            self._started.clear()
        finally:
            self.use.release()


@contextmanager
def sole_user(record: RealNodeRecord, wait_for_others: float = WAIT) -> Iterator[None]:
    """The node to oneself, for a caller that holds no share of it (a vendor's plugin the run started)."""
    use = NodeUse(record)
    try:
        with use.alone(wait_for_others):
            yield
    finally:
        use.release()
