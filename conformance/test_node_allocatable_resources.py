"""Node allocatable resources of devices (DRANodeAllocatableResources, alpha in 1.37, off by default).

A device may say how much of the node's own allocatable resources (cpu, memory, hugepages-*) its
allocation takes: `nodeAllocatableResources.<resource>.mapping` (deviceMultiplier per allocated device,
or capacityKey x capacityMultiplier of the consumed capacity) and `.overhead` (perPod, perContainer). The
scheduler's DynamicResources Filter adds that to the pod's own requests and checks the sum against what
the node has left ("Insufficient cpu"), records it in the pod's
`status.nodeAllocatableResourceClaimStatuses` (PreBind), and NodeResourcesFit counts that status for the
pods already on the node. The API accepts only node allocatable resource names as keys, and the
NodeDeclaredFeatureValidator admission plugin refuses such a device for a node that does not list
DRANodeAllocatableResources in `status.declaredFeatures`.

Sources: k8s.io/api@v0.37.2 resource/v1/types.go (Device.NodeAllocatableResources,
NodeAllocatableResource, NodeAllocatableMapping) and core/v1/types.go
(PodStatus.NodeAllocatableResourceClaimStatuses); k8s.io/kubernetes@v1.37.2
pkg/scheduler/framework/plugins/dynamicresources/nodeallocatabledynamicresources.go
(calculateAndCheckNodeAllocatableResources, nodeFitsResources), pkg/scheduler/framework/types.go
(PodInfo.CalculateResource: UseDRANodeAllocatableResourceClaimStatus),
plugin/pkg/admission/nodedeclaredfeatures/admission.go (validateNodeAllocatableDRADeclaredFeature),
pkg/apis/resource/validation/validation.go (validateNodeAllocatableResources) with
pkg/apis/core/helper/helpers.go (IsNodeAllocatableResourceName), test/integration/dra/node_allocatable_resources.go.

The arithmetic needs a node whose allocatable nobody else uses: each test creates a simulated (KWOK) node
of its own, with cpu 4, memory 8Gi, pods 110, the declared feature in its status (KWOK keeps it) and a
taint only the test's pods tolerate, and deletes it again. The devices are test-owned slices of a made-up
driver (no kubelet plugin; KWOK runs the pods).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from conformance import checks, objects
from conformance.conftest import EPHEMERAL_LABEL, KWOK_ANNOTATION
from harness.k8s import api, errors, wait
from harness.k8s.nodes import is_ready, pods_to_remove_with

pytestmark = [pytest.mark.dra_feature("DRANodeAllocatableResources", maturity="alpha")]

FEATURE = "DRANodeAllocatableResources"  # the declared node feature (k8s.io/component-helpers nodedeclaredfeatures)
HOSTNAME = "kubernetes.io/hostname"
TAINT = "dra-harness.x-k8s.io/node-allocatable-test"
NODE_CPU = 4
INSUFFICIENT_CPU = "Insufficient cpu"  # NodeResourcesFit and the DRA filter's nodeFitsResources alike


def _node_manifest(name: str) -> dict:
    """A KWOK-run node (the annotation makes KWOK manage it) like the local backend's, but small."""
    capacity = {"cpu": str(NODE_CPU), "memory": "8Gi", "pods": "110"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                     "labels": {HOSTNAME: name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                                "type": "kwok", EPHEMERAL_LABEL: "true"}},
        "spec": {"taints": [{"key": TAINT, "value": name, "effect": "NoSchedule"}]},
        "status": {"capacity": capacity, "allocatable": capacity, "declaredFeatures": [FEATURE],
                   "nodeInfo": {"kubeletVersion": "kwok", "kubeProxyVersion": "", "operatingSystem": "linux",
                                "architecture": "amd64", "osImage": "kwok", "kernelVersion": "kwok",
                                "containerRuntimeVersion": "kwok", "machineID": name, "bootID": "",
                                "systemUUID": name}},
    }


