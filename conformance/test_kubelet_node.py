"""The node half of DRA, on a node run by a real kubelet: plugin registration, NodePrepareResources
and CDI injection into a real container, NodeUnprepareResources, device health in the pod's status,
and the kubelet wiping a dead driver's slices. (A plugin crash and restart, for any driver, is
test_kubelet_plugin_lifecycle.py's.)

Each test runs the fake driver for its own driver names on the real node (`real_node` fixture): the
control-plane half publishes the `tiny` profile there, the kubelet plugin (one process per driver
name) registers with the kubelet and writes CDI specs that containerd injects.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from conformance import checks, objects
from fake_devices import faults
from fake_devices.kubeletplugin import health as health_messages
from fake_devices.kubeletplugin.generated import podresources_v1_pb2
from harness.k8s import wait
from harness.k8s.client import Clients
from harness.k8s.nodes import SHELL_IMAGE

pytestmark = [pytest.mark.needs_kubelet,
              pytest.mark.fake_devices("a kubelet plugin the harness starts, kills, restarts and stops, and fault "
                                       "injection (the fake driver's plugins on the real node)")]

FAULT_KEY = "dra-harness.x-k8s.io/fault"
# generated stubs: their message classes are built at import time, out of mypy's sight
PODRESOURCES: Any = podresources_v1_pb2


def devices_in_env(env: dict[str, str]) -> set[tuple[str, str, str, str]]:
    """(driver, pool, device, claim uid) of every device the CDI edits describe."""
    prefixes = {key[:-len("_CLAIM_UID")] for key in env if key.endswith("_CLAIM_UID")}
    return {(env[f"{p}_DRIVER"], env[f"{p}_POOL"], env[f"{p}_DEVICE"], env[f"{p}_CLAIM_UID"]) for p in prefixes}


@pytest.fixture
def node_driver(k8s: Clients, real_node, fake_driver, dra_namespace):
    """The fake driver publishing `tiny` on the real node, with its kubelet plugins running there."""
    fake = fake_driver({real_node.name: "tiny"})
    real_node.run_for(fake)
    gpu_class = f"{fake.config.instance}-gpu"
    k8s.resource.create_namespaced_resource_claim_template(
        dra_namespace, objects.claim_template("one-gpu", gpu_class))
    return fake


def _prepared_pod(k8s: Clients, namespace: str, node: str, pod: str):
    """Start a shell pod with a claim from `one-gpu` on the real node; (claim, driver) once the
    container has printed its environment (so the claim was prepared and injected)."""
    k8s.core.create_namespaced_pod(namespace, objects.shell_pod(pod, node, "one-gpu"))
    checks.printed_env(k8s, namespace, pod, timeout=90)
    claim = checks.pod_claim(k8s, namespace, pod)
    return claim, claim.status.allocation.devices.results[0].driver


def _wait_gone(k8s: Clients, namespace: str, pod: str, timeout: float = 60) -> None:
    wait.until(f"pod {pod} to be gone (the kubelet confirms only after unprepare)",
               lambda: pod not in {p.metadata.name for p in k8s.core.list_namespaced_pod(namespace).items},
               timeout, diagnostics=lambda: wait.describe_namespace(k8s, namespace))


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_prepared_pod_sees_exactly_its_devices(k8s: Clients, dra_namespace, real_node, node_driver):
    ns = dra_namespace
    k8s.core.create_namespaced_pod(ns, objects.shell_pod("sees", real_node.name, "one-gpu"))
    checks.running(k8s, ns, "sees", timeout=90)
    claim = checks.pod_claim(k8s, ns, "sees")
    results = claim.status.allocation.devices.results
    assert len(results) == 1
    allocated = {(r.driver, r.pool, r.device, claim.metadata.uid) for r in results}

    env = checks.printed_env(k8s, ns, "sees")
    # Exactly the allocated device: not another one, not one more.
    assert devices_in_env(env) == allocated, env
    prefix = next(k[:-len("_CLAIM_UID")] for k in env if k.endswith("_CLAIM_UID"))
    assert env[f"{prefix}_CLAIM"] == f"{ns}/{claim.metadata.name}"
    assert env[f"{prefix}_REQUEST"] == "gpu"
    # The attributes the container sees are the ones published for that device.
    device = checks.published_device(k8s, results[0].driver, results[0].pool, results[0].device)
    assert env[f"{prefix}_ATTR_UUID"] == checks.attribute_value(device, "uuid")
    assert env[f"{prefix}_ATTR_NUMA_NODE"] == str(checks.attribute_value(device, objects.NUMA_NODE))
    # The kubelet prepared it through the plugin: one CDI spec, for this claim, and the kubelet's count.
    specs = real_node.cdi_specs(results[0].driver)
    assert len(specs) == 1 and claim.metadata.uid in specs[0].name
    assert checks.kubelet_dra_metrics(k8s, real_node.name, results[0].driver)["in_use"] == 1


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_unprepare_cleans_up_when_the_pod_goes(k8s: Clients, dra_namespace, real_node, node_driver):
    ns = dra_namespace
    claim, driver = _prepared_pod(k8s, ns, real_node.name, "goes")
    assert len(real_node.cdi_specs(driver)) == 1

    k8s.core.delete_namespaced_pod("goes", ns)
    _wait_gone(k8s, ns, "goes")
    # NodeUnprepareResources ran: the CDI spec is gone and the kubelet counts no prepared claim.
    assert real_node.cdi_specs(driver) == []
    assert checks.kubelet_dra_metrics(k8s, real_node.name, driver)["in_use"] == 0
    checks.claim_deleted(k8s, ns, claim.metadata.name)


class HealthWatch:
    """A pod on the real node whose claim tolerates the fault's NoExecute taint (so it stays when its device
    is made unhealthy), and the kubelet's report of its device in the container's allocatedResourcesStatus."""

    def __init__(self, k8s: Clients, namespace: str, real_node, fake_driver):
        self.k8s, self.namespace = k8s, namespace
        self.fake = fake_driver({real_node.name: "tiny"})
        real_node.run_for(self.fake)
        # effect NoExecute named: kube-controller-manager v1.37.2 does not count a toleration without an effect
        # against a NoExecute device taint (docs/conformance.md "Found upstream")
        gpu_request = objects.tolerating(objects.request(f"{self.fake.config.instance}-gpu"),
                                         objects.device_toleration(FAULT_KEY, operator="Exists", effect="NoExecute"))
        k8s.resource.create_namespaced_resource_claim_template(
            namespace, objects.claim_template("tolerant", requests=[gpu_request]))
        k8s.core.create_namespaced_pod(namespace, objects.shell_pod("health", real_node.name, "tolerant"))
        checks.running(k8s, namespace, "health", timeout=90)
        self.node = real_node.name
        self.device = checks.pod_claim(k8s, namespace, "health").status.allocation.devices.results[0].device

    def reported(self) -> set[tuple[str, str | None]]:
        """(health, message) of each resource the kubelet lists for the pod's claim."""
        statuses = self.k8s.core.read_namespaced_pod("health", self.namespace).status.container_statuses or []
        for entry in (statuses[0].allocated_resources_status or []) if statuses else []:
            if entry.name == "claim:gpu" or entry.name.startswith("claim:gpu/"):
                return {(r.health, r.message) for r in entry.resources or []}
        return set()

    def assert_not_evicted(self) -> None:
        pod = self.k8s.core.read_namespaced_pod("health", self.namespace)
        assert pod.metadata.deletion_timestamp is None and pod.status.phase == "Running", \
            f"pod health was evicted although its claim tolerates {FAULT_KEY}:\n" + \
            wait.describe_namespace(self.k8s, self.namespace)

    def fault(self, kind: str | None) -> None:
        faults.set_fault(self.k8s.core, self.namespace, self.fake.config.faults_configmap, self.node, self.device,
                         kind)

    def wait_for(self, what: str, expected: set[tuple[str, str | None]] | None = None, health: str | None = None):
        def check():
            now = self.reported()
            if expected is not None:
                return now == expected
            return bool(now) and {h for h, _ in now} == {health}

        wait.until(f"device {self.device} of pod health to be reported {what}", check, 60,
                   diagnostics=lambda: f"reported: {self.reported()}\n" + wait.describe_namespace(self.k8s,
                                                                                                 self.namespace))


