"""The node half of the fake driver: a kubelet DRA plugin for one driver name on one node.

    <registry_dir>/<driver>-reg.sock   pluginregistration.Registration (the kubelet's plugin watcher)
    <plugins_dir>/<driver>/dra.sock    DRAPlugin v1 + v1beta1, DRAResourceHealth v1 + v1alpha1

start(): load the checkpoint (restore CDI files of prepared claims), publish the node's slices of
the driver if configured to (`publish_profile`), list the driver's slices for this node, start
watching the fault ConfigMap, serve dra.sock, and only then registration, so the kubelet never finds
a registration whose endpoint is not ready, nor a plugin whose devices are not published yet.
stop(): the reverse; both sockets are removed. Runs as `python -m fake_devices.kubeletplugin` or
in-process (tests, benchmarks).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import grpc

from fake_devices import kube, render, unixgrpc
from fake_devices import profile as profiles
from fake_devices.config import PROFILE_LABEL
from fake_devices.faults import parse_faults
from fake_devices.kubeletplugin import servicers
from fake_devices.kubeletplugin.checkpoint import Checkpoint
from fake_devices.kubeletplugin.config import PluginConfig
from fake_devices.kubeletplugin.health import HealthMonitor
from fake_devices.kubeletplugin.inventory import Inventory
from fake_devices.kubeletplugin.prepare import Preparer, read_claim_with
from fake_devices.kubeletplugin.publisher import PublishError, SlicePublisher
from fake_devices.kubeletplugin.watch import ListWatch

log = logging.getLogger("fake_devices.kubeletplugin")
FAULTS_SYNC_SECONDS = 10.0


class PluginError(Exception):
    pass


class KubeletPlugin:
    def __init__(self, config: PluginConfig, api_client: kube.ApiClient):
        self.config = config.validate()
        self.core = kube.CoreV1Api(api_client)
        self.resource = kube.ResourceV1Api(api_client)
        self.checkpoint = Checkpoint(Checkpoint.file_for(config.state_path, config.driver), config.driver, config.node)
        self.inventory = Inventory(self.resource.list_resource_slice, config.driver, config.node,
                                   on_change=self._devices_changed)
        self.preparer = Preparer(config.driver, config.node, config.cdi_dir, read_claim_with(self.resource),
                                 self.inventory, self.checkpoint, self._node_labels, defects=config.defects)
        source = (f"ConfigMap {config.namespace}/{config.faults_configmap}" if config.faults_configmap
                  else "(no fault source: --instance not given)")
        self.health = HealthMonitor(self._known_devices, lambda: set(self.inventory.devices()), source)
        self.registration = servicers.Registration(config.driver, str(config.dra_socket.absolute()))
        self._profile_devices: list[tuple[str, str]] = []
        self._faults_watch: ListWatch | None = None
        self._servers: list[tuple[grpc.Server, Path]] = []
        self._stopped = threading.Event()

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> "KubeletPlugin":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        config = self.config
        for directory in (config.plugin_dir, config.registration_socket.parent, config.cdi_dir, config.state_path):
            Path(directory).mkdir(parents=True, exist_ok=True)
        self.checkpoint.load()
        restored = self.preparer.restore()
        if restored:
            log.info("restored %d CDI specs of prepared claims from the checkpoint", restored)
        if config.defects:
            log.warning("deliberate defects on (self-tests only): %s", ", ".join(sorted(config.defects)))
        if config.publish_profile:
            try:
                SlicePublisher(self.resource, self.core, config.driver, config.node, config.publish_profile).publish()
            except PublishError as err:
                raise PluginError(str(err)) from None
        self._profile_devices = self._devices_of_profile()
        self.inventory.start()
        if not self.inventory.wait_synced(config.sync_timeout):
            raise PluginError(f"could not list the ResourceSlices of {config.driver} on node {config.node} within "
                              f"{config.sync_timeout:.0f}s: {self.inventory.last_error or 'no answer'}")
        if config.faults_configmap:
            self._faults_watch = ListWatch(f"faults {config.namespace}/{config.faults_configmap}",
                                           self.core.list_namespaced_config_map, self._faults_changed,
                                           namespace=config.namespace,
                                           field_selector=f"metadata.name={config.faults_configmap}").start()
            if not self._faults_watch.wait_synced(min(config.sync_timeout, FAULTS_SYNC_SECONDS)):
                log.warning("fault state not read yet (%s): devices report UNKNOWN health until it is",
                            self._faults_watch.last_error or "no answer")
        else:
            self.health.set_faults({})
        self.health.recompute()
        dra = new_server(config.max_message_bytes, config.workers)
        servicers.add_dra_services(dra, self.preparer, self.health, config.health_interval,
                                   silent_health="silent-health" in config.defects)
        self._servers.append((dra, serve_unix(dra, config.dra_socket)))
        registration = new_server(config.max_message_bytes, 2)
        servicers.add_registration_service(registration, self.registration)
        self._servers.append((registration, serve_unix(registration, config.registration_socket)))
        log.info("serving %s on %s (registration %s)", config.driver, config.dra_socket, config.registration_socket)

    def stop(self, grace: float = 2.0) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.health.close()  # ends the health streams, so the servers can stop
        for server, path in reversed(self._servers):  # registration first: the kubelet stops using us
            stop_server(server, path, grace)
        self._servers.clear()
        if self._faults_watch is not None:
            self._faults_watch.stop()
        self.inventory.stop()

    def __enter__(self) -> "KubeletPlugin":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- health sources ---------------------------------------------------------------------

    def _devices_of_profile(self) -> list[tuple[str, str]]:
        """Every device the node's profile gives this driver (pool = node), so that devices lost
        before this plugin started are still reported. Without a profile: only published devices."""
        name = self.config.profile or self.config.publish_profile
        if name is None:
            try:
                node = self.core.read_node(self.config.node, _request_timeout=30)
                name = (node.metadata.labels or {}).get(PROFILE_LABEL)
            except Exception as err:  # health still works from the published slices
                log.warning("cannot read node %s for its profile label: %s", self.config.node, err)
        if not name:
            return []
        driver = self.config.driver
        domain = driver.split(".", 1)[1] if "." in driver else ""
        drivers = render.Drivers(domain)
        if driver not in drivers.all():
            log.warning("driver %s is not a fake-driver name (gpu./storage./nic.<domain>): profile %s not used",
                        driver, name)
            return []
        prof = profiles.load(name)
        devices, _ = render.devices_by_driver(prof, self.config.node, drivers).get(driver, ([], []))
        return [(self.config.node, d["name"]) for d in devices]

    def _known_devices(self) -> list[tuple[str, str]]:
        known = dict.fromkeys(self._profile_devices)
        known.update(dict.fromkeys(self.inventory.seen()))
        return list(known)

    def _devices_changed(self) -> None:
        self.health.recompute()

    def _faults_changed(self, items: dict[str, dict]) -> None:
        data: dict[str, str] = {}
        for obj in items.values():
            if (obj.get("metadata") or {}).get("name") == self.config.faults_configmap:
                data = obj.get("data") or {}
        self.health.set_faults(parse_faults(data.get(self.config.node, ""),
                                            f"ConfigMap {self.config.faults_configmap} key {self.config.node}"))

    def _node_labels(self) -> dict[str, str]:
        node = self.core.read_node(self.config.node, _request_timeout=30)
        return dict(node.metadata.labels or {})


def new_server(max_message_bytes: int, workers: int) -> grpc.Server:
    """A gRPC server that refuses requests over `max_message_bytes` (RESOURCE_EXHAUSTED)."""
    return unixgrpc.new_server(max_message_bytes, workers, "kubeletplugin-grpc", max_send_bytes=max_message_bytes * 4)


def serve_unix(server: grpc.Server, path: Path) -> Path:
    """Start `server` on the unix socket `path` (a stale socket there is replaced); returns the path."""
    try:
        return unixgrpc.serve_unix(server, path)
    except unixgrpc.SocketError as err:
        raise PluginError(str(err)) from None


stop_server = unixgrpc.stop_server