@pytest.fixture
def small_node(k8s, dra_namespace, unique_name, simulated_nodes):
    """A Ready KWOK node of this test only, declaring DRANodeAllocatableResources; deleted at teardown
    (its pods first). `simulated_nodes` skips where no KWOK controller runs such nodes."""
    name = unique_name("nar")
    k8s.core.create_node(_node_manifest(name))
    try:
        def ready():
            found = k8s.core.read_node(name)
            return found if is_ready(found) else None

        node = wait.until(f"node {name} to be Ready", ready, 60)
        if FEATURE not in (node.status.declared_features or []):
            # a status set at create is dropped where NodeDeclaredFeatures is off; the status subresource too
            k8s.core.patch_node_status(name, {"status": {"declaredFeatures": [FEATURE]}})
            node = k8s.core.read_node(name)
        if FEATURE not in (node.status.declared_features or []):
            pytest.skip(f"node {name}: status.declaredFeatures {node.status.declared_features} after setting "
                        f"[{FEATURE}] (feature gate NodeDeclaredFeatures off?)")
        yield name
    finally:
        def pods_on_it() -> list:
            return pods_to_remove_with(k8s.core, name)

        for pod in pods_on_it():  # only this test's pods tolerate the node's taint
            wait.ignore_not_found(k8s.core.delete_namespaced_pod, pod.metadata.name, pod.metadata.namespace)
        wait.until(f"the pods on node {name} to be gone", lambda: not pods_on_it(), 60)
        wait.ignore_not_found(k8s.core.delete_node, name)


def _cpu_device(name: str, multiplier: str = "2", key: str = "cpu") -> dict:
    return {"name": name, "nodeAllocatableResources": {key: {"mapping": {"deviceMultiplier": multiplier}}}}


def _slice(name: str, driver: str, node: str, devices: list[dict]) -> dict:
    return objects.resource_slice(name, driver, node, devices)


def _create_slice(k8s, cluster_objects, body: dict):
    """Create the slice; the admission plugin reads nodes from an informer, which may not have seen a
    node created a moment ago ("not found" / "does not support"): retried until the deadline."""
    def attempt():
        try:
            return cluster_objects.resource_slice(body)
        except errors.Forbidden as err:
            if body["spec"]["nodeName"] in (err.body or ""):
                return None
            raise

    created = wait.until(f"ResourceSlice {body['metadata']['name']} to be admitted", attempt, 30)
    if not any(d.node_allocatable_resources for d in created.spec.devices or []):
        pytest.skip(f"feature gate {FEATURE} is off in the cluster under test "
                    f"(ResourceSlice {created.metadata.name}: the API server dropped nodeAllocatableResources)")
    return created


class Setup:
    """The test's driver, DeviceClass and one-slice pool on its small node."""

    def __init__(self, k8s, cluster_objects, unique_name, node: str, devices: list[dict]):
        self.k8s, self.node = k8s, node
        self.driver = unique_name("nar") + ".example.com"
        self.device_class = cluster_objects.device_class(objects.device_class(unique_name("nar"),
                                                                              self.driver)).metadata.name
        self.slice = _create_slice(k8s, cluster_objects, _slice(unique_name("nar"), self.driver, node, devices))

    def template(self, ns: str, name: str) -> None:
        self.k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(name, self.device_class))

    def pod(self, ns: str, name: str, cpu: str, template: str | None = None) -> None:
        claims = [objects.claim_ref("dev", template=template)] if template else None
        body = objects.pod(name, [objects.container("main", limits={"cpu": cpu}, claims=["dev"] if template else ())],
                           resource_claims=claims, node_selector={HOSTNAME: self.node})
        body["spec"]["tolerations"] = [{"key": TAINT, "operator": "Equal", "value": self.node, "effect": "NoSchedule"}]
        self.k8s.core.create_namespaced_pod(ns, body)


@pytest.fixture
def setup(k8s, cluster_objects, unique_name, small_node):
    def make(devices: list[dict]) -> Setup:
        return Setup(k8s, cluster_objects, unique_name, small_node, devices)

    return make


