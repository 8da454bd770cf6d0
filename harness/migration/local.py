"""Both paths on the local backend: the legacy device plugin (a real plugin process on a real node,
the patched node status on a simulated one) and the fake DRA driver rolled out node by node (its
slices, plus its kubelet plugins on a real node). `close()` undoes everything they started."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fake_devices.controller import FakeDriver
from fake_devices.deviceplugin import simulated
from harness.backends.kwok import nodes
from harness.core.progress import Reporter
from harness.k8s import wait
from harness.k8s.client import Clients
from harness.migration.rehearsal import MigrationNode

NODE_TIMEOUT = 90.0  # the kubelet reports a plugin's devices in its next status update (every 5 s here)


def create_simulated_nodes(k8s: Clients, names: list[str], pool: str, labels: dict[str, str],
                           timeout: float = 60.0) -> None:
    """Simulated (KWOK) nodes of the local backend, Ready before this returns (the caller deletes them)."""
    specs = [nodes.NodeSpec(name, pool=pool, labels=labels) for name in names]
    nodes.create(k8s.core, specs, Reporter(quiet=True))
    nodes.wait_ready(k8s.core, set(names), Reporter(quiet=True), timeout)


def device_plugins_on(real_node) -> Any:
    """The legacy device plugins of the real node the `real_node` fixture gives (its NodePlugins). The node is
    held for the test: a kubelet restarted by another test forgets a plugin's options (its checkpoint keeps
    devices, not PreStartRequired), the likely cause of the migration test's unexpected pass in make run."""
    return real_node.device_plugins()  # holds the node until the handle closes


def allocatable(k8s: Clients, node: str, resource: str) -> int | None:
    return simulated.allocatable(k8s.core.read_node(node), resource)


class LocalLegacy:
    """`device_plugins`: node name -> harness.backends.local.realnode.deviceplugins.NodeDevicePlugins
    for the real nodes; every other node is simulated."""

    def __init__(self, k8s: Clients, resource: str, device_plugins: dict | None = None,
                 pre_start_required: bool = False):
        self.k8s, self.resource, self.pre_start_required = k8s, resource, pre_start_required
        self.device_plugins = dict(device_plugins or {})
        self._patched: set[str] = set()

    def start(self, node: MigrationNode) -> None:
        if node.name in self.device_plugins:
            self.device_plugins[node.name].run(self.resource, node.profile, self.pre_start_required)
        else:
            self._patched.add(node.name)
            simulated.advertise(self.k8s.core, node.name, self.resource, node.devices)
        wait.until(f"node {node.name} to report {node.devices} x {self.resource} allocatable",
                   lambda: allocatable(self.k8s, node.name, self.resource) == node.devices, NODE_TIMEOUT)

    def drain(self, node: MigrationNode) -> None:
        if node.name in self.device_plugins:
            self.device_plugins[node.name].stop(self.resource)  # the kubelet then reports 0 for a while
        else:
            simulated.withdraw(self.k8s.core, node.name, self.resource)  # as the kubelet would
        wait.until(f"node {node.name} to report no allocatable {self.resource}",
                   lambda: not allocatable(self.k8s, node.name, self.resource), NODE_TIMEOUT)

    def close(self) -> None:
        for device_plugins in self.device_plugins.values():
            device_plugins.close()
        for name in sorted(self._patched):
            simulated.remove(self.k8s.core, name, self.resource)
        self._patched.clear()


class LocalDra:
    """The fake DRA driver rolled out one node at a time. `start_driver(node)` starts it (with its
    DeviceClass naming the extended resource) for the first node, as installing a DRA driver does;
    later nodes are assigned to it. `node_plugins`: node name ->
    harness.backends.local.realnode.plugins.NodePlugins for the real nodes (where the driver's kubelet
    plugin is started, and stopped again by close())."""

    def __init__(self, k8s: Clients, start_driver: Callable[[MigrationNode], FakeDriver],
                 node_plugins: dict | None = None):
        self.k8s, self.start_driver = k8s, start_driver
        self.driver: FakeDriver | None = None
        self.node_plugins = dict(node_plugins or {})
        self._plugins_started: list[tuple[Any, str]] = []  # (NodePlugins, driver name)

    def start(self, node: MigrationNode) -> None:
        if self.driver is None:
            self.driver = self.start_driver(node)
        else:
            self.driver.assign(node.name, node.profile)
        config, gpu = self.driver.config, self.driver.drivers.gpu
        if node.name in self.node_plugins:
            handle = self.node_plugins[node.name]
            self._plugins_started.append((handle, gpu))
            handle.run(gpu, config.instance, config.namespace)

        def published() -> bool:
            slices = self.k8s.resource.list_resource_slice(field_selector=f"spec.nodeName={node.name},spec.driver={gpu}")
            return sum(len(s.spec.devices or []) for s in slices.items) >= node.devices

        wait.until(f"the DRA driver {gpu} to publish node {node.name}'s devices", published, NODE_TIMEOUT)

    def close(self) -> None:
        """Stop the kubelet plugins this path started (after the pods are gone: they unprepare)."""
        for handle, driver in reversed(self._plugins_started):
            handle.stop(driver)
        self._plugins_started.clear()
