"""Optional node operations (DRAOptionalNodeOperations, alpha, new in 1.37): a driver whose devices need
nothing done on the node says so in its slice, and the kubelet then does not call it.

`ResourceSlice.spec.skipNodeOperations` (`NodePrepareResources`, `NodeUnprepareResources` or `*`) is
copied into each allocation result of the slice's devices; the kubelet skips an operation for a claim
and driver when every device of that driver in the claim skips it, so a pod starts without the driver's
kubelet plugin being registered at all. Skipping NodePrepareResources alone is invalid: what was not
prepared cannot be unprepared. The scheduler offers such devices only on nodes that declare the feature
(`node.status.declaredFeatures`). Sources: k8s.io/api@v0.37.2 resource/v1/types.go
(ResourceSliceSpec.SkipNodeOperations, DeviceRequestAllocationResult.SkipNodeOperations);
k8s.io/kubernetes@v1.37.2 pkg/kubelet/cm/dra/claiminfo.go and manager.go (the skip),
pkg/apis/resource/validation/validation.go (the pairing rule),
k8s.io/dynamic-resource-allocation@v0.37.2 structured/internal/experimental (the node check).

The tests publish a slice of their own for a made-up driver on the real node: no plugin of that name
exists there, so only the skip can let the pod start.
"""

from __future__ import annotations

import pytest

from conformance import checks, objects
from harness.k8s import wait
from harness.k8s.client import Clients
from harness.k8s.nodes import SHELL_IMAGE

pytestmark = [pytest.mark.dra_feature("DRAOptionalNodeOperations", maturity="alpha")]
NEEDS_KUBELET = pytest.mark.needs_kubelet
FEATURE = "DRAOptionalNodeOperations"


@pytest.fixture
def unregistered_driver(k8s: Clients, real_node, unique_name, cluster_objects, dra_namespace):
    """publish(skip) -> a slice of one device for a driver no plugin serves on the real node, its class and a
    claim template `one-device` for it."""
    if FEATURE not in (k8s.core.read_node(real_node.name).status.declared_features or []):
        pytest.skip(f"node {real_node.name} does not declare {FEATURE} (its kubelet has the gate off)")
    real_node.hold()  # a kubelet restarted by another test meanwhile would delete the node's slices
    driver = unique_name("skip") + ".example.com"

    def publish(skip: list[str] | None) -> str:
        body = objects.resource_slice(unique_name("skip-slice"), driver, real_node.name, [{"name": "dev-0"}])
        if skip is not None:
            body["spec"]["skipNodeOperations"] = skip
        created = cluster_objects.resource_slice(body)
        if skip is not None and not (created.spec.skip_node_operations or []):
            pytest.skip(f"the API server dropped spec.skipNodeOperations: {FEATURE} is off there")
        cluster_objects.device_class(objects.device_class(driver, driver))
        k8s.resource.create_namespaced_resource_claim_template(dra_namespace,
                                                              objects.claim_template("one-device", driver))
        return driver

    return publish


def _events(k8s: Clients, namespace: str, pod: str) -> list:
    return list(k8s.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}").items)


@NEEDS_KUBELET
def test_a_pod_starts_without_the_drivers_plugin_where_its_slice_skips_node_operations(
        k8s: Clients, dra_namespace, real_node, unregistered_driver):
    ns = dra_namespace
    driver = unregistered_driver(["*"])
    k8s.core.create_namespaced_pod(ns, objects.pod_on_node("skips", real_node.name, SHELL_IMAGE,
                                                           command=objects.IDLE, claim_template="one-device"))
    checks.containers_running(k8s, ns, "skips", timeout=90)
    claim = checks.pod_claim(k8s, ns, "skips")
    (result,) = claim.status.allocation.devices.results
    assert (result.driver, result.device) == (driver, "dev-0"), result
    # the slice's setting travels with the allocation: that is what the kubelet reads
    assert list(result.skip_node_operations or []) == ["*"], result
    failed = [e.message for e in _events(k8s, ns, "skips") if e.reason == "FailedPrepareDynamicResources"]
    assert not failed, f"pod skips: the kubelet tried to prepare {driver}: {failed}"


@NEEDS_KUBELET
def test_without_the_skip_the_kubelet_calls_the_missing_plugin_and_the_pod_does_not_start(
        k8s: Clients, dra_namespace, real_node, unregistered_driver):
    ns = dra_namespace
    driver = unregistered_driver(None)
    k8s.core.create_namespaced_pod(ns, objects.pod_on_node("prepares", real_node.name, SHELL_IMAGE,
                                                           command=objects.IDLE, claim_template="one-device"))
    claim = checks.pod_claim(k8s, ns, "prepares")

    def failed_prepare():
        messages = [e.message or "" for e in _events(k8s, ns, "prepares")
                    if e.reason == "FailedPrepareDynamicResources"]
        return [m for m in messages if driver in m]

    messages = wait.until(f"the kubelet on {real_node.name} to fail preparing {driver} for pod prepares",
                          failed_prepare, 90, diagnostics=lambda: wait.describe_namespace(k8s, ns))
    assert any("not registered" in m for m in messages), messages
    claim = k8s.resource.read_namespaced_resource_claim(claim.metadata.name, ns)
    assert not any(r.skip_node_operations for r in claim.status.allocation.devices.results), claim.status.allocation
    assert k8s.core.read_namespaced_pod("prepares", ns).status.phase == "Pending"