@pytest.mark.dra_feature("ResourceHealthStatus", maturity="beta")
def test_device_health_reaches_allocated_resources_status(k8s: Clients, dra_namespace, real_node, fake_driver):
    watch = HealthWatch(k8s, dra_namespace, real_node, fake_driver)
    watch.wait_for("Healthy", health="Healthy")
    watch.fault("unhealthy")
    watch.wait_for("Unhealthy", health="Unhealthy")
    watch.assert_not_evicted()
    watch.fault(None)
    watch.wait_for("Healthy again", health="Healthy")


# What the fake plugin's DRAResourceHealth stream says (fake_devices/kubeletplugin/health.py).
HEALTHY_MESSAGE = "no fault injected"


@pytest.mark.dra_feature("ResourceHealthStatusMessage", maturity="beta")
def test_the_plugins_health_message_reaches_allocated_resources_status(k8s: Clients, dra_namespace, real_node,
                                                                      fake_driver):
    """The kubelet copies DeviceHealth.message (dra-health api.proto) into the resource's `message`
    (k8s.io/kubernetes@v1.37.2 pkg/kubelet/cm/dra/manager.go: Message set where ResourceHealthStatusMessage is on
    and the message is not empty)."""
    watch = HealthWatch(k8s, dra_namespace, real_node, fake_driver)
    watch.wait_for("Healthy with the plugin's message", {("Healthy", HEALTHY_MESSAGE)})
    watch.fault("unhealthy")
    watch.wait_for("Unhealthy with the plugin's message", {("Unhealthy", health_messages.FAULT_HEALTH["unhealthy"][1])})
    watch.assert_not_evicted()
    watch.fault(None)
    watch.wait_for("Healthy with the plugin's message again", {("Healthy", HEALTHY_MESSAGE)})


