"""Pods with several claims, and pods spread over several nodes (upstream test/e2e/dra: "multiple
claims", "multi-node"): the scheduler allocates all claims of a pod on one node or none, and places
pods where devices are left when one node's devices are used up."""

from __future__ import annotations

from collections import Counter

import pytest

from conformance import checks, objects

pytestmark = [pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")]

NO_FIT = "cannot allocate all claims"


def _templates(k8s, ns: str, driver, **counts: int) -> None:
    """One claim template per device kind (`gpu=1, nic=3`), named after it, asking for that many
    devices of the fake driver's class for the kind."""
    for kind, count in counts.items():
        k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
            kind, requests=[objects.request(f"{driver.config.instance}-{kind}", name=kind, count=count)]))


def _pod_using(name: str, *templates: str, node: str | None = None) -> dict:
    return objects.pod_with_claims(name, [objects.claim_ref(t, template=t) for t in templates],
                                   node_selector={"kubernetes.io/hostname": node} if node else None)


def _slice_node(k8s, driver: str, pool: str) -> str:
    """The node of the ResourceSlices that publish `pool` of `driver`."""
    nodes = {s.spec.node_name for s in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items
             if s.spec.pool.name == pool}
    assert len(nodes) == 1, f"pool {driver}/{pool} is published for nodes {nodes}"
    return nodes.pop()


def _class_template(k8s, ns: str, pool, name: str, device_class: str, count: int = 1) -> None:
    """A template asking for `count` devices of one of the pool's own classes (through the pool: where
    devices are pinned by taints, its request tolerates the class's devices)."""
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        name, requests=[pool.request(name, count=count, device_class=device_class)]))


def test_pod_with_claims_of_two_classes_gets_both(k8s, dra_namespace, devices_under_test):
    """Two DeviceClasses over the driver under test's devices, one device each: a pod with a claim of
    each gets both, each from its class, on the devices' node, both reserved for the pod."""
    ns = dra_namespace
    pool = devices_under_test(2)
    first, second = pool.devices
    classes = {"first": (pool.own_class("first", devices=(first,)), first),
               "second": (pool.own_class("second", devices=(second,)), second)}
    for entry, (device_class, _) in classes.items():
        _class_template(k8s, ns, pool, entry, device_class)
    k8s.core.create_namespaced_pod(ns, pool.pod(_pod_using("both", "first", "second")))
    pod = checks.running(k8s, ns, "both", timeout=90)
    assert pod.spec.node_name == pool.node

    for entry, (_, device) in classes.items():
        claim = checks.pod_claim(k8s, ns, "both", entry)
        (result,) = claim.status.allocation.devices.results
        assert (result.request, result.driver, result.pool, result.device) == (
            entry, pool.driver, device.pool, device.name), result
        assert [c[2:] for c in checks.consumers(claim)] == [("both", pod.metadata.uid)]


@pytest.mark.fake_devices("two drivers (GPU and NIC) of one instance")
def test_pod_with_claims_of_two_drivers_gets_both(k8s, dra_namespace, fake_driver, simulated_node):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "tiny"})
    _templates(k8s, ns, driver, gpu=1, nic=1)
    k8s.core.create_namespaced_pod(ns, _pod_using("both", "gpu", "nic", node=node))
    pod = checks.running(k8s, ns, "both")

    expected = {"gpu": (driver.drivers.gpu, "gpu"), "nic": (driver.drivers.nic, "nic")}
    for entry, (driver_name, device_type) in expected.items():
        claim = checks.pod_claim(k8s, ns, "both", entry)
        (result,) = claim.status.allocation.devices.results
        assert (result.request, result.driver, result.pool) == (entry, driver_name, node), result
        published = checks.published_device(k8s, result.driver, result.pool, result.device)
        assert checks.attribute_value(published, "type") == device_type, f"{entry}: {result.device}"
        assert [c[2:] for c in checks.consumers(claim)] == [("both", pod.metadata.uid)]


def test_a_pod_gets_all_its_claims_or_none(k8s, dra_namespace, devices_under_test):
    """One class offers one device, another one device: a pod asking for the first and for two of the
    second gets nothing, not the first alone."""
    ns = dra_namespace
    pool = devices_under_test(2)
    first, second = pool.devices
    _class_template(k8s, ns, pool, "first", pool.own_class("first", devices=(first,)))
    _class_template(k8s, ns, pool, "second", pool.own_class("second", devices=(second,)), count=2)
    k8s.core.create_namespaced_pod(ns, pool.pod(_pod_using("greedy", "first", "second")))
    condition = checks.unschedulable(k8s, ns, "greedy")
    assert checks.every_node_says(condition.message, NO_FIT, [pool.node]), condition.message
    for entry in ("first", "second"):
        claim = checks.pod_claim(k8s, ns, "greedy", entry)
        assert claim.status is None or claim.status.allocation is None, f"claim {entry} was allocated alone"

    # Both devices are still free for others.
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("both", count=2))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("two", "both")))
    checks.running(k8s, ns, "two", timeout=90)
    assert sorted(d for *_, d in checks.allocated_devices(checks.pod_claim(k8s, ns, "two"))) == sorted(pool.names)


@pytest.mark.fake_devices("devices on two nodes (the vendor pool offers one node's devices)")
def test_pods_spread_over_nodes_as_devices_run_out(k8s, dra_namespace, fake_driver, simulated_nodes):
    """Two nodes with two GPUs each: four one-GPU pods fill both nodes, two each; a fifth waits."""
    if len(simulated_nodes) < 2:
        pytest.skip("needs two simulated nodes")
    ns, nodes = dra_namespace, simulated_nodes[:2]
    driver = fake_driver({node: "tiny" for node in nodes})
    _templates(k8s, ns, driver, gpu=1)
    pods = [f"p{i}" for i in range(4)]
    for pod in pods:
        k8s.core.create_namespaced_pod(ns, _pod_using(pod, "gpu"))
    placed: dict[str, tuple[str, str]] = {}  # pod -> (node, device)
    for pod in pods:
        node = checks.running(k8s, ns, pod).spec.node_name
        ((_, pool, device),) = checks.allocated_devices(checks.pod_claim(k8s, ns, pod))
        assert _slice_node(k8s, driver.drivers.gpu, pool) == node, f"{pod} runs on {node}, its GPU is in {pool}"
        placed[pod] = (node, device)
    assert Counter(node for node, _ in placed.values()) == {nodes[0]: 2, nodes[1]: 2}, placed
    assert len(set(placed.values())) == 4, f"a GPU was given twice: {placed}"

    k8s.core.create_namespaced_pod(ns, _pod_using("fifth", "gpu"))
    condition = checks.unschedulable(k8s, ns, "fifth")
    assert checks.every_node_says(condition.message, NO_FIT, nodes), condition.message
    k8s.core.delete_namespaced_pod("p0", ns)
    assert checks.running(k8s, ns, "fifth").spec.node_name == placed["p0"][0]