def test_api_refuses_skipping_prepare_without_unprepare(k8s: Clients, unique_name, real_node):
    driver = unique_name("skip") + ".example.com"
    body = objects.resource_slice(unique_name("skip-slice"), driver, real_node.name, [{"name": "dev-0"}])
    body["spec"]["skipNodeOperations"] = ["NodePrepareResources"]
    both = dict(body, spec=dict(body["spec"], skipNodeOperations=["NodePrepareResources", "NodeUnprepareResources"]))
    if not (k8s.resource.create_resource_slice(both, dry_run="All").spec.skip_node_operations or []):
        pytest.skip(f"the API server dropped spec.skipNodeOperations: {FEATURE} is off there")
    message = checks.rejected(k8s.resource.create_resource_slice, body, dry_run="All")
    assert "spec.skipNodeOperations" in message and \
        "NodePrepareResources cannot be skipped unless NodeUnprepareResources is also skipped" in message, message


def test_a_node_that_does_not_declare_the_feature_gets_no_such_device(k8s: Clients, dra_namespace, simulated_node,
                                                                       unique_name, cluster_objects):
    """The allocator offers a device whose slice skips node operations only on a node whose
    `status.declaredFeatures` lists DRAOptionalNodeOperations: a kubelet without the feature would prepare it
    after all (k8s.io/dynamic-resource-allocation@v0.37.2 structured/internal/experimental
    allocator_experimental.go, allocateDevice). A simulated node declares nothing."""
    ns, node = dra_namespace, simulated_node
    declared = k8s.core.read_node(node).status.declared_features or []
    if FEATURE in declared:
        pytest.skip(f"node {node} declares {FEATURE}")
    driver = unique_name("skip") + ".example.com"
    body = objects.resource_slice(unique_name("skip-slice"), driver, node, [{"name": "dev-0"}])
    body["spec"]["skipNodeOperations"] = ["*"]
    if not (cluster_objects.resource_slice(body).spec.skip_node_operations or []):
        pytest.skip(f"the API server dropped spec.skipNodeOperations: {FEATURE} is off there")
    cluster_objects.device_class(objects.device_class(driver, driver))
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("one-device", driver))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(
        "undeclared", "one-device", node_selector={"kubernetes.io/hostname": node}))
    condition = checks.unschedulable(k8s, ns, "undeclared", timeout=60)
    assert "cannot allocate all claims" in (condition.message or ""), condition.message
    claim = checks.pod_claim(k8s, ns, "undeclared")
    assert not (claim.status and claim.status.allocation), f"claim {claim.metadata.name}: {claim.status.allocation}"


SKIPPING_NIC = """  nics:
  - model: virtual-function
    bandwidth: 10G
    attach: [{pcieRoot: pci0000:10}]
  publish: {skipNodeOperations: [NodeUnprepareResources, NodePrepareResources]}
"""


@NEEDS_KUBELET
@pytest.mark.fake_devices("a profile whose slices skip node operations")
def test_the_fake_drivers_skipping_profile_starts_a_pod_with_no_plugin_on_the_node(
        k8s: Clients, dra_namespace, real_node, fake_driver, tmp_path):
    """The fake driver publishes from the control plane only: no kubelet plugin of its instance runs on the real
    node, so the pod can start only because its slices skip both node operations."""
    ns, node = dra_namespace, real_node.name
    if FEATURE not in (k8s.core.read_node(node).status.declared_features or []):
        pytest.skip(f"node {node} does not declare {FEATURE} (its kubelet has the gate off)")
    real_node.hold()  # a kubelet restarted by another test meanwhile would delete the node's slices
    driver = fake_driver({node: objects.node_profile(tmp_path, "skipping-nic", SKIPPING_NIC)})
    nic = driver.drivers.nic
    published = k8s.resource.list_resource_slice(field_selector=f"spec.driver={nic}").items
    assert published and all(sorted(s.spec.skip_node_operations or []) ==
                             ["NodePrepareResources", "NodeUnprepareResources"] for s in published), \
        [(s.metadata.name, s.spec.skip_node_operations) for s in published]
    k8s.resource.create_namespaced_resource_claim_template(
        ns, objects.claim_template("nic", f"{driver.config.instance}-nic"))
    k8s.core.create_namespaced_pod(ns, objects.pod_on_node("skips", node, SHELL_IMAGE, command=objects.IDLE,
                                                           claim_template="nic"))
    checks.containers_running(k8s, ns, "skips", timeout=90)
    (result,) = checks.pod_claim(k8s, ns, "skips").status.allocation.devices.results
    assert (result.driver, result.device) == (nic, "nic-0"), result
    assert sorted(result.skip_node_operations or []) == ["NodePrepareResources", "NodeUnprepareResources"], result
    failed = [e.message for e in _events(k8s, ns, "skips") if e.reason == "FailedPrepareDynamicResources"]
    assert not failed, f"pod skips: the kubelet tried to prepare {nic}: {failed}"