@pytest.mark.dra_feature("ResourceHealthStatusMessage", maturity="beta")
def test_a_new_message_alone_updates_the_status_while_the_health_stays(k8s: Clients, dra_namespace, real_node,
                                                                       fake_driver):
    """A degraded device stays HEALTHY in the plugin's stream with another message: the kubelet counts a
    change of the message alone as a change (k8s.io/kubernetes@v1.37.2 pkg/kubelet/cm/dra/healthinfo.go) and
    the pod's status shows the new message, health unchanged."""
    watch = HealthWatch(k8s, dra_namespace, real_node, fake_driver)
    watch.wait_for("Healthy with the plugin's message", {("Healthy", HEALTHY_MESSAGE)})
    watch.fault("degraded")
    degraded = health_messages.FAULT_HEALTH["degraded"]
    assert degraded[0] == "HEALTHY", degraded
    watch.wait_for("Healthy with the degraded message", {("Healthy", degraded[1])})


def _pod_resources(real_node, pod: str, namespace: str):
    """The kubelet's PodResources `Get` for a pod (None when the kubelet knows no such pod), asked by the node's
    handle: over the socket on the local backend, from a plugin pod on a kind worker."""
    answer = real_node.pod_resources(pod, namespace)
    return None if answer is None else PODRESOURCES.GetPodResourcesResponse.FromString(answer).pod_resources


def _claim_resources(resources, container: str) -> list[tuple[str, str, tuple[str, str, str], tuple[str, ...]]]:
    """(claim, namespace, (driver, pool, device), CDI names) for each device the container's claims hold."""
    found = []
    for c in resources.containers:
        if c.name != container:
            continue
        for dynamic in c.dynamic_resources:
            for r in dynamic.claim_resources:
                found.append((dynamic.claim_name, dynamic.claim_namespace, (r.driver_name, r.pool_name, r.device_name),
                              tuple(d.name for d in r.cdi_devices)))
    return found


