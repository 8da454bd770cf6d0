"""The kubelet's side of a DRA driver's plugin coming and going, for any driver whose plugin the
harness can stop and start on a node run by a real kubelet:

- a plugin that crashes and starts again keeps the claims the kubelet prepared through it: the pod
  keeps running (same container, no restart), the claim stays prepared (the kubelet's count, the CDI
  spec the plugin wrote), deleting the pod then unprepares cleanly, and new claims are prepared;
- after a node reboot (every process killed, the CDI directory emptied, checkpoints kept) the kubelet
  asks the plugin to prepare the claim again and the pod comes back with its devices (KP-RESTART-CDI);
- once a plugin is gone for good, the kubelet deletes that driver's ResourceSlices on its node (after
  its wiping delay, 30 s in 1.37) and no other slice of the node; the plugin, started again,
  publishes them anew.

The driver under test is a vendor's (vendor mode: the plugin the harness started from the vendor
file's spec.kubeletPlugin, `vendor_plugins`) or the fake driver's plugin on the local backend's real
node. The fake driver's slices come from its control-plane half, not from its plugin, so its
slice-wiping check is test_kubelet_node.py's; here that test is vendor mode's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from conformance import cdi_specs, checks, objects, under_test
from conformance.plugin_daemon_set import crash_daemon_set_pod
from harness.k8s import wait
from harness.k8s.client import Clients
from harness.pytest_plugin.plugin import vendor_driver
from harness.sanity import rules

pytestmark = [pytest.mark.needs_kubelet, pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")]

WIPING_DELAY = 30  # the kubelet's delay before it deletes the slices of a plugin that is gone (1.37)
WIPE_TIMEOUT = WIPING_DELAY + 90  # a loaded two-core machine
POD_TIMEOUT = 120
REBOOT_TIMEOUT = 180  # kubelet back, sandbox and container made anew, Prepare retried with the kubelet's backoff
CDI_REFUSED_FOR = 60  # a container refused for unresolvable CDI devices this long stays so (kubelet retries: 10 s, 20 s, ...)


@dataclass
class PluginUnderTest:
    """One plugin of the driver under test on a kubelet node, a free device of it, and how to crash it."""

    driver: str
    node: str
    pool: under_test.DevicePool | None
    cdi_dir: Path | None
    crash_and_restart: Callable[[], None]
    # the node power-cycled, the plugin killed with it and started after; None: the harness cannot reboot it
    reboot_node: Callable[[], None] | None
    log: Path | None = None

    def describe(self) -> str:
        return f"driver {self.driver} on node {self.node}" + (f" (plugin log {self.log})" if self.log else "")


def _vendor_plugin_on(request, drivers, node: str):
    """The vendor plugin the harness runs on `node` for one of `drivers`, or skip naming why."""
    plugins = request.getfixturevalue("vendor_plugins")  # skips naming spec.kubeletPlugin when absent
    found = [p for p in plugins if p.node == node and set(p.drivers) & set(drivers)]
    if not found:
        pytest.skip(f"the harness runs no plugin of {', '.join(drivers)} on node {node} (it runs "
                    f"{', '.join(f'{p.name} for {list(p.drivers)}' for p in plugins)})")
    return found[0]


@pytest.fixture
def plugin_under_test(request, k8s: Clients, dra_cluster) -> PluginUnderTest:
    if vendor_driver(request.config) is None:
        real_node = request.getfixturevalue("real_node")
        make = partial(under_test.DevicePool, k8s, request.getfixturevalue("cluster_objects"),
                       request.getfixturevalue("unique_name"))
        pool = under_test.fake_pool(k8s, request.getfixturevalue("fake_driver"), "", 1, make, real_node=real_node)
        return PluginUnderTest(pool.driver, pool.node, pool, real_node.cdi_dir,
                               lambda: real_node.restart(pool.driver, kill=True), real_node.reboot,
                               real_node.log(pool.driver))
    vendor = vendor_driver(request.config)
    daemon_set = vendor.plugin_daemon_set if vendor.kubelet_plugin is None else None
    if daemon_set is None:
        request.getfixturevalue("vendor_plugins")  # before a device is taken: skip at once without spec.kubeletPlugin
    pool = request.getfixturevalue("devices_under_test")(1)
    if not pool.kubelet:
        pytest.skip(f"the free devices of {pool.driver} are on {pool.node}, a node no real kubelet runs: no plugin "
                    "of it prepares claims there")
    if daemon_set is not None:  # the vendor's DaemonSet runs the plugin: crashed by deleting its pod on the node
        namespace, name = daemon_set
        return PluginUnderTest(pool.driver, pool.node, pool, cdi_specs.known_cdi_dir(dra_cluster, pool.node),
                               lambda: crash_daemon_set_pod(k8s, namespace, name, pool.node), None)
    plugin = _vendor_plugin_on(request, (pool.driver,), pool.node)
    return PluginUnderTest(pool.driver, pool.node, pool, cdi_specs.known_cdi_dir(dra_cluster, pool.node),
                           lambda: plugin.restart(kill=True), plugin.reboot_node, plugin.log)


def _pod_gone(k8s: Clients, ns: str, pod: str, where: str) -> None:
    checks.pod_gone(k8s, ns, pod, POD_TIMEOUT, f" (the kubelet confirms only after NodeUnprepareResources): {where}")


def _running_with_a_claim(k8s: Clients, ns: str, plugin: PluginUnderTest, pod: str):
    """A pod with a claim of one device of the plugin's pool, running: (the pool, its claim, the allocated
    device, a description naming plugin, claim and device for failures)."""
    pool = plugin.pool
    assert pool is not None
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("one"))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim(pod, "one")))
    checks.containers_running(k8s, ns, pod, timeout=POD_TIMEOUT)
    claim = checks.pod_claim(k8s, ns, pod)
    (result,) = claim.status.allocation.devices.results
    where = (f"{plugin.describe()}, claim {ns}/{claim.metadata.name} (uid {claim.metadata.uid}), device "
             f"{result.driver}/{result.pool}/{result.device}")
    return pool, claim, result, where


def test_plugin_restart_keeps_prepared_claims(k8s: Clients, dra_namespace, plugin_under_test):
    ns, plugin = dra_namespace, plugin_under_test
    pool, claim, result, where = _running_with_a_claim(k8s, ns, plugin, "survivor")
    assert (result.driver, result.pool, result.device) == (pool.driver, pool.pool, pool.names[0]), where
    container_before = k8s.core.read_namespaced_pod("survivor", ns).status.container_statuses[0]
    prepared = checks.kubelet_dra_metrics(k8s, plugin.node, plugin.driver)["in_use"]
    assert prepared >= 1, f"{where}: the kubelet counts no prepared claim of the driver while the pod runs"
    specs = cdi_specs.cdi_specs_of(plugin.cdi_dir, claim.metadata.uid) if plugin.cdi_dir else []

    plugin.crash_and_restart()  # SIGKILL: no clean shutdown, its state only in its checkpoint

    pod = k8s.core.read_namespaced_pod("survivor", ns)
    container = pod.status.container_statuses[0]
    assert pod.status.phase == "Running", f"{where}: pod survivor is {pod.status.phase} after the plugin restart"
    assert (container.container_id, container.restart_count) == (container_before.container_id, 0), (
        f"{where}: the container was replaced or restarted when the plugin restarted: {container_before.container_id} "
        f"-> {container.container_id}, restarts {container.restart_count}")
    now = checks.kubelet_dra_metrics(k8s, plugin.node, plugin.driver)["in_use"]
    assert now >= 1, f"{where}: the kubelet no longer counts the claim as prepared after the plugin restart"
    lost = [p for p in specs if not p.exists()]
    assert not lost, f"{where}: the restarted plugin removed the CDI spec(s) of a claim still in use: {lost}"
    claim = k8s.resource.read_namespaced_resource_claim(claim.metadata.name, ns)
    assert claim.status.allocation and pod.metadata.uid in {r.uid for r in claim.status.reserved_for or []}, (
        f"{where}: the claim lost its allocation or its reservation for pod survivor")

    # The restarted plugin still knows the claim: unprepare succeeds (the pod goes) and cleans up.
    k8s.core.delete_namespaced_pod("survivor", ns)
    _pod_gone(k8s, ns, "survivor", where)
    if plugin.cdi_dir is not None:
        try:
            wait.until(f"the CDI spec(s) of {where} to be removed by NodeUnprepareResources",
                       lambda: not cdi_specs.cdi_specs_of(plugin.cdi_dir, claim.metadata.uid), 60)
        except wait.WaitTimeout:
            left = cdi_specs.cdi_specs_of(plugin.cdi_dir, claim.metadata.uid)
            pytest.fail(f"{where}: after the plugin restart, NodeUnprepareResources left CDI spec(s) behind: "
                        f"{', '.join(map(str, left))}", pytrace=False)
    # ... and prepares a new claim.
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("newcomer", "one")))
    checks.containers_running(k8s, ns, "newcomer", timeout=POD_TIMEOUT)


@pytest.mark.disrupts_node
def test_pod_comes_back_with_its_devices_after_a_node_reboot(k8s: Clients, dra_namespace, plugin_under_test):
    """KP-RESTART-CDI (docs/contract.md) through a real kubelet. The node reboots while a pod's claim is
    prepared: every process of the node is killed, the plugin's with them, and the tmpfs places are
    emptied, the CDI directory among them; disks stay (the kubelet's and the plugin's checkpoints). The
    kubelet, back, makes the pod's sandbox and container anew and asks the plugin to prepare the claim
    again; the plugin must make every CDI device it answers resolve again, so the pod runs with a new
    container. A plugin that answers from its checkpoint without writing the claim's CDI spec again leaves
    the pod in CreateContainerError (kubernetes/kubernetes#141433)."""
    ns, plugin = dra_namespace, plugin_under_test
    if plugin.reboot_node is None:
        pytest.skip(f"the harness cannot reboot node {plugin.node}: it reboots the real nodes it runs (the local "
                    "backend's), and the plugins it starts there (spec.kubeletPlugin)")
    pool, claim, result, where = _running_with_a_claim(k8s, ns, plugin, "rebooted")
    before = k8s.core.read_namespaced_pod("rebooted", ns).status.container_statuses[0]
    specs_before = cdi_specs.cdi_specs_of(plugin.cdi_dir, claim.metadata.uid) if plugin.cdi_dir else []

    plugin.reboot_node()

    def container():
        statuses = k8s.core.read_namespaced_pod("rebooted", ns).status.container_statuses or []
        return statuses[0] if statuses else None

    refused: dict[str, Any] = {}  # CDI refusals seen: when the first was, what the last said

    def back():
        now = container()
        if now is not None and now.state.running and now.container_id != before.container_id:
            return now
        waiting = now.state.waiting if now is not None and now.state else None
        if waiting is not None and waiting.reason == "CreateContainerError" and "CDI" in (waiting.message or ""):
            refused.setdefault("since", time.monotonic())
            refused["message"] = waiting.message
        # containerd's CDI cache may lag a spec written a moment ago, and the kubelet's next try then succeeds;
        # refused for this long (the kubelet retries after 10 s, 20 s, ...; CrashLoopBackOff between) it stays so
        return "refused" if refused and time.monotonic() - refused["since"] > CDI_REFUSED_FOR else None

    try:
        outcome = wait.until(f"pod {ns}/rebooted to run a new container after the reboot of {plugin.node}", back,
                             REBOOT_TIMEOUT)
    except wait.WaitTimeout:
        outcome = "refused" if refused else None
    if outcome is None or outcome == "refused":
        now = container()
        waiting = now.state.waiting if now is not None and now.state else None
        state = f"{waiting.reason}: {waiting.message}" if waiting else f"container status {now}"
        if refused:
            state = f"CreateContainerError: {refused['message']}; now {state}"
        left = sorted(p.name for p in plugin.cdi_dir.iterdir()) if plugin.cdi_dir and plugin.cdi_dir.is_dir() else []
        what = (f"{where}: after the node rebooted the pod's container does not run ({state}); the node's CDI "
                f"directory holds {left or 'nothing'}\n{wait.describe_namespace(k8s, ns)}")
        if outcome == "refused":
            pytest.fail(rules.failure("KP-RESTART-CDI", what), pytrace=False)
        pytest.fail(what, pytrace=False)
    metrics = checks.kubelet_dra_metrics(k8s, plugin.node, plugin.driver)  # the new kubelet's counts only
    assert metrics.get("NodePrepareResources/OK", 0) >= 1, (
        f"{where}: the kubelet that came back made no successful NodePrepareResources call to the driver: {metrics}")
    if specs_before:
        assert cdi_specs.cdi_specs_of(plugin.cdi_dir, claim.metadata.uid), (
            f"{where}: the pod runs, but no CDI spec of the claim is back in {plugin.cdi_dir}")
    claim = k8s.resource.read_namespaced_resource_claim(claim.metadata.name, ns)
    assert [(r.driver, r.pool, r.device) for r in claim.status.allocation.devices.results] == [
        (result.driver, result.pool, result.device)], f"{where}: the claim's allocation changed across the reboot"

    # Unprepare still works after it (the pod goes), and the plugin prepares a new claim.
    k8s.core.delete_namespaced_pod("rebooted", ns)
    _pod_gone(k8s, ns, "rebooted", where)
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("newcomer", "one")))
    checks.containers_running(k8s, ns, "newcomer", timeout=POD_TIMEOUT)