def _recorded(k8s, ns: str, pod: str) -> dict[str, dict]:
    """{claim: {"containers": [...], "mapping": {resource: Decimal}}} from the pod's
    status.nodeAllocatableResourceClaimStatuses, once the scheduler wrote it."""
    def statuses():
        return k8s.core.read_namespaced_pod(pod, ns).status.node_allocatable_resource_claim_statuses

    found = wait.until(f"pod {pod} to record status.nodeAllocatableResourceClaimStatuses", statuses, 30,
                       diagnostics=lambda: wait.describe_namespace(k8s, ns))
    return {s.resource_claim_name: {"containers": sorted(s.containers or []),
                                    "mapping": {m.name: api.parse_quantity(m.quantity) for m in s.mapping or []},
                                    "overhead": s.overhead or []}
            for s in found}


def _insufficient_cpu(k8s, ns: str, pod: str, node: str) -> str:
    condition = checks.unschedulable(k8s, ns, pod)
    assert checks.every_node_says(condition.message, INSUFFICIENT_CPU, [node]), f"pod {pod}: {condition.message}"
    return condition.message


def test_device_cpu_counts_against_the_node_for_the_pod_and_those_after_it(k8s, dra_namespace, setup):
    ns = dra_namespace
    s = setup([_cpu_device("cores-0")])  # each allocated device takes 2 of the node's cpu
    s.template(ns, "cores")
    s.pod(ns, "a", "1", template="cores")
    checks.running(k8s, ns, "a", timeout=120)
    claim = checks.pod_claim(k8s, ns, "a", claim="dev")
    devices = [(r.driver, r.pool, r.device) for r in claim.status.allocation.devices.results]
    assert devices == [(s.driver, s.node, "cores-0")], f"claim {claim.metadata.name}: {devices}"
    recorded = _recorded(k8s, ns, "a")
    assert recorded == {claim.metadata.name: {"containers": ["main"], "mapping": {"cpu": Decimal(2)},
                                              "overhead": []}}, f"pod a on node {s.node}: {recorded}"

    # a's own cpu 1 + its device's 2 + 2 more > 4: refused (without the device's share, 1 + 2 would fit) ...
    s.pod(ns, "b", "2")
    _insufficient_cpu(k8s, ns, "b", s.node)
    # ... until a is gone.
    k8s.core.delete_namespaced_pod("a", ns)
    checks.running(k8s, ns, "b", timeout=120)


def test_pod_whose_requests_and_device_cpu_exceed_the_node_is_unschedulable(k8s, dra_namespace, setup):
    ns = dra_namespace
    s = setup([_cpu_device("cores-0")])
    s.template(ns, "cores")
    # 3 + 2 > 4: NodeResourcesFit alone (3 <= 4) lets it pass; the DRA filter adds the device's 2.
    s.pod(ns, "too-big", "3", template="cores")
    message = _insufficient_cpu(k8s, ns, "too-big", s.node)
    claim = checks.pod_claim(k8s, ns, "too-big", claim="dev")
    assert claim.status is None or claim.status.allocation is None, (
        f"claim {claim.metadata.name} of pod too-big was allocated ({message}): {claim.status.allocation}")
    assert not k8s.core.read_namespaced_pod("too-big", ns).status.node_allocatable_resource_claim_statuses

    # 2 + 2 == 4 fits on the same node and device.
    s.pod(ns, "exact", "2", template="cores")
    checks.running(k8s, ns, "exact", timeout=120)
    (entry,) = _recorded(k8s, ns, "exact").values()
    assert entry["mapping"] == {"cpu": Decimal(2)}, f"pod exact on node {s.node}: {entry}"