def _gone_from_pod_resources(real_node, pod: str, namespace: str) -> bool:
    resources = _pod_resources(real_node, pod, namespace)
    return resources is None or not _claim_resources(resources, "main")


@pytest.mark.dra_feature("KubeletPodResourcesDynamicResources", maturity="ga")
def test_pod_resources_api_lists_the_devices_of_a_pods_claim(k8s: Clients, dra_namespace, real_node, node_driver):
    """The kubelet's PodResources API reports, per container, each DRA claim it uses with the allocated
    devices and their CDI names (k8s.io/kubelet@v0.37.2 pkg/apis/podresources/v1/api.proto DynamicResource,
    ClaimResource; KEP-3695), what monitoring agents read to attribute a device to a pod."""
    ns = dra_namespace
    claim, driver = _prepared_pod(k8s, ns, real_node.name, "listed")
    (result,) = claim.status.allocation.devices.results
    resources = wait.until(f"the kubelet on {real_node.name} to report pod listed in its PodResources API",
                           lambda: _pod_resources(real_node, "listed", ns), 30)
    (entry,) = _claim_resources(resources, "main")
    name, namespace, device, cdi = entry
    assert (name, namespace, device) == (claim.metadata.name, ns, (result.driver, result.pool, result.device)), entry
    # the CDI names are those the plugin returned from NodePrepareResources, i.e. of its spec on the node
    specs = [yaml.safe_load(path.read_text()) for path in real_node.cdi_specs(driver)]  # JSON or YAML
    spec_names = {f"{spec['kind']}={d['name']}" for spec in specs for d in spec.get("devices") or []}
    assert cdi and set(cdi) <= spec_names, (cdi, spec_names)


@pytest.mark.dra_feature("KubeletPodResourcesDynamicResources", maturity="ga")
def test_pod_resources_api_forgets_the_claim_when_the_pod_goes(k8s: Clients, dra_namespace, real_node, node_driver):
    ns = dra_namespace
    _prepared_pod(k8s, ns, real_node.name, "leaves")
    k8s.core.create_namespaced_pod(ns, objects.pod_on_node("plain", real_node.name, SHELL_IMAGE,
                                                           command=objects.IDLE))
    checks.containers_running(k8s, ns, "plain", timeout=90)
    plain = _pod_resources(real_node, "plain", ns)
    # a pod without claims is listed with no dynamic resources
    assert plain is not None and _claim_resources(plain, "main") == [], plain
    assert _claim_resources(_pod_resources(real_node, "leaves", ns), "main")
    k8s.core.delete_namespaced_pod("leaves", ns)
    _wait_gone(k8s, ns, "leaves")
    wait.until(f"the kubelet on {real_node.name} to drop pod leaves from its PodResources API",
               lambda: _gone_from_pod_resources(real_node, "leaves", ns), 30)


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
@pytest.mark.long_wait("the kubelet's 30 s wiping delay")
def test_kubelet_wipes_slices_of_a_driver_that_is_gone(k8s: Clients, real_node, node_driver):
    fake = node_driver
    gpu, others = fake.drivers.gpu, [d for d in fake.drivers.all() if d != fake.drivers.gpu]

    def slices(driver: str) -> list:
        return k8s.resource.list_resource_slice(
            field_selector=f"spec.driver={driver},spec.nodeName={real_node.name}").items

    assert slices(gpu) and all(slices(d) for d in others)
    # The control-plane half stops republishing; then the node half goes away for good.
    fake.stop(delete_slices=False)
    real_node.stop(gpu)
    # The kubelet waits 30 s for the plugin to come back (defaultWipingDelay), then deletes its slices.
    wait.until(f"the kubelet to delete the slices of {gpu} on {real_node.name}", lambda: not slices(gpu), 90)
    # Drivers whose plugins still run keep theirs.
    assert all(slices(d) for d in others)