def _slices_on(k8s: Clients, node: str, driver: str | None = None) -> dict[str, tuple[str, str]]:
    """{slice name: (driver, uid)} of the ResourceSlices published for `node` (of `driver`)."""
    selector = f"spec.nodeName={node}" + (f",spec.driver={driver}" if driver else "")
    return {s.metadata.name: (s.spec.driver, s.metadata.uid)
            for s in k8s.resource.list_resource_slice(field_selector=selector).items}


@pytest.mark.long_wait("the kubelet's 30 s wiping delay")
def test_kubelet_wipes_the_slices_of_a_plugin_that_is_gone(request, k8s: Clients, cluster_facts, cluster_objects,
                                                            unique_name, record_property):
    vendor = vendor_driver(request.config)
    if vendor is None:
        pytest.skip("vendor mode: the fake driver's slices come from its control-plane half, not its plugin; its "
                    "check is test_kubelet_node.py::test_kubelet_wipes_slices_of_a_driver_that_is_gone")
    plugins = request.getfixturevalue("vendor_plugins")
    request.getfixturevalue("vendor_turn")  # nobody uses (or checks) the vendor's devices while they are gone
    candidates = [(p, d) for p in plugins if p.node in cluster_facts.kubelet_nodes for d in p.drivers
                  if _slices_on(k8s, p.node, d)]
    if not candidates:
        pytest.skip(f"no plugin the harness runs from {vendor.source} has ResourceSlices on a node run by a real "
                    f"kubelet (plugins: {', '.join(f'{p.name} for {list(p.drivers)}' for p in plugins)})")
    plugin, driver = candidates[0]
    node = plugin.node
    # A slice of another driver on the same node, published by no plugin: the kubelet must leave it alone.
    bystander = unique_name("bystander")
    cluster_objects.resource_slice(objects.resource_slice(bystander, f"{bystander[:40]}.dra-harness.example", node,
                                                          [objects.gpu_device("gpu-0")]))
    mine = _slices_on(k8s, node, driver)
    others = {name: owner for name, owner in _slices_on(k8s, node).items() if owner[0] not in plugin.drivers}
    where = f"driver {driver}, node {node}, slice(s) {', '.join(sorted(mine))} (plugin log {plugin.log})"

    victim = plugin.running()
    assert victim is not None, (f"{where}: the harness finds no live process of the plugin it started (record "
                                f"{plugin.cluster_dir / 'pids' / (plugin.name + '.json')}): it cannot kill it")
    survivors = plugin.stop(kill=True)  # gone for good, as far as the kubelet can tell: no clean shutdown
    assert not survivors, f"{where}: {'; '.join(survivors)}"
    stopped = time.monotonic()
    try:
        try:
            wait.until(f"the kubelet to delete the ResourceSlices of {where}", lambda: not _slices_on(k8s, node, driver),
                       WIPE_TIMEOUT)
        except wait.WaitTimeout:
            left = sorted(_slices_on(k8s, node, driver))
            pytest.fail(f"{where}: the kubelet did not delete the slices {', '.join(left)} {WIPE_TIMEOUT} s after the "
                        f"plugin was killed (its wiping delay is {WIPING_DELAY} s)", pytrace=False)
        record_property("dra_wiped_after_seconds", round(time.monotonic() - stopped, 1))
        now = _slices_on(k8s, node)
        wiped = {name: owner for name, owner in others.items() if now.get(name) != owner}
        assert not wiped, (f"{where}: the kubelet deleted (or replaced) ResourceSlices of other drivers on node {node} "
                           f"too: {', '.join(f'{n} of {o[0]}' for n, o in sorted(wiped.items()))}")
    finally:
        if plugin.running() is None:
            plugin.start(wait_for_slices=True)  # the rest of the run needs the driver back
    republished = _slices_on(k8s, node, driver)
    assert republished, f"{where}: the plugin, started again, published no ResourceSlice of {driver} on node {node}"