def test_api_and_admission_refuse_bad_node_allocatable_resources(k8s, unique_name, small_node, simulated_node):
    """Dry-run creates: validation and admission run in full, nothing is stored."""
    driver = unique_name("nar") + ".example.com"
    create = k8s.resource.create_resource_slice

    def body(node: str, key: str = "cpu") -> dict:
        return _slice(unique_name("nar"), driver, node, [_cpu_device("cores-0", key=key)])

    def accepted() -> Any:
        try:
            return create(body(small_node), dry_run="All")
        except errors.Forbidden as err:  # the admission plugin's informer may not have seen the new node yet
            if small_node in (err.body or ""):
                return None
            raise

    created = wait.until(f"a slice for node {small_node} to be admitted", accepted, 30)
    if not created.spec.devices[0].node_allocatable_resources:
        pytest.skip(f"feature gate {FEATURE} is off in the cluster under test "
                    "(the API server dropped nodeAllocatableResources)")

    undeclared = k8s.core.read_node(simulated_node).status.declared_features or []
    if FEATURE in undeclared:
        pytest.skip(f"simulated node {simulated_node} declares {FEATURE}: no node to be refused")
    message = checks.rejected(create, body(simulated_node), status=403, dry_run="All")
    assert f'node "{simulated_node}" does not support {FEATURE} feature' in message, message

    field = "spec.devices[0].nodeAllocatableResources"
    for key in ("example.com/foo", "ephemeral-storage"):
        # validation (422) comes before admission: the same answer on the declaring node
        message = checks.rejected(create, body(small_node, key), dry_run="All")
        assert f'{field}[{key}]: Invalid value: "{key}": must be a node allocatable resource name' in message, message


# --- the fake driver's GPUs with a cpu share (a profile's nodeAllocatable) ---------------------------

def _gpu_profile(tmp_path) -> str:
    return objects.node_profile(tmp_path, "gpu-with-host-cpu", """  gpus:
  - model: T4
    count: 2
    attach: [{pcieRoot: pci0000:10}]
    nodeAllocatable: {cpu: {perDevice: 2}}   # each allocated GPU takes 2 of the node's cpu
""")


@pytest.mark.fake_devices("a profile whose GPUs take a share of the node's cpu")
def test_the_fake_drivers_gpu_cpu_share_counts_against_the_node(k8s, dra_namespace, cluster_objects, unique_name,
                                                                  fake_driver, small_node, tmp_path):
    ns, node = dra_namespace, small_node
    # The admission plugin reads nodes from an informer: wait until it knows this new node, so that the fake
    # driver's slices are not refused for a node it has not seen yet.
    _create_slice(k8s, cluster_objects, _slice(unique_name("nar"), unique_name("nar") + ".example.com", node,
                                               [_cpu_device("probe-0")]))
    driver = fake_driver({node: _gpu_profile(tmp_path)})
    published = checks.published_device(k8s, driver.drivers.gpu, node, "gpu-0")
    mapping = published.node_allocatable_resources["cpu"].mapping
    assert api.parse_quantity(mapping.device_multiplier) == 2, published
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("gpu", f"{driver.config.instance}-gpu"))

    def pod(name: str, cpu: str) -> None:
        body = objects.pod(name, [objects.container("main", limits={"cpu": cpu}, claims=["dev"])],
                           resource_claims=[objects.claim_ref("dev", template="gpu")], node_selector={HOSTNAME: node})
        body["spec"]["tolerations"] = [{"key": TAINT, "operator": "Equal", "value": node, "effect": "NoSchedule"}]
        k8s.core.create_namespaced_pod(ns, body)

    # 1 of its own + 2 for its GPU = 3 of the node's 4: fits, and the pod's status records the GPU's 2.
    pod("first", "1")
    checks.running(k8s, ns, "first", timeout=120)
    (entry,) = _recorded(k8s, ns, "first").values()
    assert entry["mapping"] == {"cpu": Decimal(2)}, f"pod first on node {node} (driver {driver.drivers.gpu}): {entry}"
    # Another 1 + 2 would make 6: refused though a GPU is free and the pods' own requests (2) fit.
    pod("second", "1")
    _insufficient_cpu(k8s, ns, "second", node)
    claim = checks.pod_claim(k8s, ns, "second", claim="dev")
    assert claim.status is None or claim.status.allocation is None, (
        f"claim {claim.metadata.name} of pod second was allocated: {claim.status.allocation}")
    # With the first pod gone its GPU's cpu is back, and the second pod gets a GPU.
    k8s.core.delete_namespaced_pod("first", ns)
    checks.running(k8s, ns, "second", timeout=120)
