"""What `dra-harness sanity` puts the vendor's kubelet plugin in: a throwaway local control plane with two
simulated (KWOK) nodes, the plugin's directories, the plugin itself on each node, and claims that the real
kube-scheduler allocates from the slices the plugin publishes. No root, no kubelet, no container runtime:
the checks act as the kubelet over the plugin's sockets (harness.sanity.kubelet).

The plugin is started from the vendor file's `spec.kubeletPlugin` with its placeholders filled in per
node: `{nodeName}` is the simulated node, `{registrationDir}`, `{pluginsDir}` and `{cdiDir}` are fresh
directories of this run (`{pluginsDir}/<driver>` is created for each driver, as the kubelet plugin library
requires: "The directory must exist"), `{kubeconfig}` the throwaway cluster's admin kubeconfig.

Directories live in `$TMPDIR/dra-sanity-<uid>/<cluster>/` (short: unix socket paths are limited to 107
bytes). Everything is removed when the target closes; a run killed before that (SIGKILL) is found by the
next one: its owner process is gone, so its cluster is stopped and its directory removed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from harness import backends
from harness.backends.base import Backend, ClusterSpec
from harness.backends.local import process, state
from harness.core.errors import ConfigError, HarnessError, Problem
from harness.core.progress import Reporter
from harness.k8s import errors, wait
from harness.k8s.client import Clients
from harness.sanity import kubelet
from harness.sanity.kubelet import ClaimRef
from harness.sanity.slicewatch import SliceWatch
from harness.vendor.file import VendorDriver
from harness.vendor.plugins import VendorPlugin

NODES = ("kwok-node-0", "kwok-node-1")  # the local backend's names for two simulated nodes
NAMESPACE = "dra-sanity"
ALLOCATE_TIMEOUT = 60.0
PLUGIN_TIMEOUT = 60.0
OWNER_FILE = "owner.json"
POD_IMAGE = "dra-harness.local/pause:1"  # never pulled: KWOK runs no container


def runs_root() -> Path:
    return Path(tempfile.gettempdir()) / f"dra-sanity-{os.getuid()}"


def require_plugin(vendor: VendorDriver) -> None:
    """The sanity mode starts the plugin itself: the vendor file must say how (spec.kubeletPlugin)."""
    if vendor.kubelet_plugin is None:
        raise ConfigError([Problem(vendor.source, "spec.kubeletPlugin", "is missing: the sanity mode starts your "
                                   "kubelet plugin itself, on a throwaway cluster",
                                   "spec.kubeletPlugin with command and args (docs/vendor-guide.md)")])


@dataclass
class Allocation:
    """A claim the scheduler allocated for a pod bound to `node`."""

    ref: ClaimRef
    node: str
    pod: str
    results: list[dict]  # status.allocation.devices.results: request, driver, pool, device[, shareID]

    def devices_of(self, driver: str) -> set[tuple[str, str]]:
        return {(r["pool"], r["device"]) for r in self.results if r["driver"] == driver}

    def requests_of(self, driver: str, pool: str, device: str) -> set[str]:
        return {r["request"] for r in self.results if (r["driver"], r["pool"], r["device"]) == (driver, pool, device)}


@dataclass
class NodeDirs:
    base: Path

    @property
    def registry(self) -> Path:
        return self.base / "registry"

    @property
    def plugins(self) -> Path:
        return self.base / "plugins"

    @property
    def cdi(self) -> Path:
        return self.base / "cdi"


@dataclass
class SanityTarget:
    vendor: VendorDriver
    reporter: Reporter = field(default_factory=lambda: Reporter(quiet=True))
    name: str = ""
    backend: Backend | None = None
    clients: Clients | None = None
    kubeconfig: Path | None = None
    dirs: dict[str, NodeDirs] = field(default_factory=dict)
    plugins: dict[str, VendorPlugin] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)  # driver -> the DeviceClass this run made for it
    slice_watch: SliceWatch | None = None
    _serial: int = 0

    # --- set-up and tear-down ---------------------------------------------------------------------

    def __enter__(self) -> SanityTarget:
        require_plugin(self.vendor)
        sweep_stale(self.reporter)
        self.name = f"sanity-{time.strftime('%H%M%S')}-{os.getpid() % 100000}"
        root = runs_root() / self.name
        try:
            root.mkdir(parents=True)
            (root / OWNER_FILE).write_text(json.dumps({"cluster": self.name, **process.identity()}))
            self.backend = backends.get("local", self.reporter)
            info = self.backend.up(ClusterSpec(name=self.name, nodes=len(NODES), real_nodes=0,
                                               owner=process.identity()))
            self.kubeconfig = Path(info.kubeconfig)
            self.clients = Clients(self.kubeconfig)
            self._namespace()
            # every event of the drivers' slices from before the first start: the publication rules over time
            self.slice_watch = SliceWatch(self.clients.api_client, self.vendor.drivers).start()
            for driver in self.vendor.drivers:
                self.classes[driver] = self._device_class(driver)
            for index, node in enumerate(NODES):
                self.dirs[node] = NodeDirs(root / f"n{index}")
                self._start_plugin(node)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> list[str]:
        """Stop the plugins, the cluster, remove the directories; what could not be removed."""
        left: list[str] = []
        for plugin in self.plugins.values():
            left += plugin.stop()
        self.plugins.clear()
        if self.slice_watch is not None:
            self.slice_watch.stop()
        if self.clients is not None:
            self.clients.close()
            self.clients = None
        if self.backend is not None and self.name and state.cluster_dir(self.name).exists():
            with self.reporter.step(f"stopping the throwaway cluster {self.name!r}"):
                left += self.backend.down(self.name)
        if self.name:
            shutil.rmtree(runs_root() / self.name, ignore_errors=True)
        return left

    def _k8s(self) -> Clients:
        assert self.clients is not None, "the target is not set up"
        return self.clients

    def _namespace(self) -> None:
        self._k8s().core.create_namespace({"metadata": {"name": NAMESPACE}})
        wait.service_account_ready(self._k8s(), NAMESPACE)

    def _device_class(self, driver: str) -> str:
        """A class of every device of `driver`: how any user asks for a driver's devices, attributes or not."""
        name = f"dra-sanity-{len(self.classes)}"
        self._k8s().resource.create_device_class({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == {json.dumps(driver)}"}}]}})
        return name

    def node_values(self, node: str) -> dict[str, str]:
        """The spec.kubeletPlugin placeholders for `node` (harness.vendor.file.PLUGIN_PLACEHOLDERS)."""
        dirs = self.dirs[node]
        return {"nodeName": node, "registrationDir": str(dirs.registry), "pluginsDir": str(dirs.plugins),
                "cdiDir": str(dirs.cdi), "kubeconfig": str(self.kubeconfig)}

    def _start_plugin(self, node: str) -> None:
        plugin = self.vendor.kubelet_plugin
        assert plugin is not None and self.kubeconfig is not None
        dirs = self.dirs[node]
        for directory in (dirs.registry, dirs.cdi, *(dirs.plugins / d for d in self.vendor.drivers)):
            directory.mkdir(parents=True, exist_ok=True)
        values = self.node_values(node)
        started = VendorPlugin(state.cluster_dir(self.name), node, plugin.argv(values), plugin.environment(values),
                               dirs.registry, self.vendor.drivers, self.kubeconfig)
        self.plugins[node] = started
        with self.reporter.step(f"starting the kubelet plugin on simulated node {node} (log: {started.log})"):
            started.start(PLUGIN_TIMEOUT)
            self.wait_serving(node)
            self.wait_for_slices(node)

    def wait_serving(self, node: str) -> None:
        """Until GetInfo answers on a registration socket of every driver: a socket file alone may be the
        one a killed instance left, which nobody serves until the new instance replaces it."""
        plugin = self.plugins[node]

        def serving() -> bool:
            if plugin.running() is None:
                raise HarnessError(f"the kubelet plugin on node {node} exited; its log: {plugin.log}")
            for driver in self.vendor.drivers:
                sockets = kubelet.registration_sockets(self.dirs[node].registry, driver)
                try:
                    if not sockets or kubelet.get_info(sockets[0], timeout=2).name != driver:
                        return False
                except grpc.RpcError:
                    return False
            return True

        wait.until(f"the kubelet plugin on node {node} to answer GetInfo on its registration socket "
                   f"(log: {plugin.log})", serving, PLUGIN_TIMEOUT)

    def restart(self, node: str, *, empty_cdi: bool = False) -> None:
        """A crash (SIGKILL) and a new start; with `empty_cdi`, a node reboot: the CDI directory (a tmpfs
        on a real node) is empty when the plugin starts again."""
        plugin = self.plugins[node]
        plugin.stop(kill=True)
        if empty_cdi:
            for entry in self.dirs[node].cdi.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        plugin.start(PLUGIN_TIMEOUT)
        self.wait_serving(node)

    # --- what the plugin published ----------------------------------------------------------------

    def slices(self, driver: str | None = None) -> list[dict]:
        selector = f"spec.driver={driver}" if driver else None
        items = self._k8s().resource.list_resource_slice(field_selector=selector).items
        found = [self._k8s().api_client.sanitize_for_serialization(s) for s in items]
        return [s for s in found if s["spec"]["driver"] in self.vendor.drivers]

    def slices_for(self, node: str, driver: str | None = None) -> list[dict]:
        """The slices that offer devices on `node`: its own, and those of a node selector or all nodes."""
        return [s for s in self.slices(driver) if s["spec"].get("nodeName") in (node, None)]

    def wait_for_slices(self, node: str) -> None:
        plugin = self.plugins[node]

        def published() -> bool:
            return all(self.slices_for(node, driver) for driver in self.vendor.drivers)

        wait.until(f"ResourceSlices of {', '.join(self.vendor.drivers)} for node {node} (plugin log: {plugin.log})",
                   published, PLUGIN_TIMEOUT)

    def devices_on(self, node: str, driver: str) -> set[tuple[str, str]]:
        return {(s["spec"]["pool"]["name"], d["name"]) for s in self.slices_for(node, driver)
                for d in s["spec"].get("devices") or []}

    # --- claims -----------------------------------------------------------------------------------

    def _next(self, what: str) -> str:
        self._serial += 1
        return f"{what}-{self._serial}"

    def unallocated_claim(self, driver: str) -> ClaimRef:
        """A claim no pod uses: the scheduler never allocates it."""
        made = self._k8s().resource.create_namespaced_resource_claim(NAMESPACE, self._claim_body(self._next("idle"),
                                                                                                  driver))
        return ClaimRef(NAMESPACE, made.metadata.name, made.metadata.uid)

    def _claim_body(self, name: str, driver: str) -> dict:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "device", "exactly": {
                    "deviceClassName": self.classes[driver], "count": 1}}]}}}

    def allocate(self, node: str, driver: str) -> Allocation:
        """A claim of one device of `driver`, allocated by the scheduler for a pod it binds to `node`."""
        claim_name = self._next("claim")
        made = self._k8s().resource.create_namespaced_resource_claim(NAMESPACE, self._claim_body(claim_name, driver))
        pod_name = f"pod-{claim_name}"
        self._k8s().core.create_namespaced_pod(NAMESPACE, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "device", "resourceClaimName": claim_name}],
                     "containers": [{"name": "c", "image": POD_IMAGE, "resources": {"claims": [{"name": "device"}]}}]}})

        def allocated():
            claim = self._k8s().resource.read_namespaced_resource_claim(claim_name, NAMESPACE)
            pod = self._k8s().core.read_namespaced_pod(pod_name, NAMESPACE)
            if claim.status and claim.status.allocation and pod.spec.node_name:
                return self._k8s().api_client.sanitize_for_serialization(claim)
            return None

        claim = wait.until(f"the scheduler to allocate claim {NAMESPACE}/{claim_name} of {driver} for a pod on node "
                           f"{node}", allocated, ALLOCATE_TIMEOUT,
                           diagnostics=lambda: wait.describe_namespace(self._k8s(), NAMESPACE))
        return Allocation(ClaimRef(NAMESPACE, claim_name, made.metadata.uid), node, pod_name,
                          claim["status"]["allocation"]["devices"]["results"])

    def release(self, allocation: Allocation) -> None:
        """Delete the pod and the claim, and wait until the claim is gone (its device free again)."""
        wait.ignore_not_found(self._k8s().core.delete_namespaced_pod, allocation.pod, NAMESPACE, grace_period_seconds=0)
        self.delete_claim(allocation.ref)

    def delete_claim(self, ref: ClaimRef) -> None:
        wait.ignore_not_found(self._k8s().resource.delete_namespaced_resource_claim, ref.name, NAMESPACE)

        def gone() -> bool:
            found = errors.ignore_missing(self._k8s().resource.read_namespaced_resource_claim, ref.name, NAMESPACE)
            return found is None or found.metadata.uid != ref.uid

        wait.until(f"claim {ref} to be deleted", gone, ALLOCATE_TIMEOUT,
                   diagnostics=lambda: wait.describe_namespace(self._k8s(), NAMESPACE))

    def free_devices(self, node: str, driver: str) -> int:
        """How many more claims of one device the scheduler could allocate on `node` now (allocated devices
        of this run's claims taken off; a device that takes several allocations counts once)."""
        taken = set()
        for claim in self._k8s().resource.list_namespaced_resource_claim(NAMESPACE).items:
            allocation = claim.status.allocation if claim.status else None
            for result in (allocation.devices.results if allocation else []):
                taken.add((result.pool, result.device))
        return len(self.devices_on(node, driver) - taken)


def sweep_stale(reporter: Reporter) -> None:
    """Stop the cluster and remove the directory of every earlier sanity run whose process is gone."""
    root = runs_root()
    if not root.is_dir() or root.stat().st_uid != os.getuid():
        return
    for run in sorted(root.iterdir()):
        try:
            owner = json.loads((run / OWNER_FILE).read_text())
        except (OSError, ValueError):
            owner = {}
        if process.alive(process.Running("sanity", **process.identity_fields(owner))):
            continue
        name = owner.get("cluster") or run.name
        reporter.info(f"removing a sanity run that was killed: {run}")
        try:
            if state.cluster_dir(name).exists():
                left = backends.get("local", reporter).down(name)
                if left:
                    reporter.info(f"its clean-up left: {', '.join(left)}")
        except HarnessError as err:
            reporter.info(f"cannot stop its cluster {name!r}: {err}")
        shutil.rmtree(run, ignore_errors=True)
