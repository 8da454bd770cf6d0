"""Driver checks: what a driver publishes is well-formed and consistent (issue item 8).

In the default mode the driver under test is the fake driver publishing `dgx-h100` and `a100-mig`; in
vendor mode (`--dra-driver-config`) it is the vendor's driver, as it is. Each failure names the
pool/device and the defect.
"""

from __future__ import annotations

import pytest

from conformance import checks, driver_checks, objects
from fake_devices import faults, render
from harness import wait


@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
@pytest.mark.parametrize("check", sorted(driver_checks.ALL_CHECKS))
def test_published_slices(driver_under_test, check):
    slices = driver_under_test.slices()
    assert slices, f"driver(s) {', '.join(driver_under_test.drivers)} publish no ResourceSlices"
    defects = driver_checks.ALL_CHECKS[check](slices)
    assert not defects, f"{check}: " + "; ".join(defects[:10])


@pytest.mark.fake_devices
@pytest.mark.dra_feature("DRADeviceTaints", maturity="ga")
def test_device_fault_is_published_as_a_taint(driver_under_test, k8s, dra_namespace):
    fake = driver_under_test.fake
    if fake is None:
        pytest.skip("needs fault injection, which only the fake driver offers (vendor mode tests your driver as is)")
    node = driver_under_test.nodes[0]
    faults.set_fault(k8s.core, dra_namespace, fake.config.faults_configmap, node, "gpu-0", "unhealthy")

    def tainted():
        for s in driver_under_test.slices():
            if s["spec"]["pool"]["name"] == node and s["spec"]["driver"] == fake.drivers.gpu:
                for device in s["spec"].get("devices") or []:
                    if device["name"] == "gpu-0" and any(t["key"] == render.FAULT_TAINT_KEY and
                                                         t["effect"] == "NoExecute" for t in device.get("taints") or []):
                        return True
        return False

    try:
        wait.until("the unhealthy device gpu-0 to be published with a NoExecute taint", tainted, 30)
    except wait.WaitTimeout:
        pytest.fail(f"driver did not publish a taint for an unhealthy device: {node}/gpu-0 has no NoExecute taint "
                    "30 s after the fault", pytrace=False)


# --- where a kubelet runs: the driver's node half ------------------------------------------------

@pytest.fixture
def kubelet_target(request, k8s, cluster_facts, dra_namespace):
    """(driver, device class, node, image, container command) for a pod the kubelet must prepare: the
    vendor's driver on a kubelet node where it publishes devices, or the fake driver with its kubelet
    plugins on the local backend's real node."""
    from harness.backends.local.realnode import images
    from harness.pytest_plugin import vendor_driver

    vendor = vendor_driver(request.config)
    if vendor is not None:
        if not vendor.device_classes:
            pytest.skip("the vendor file names no deviceClasses to request a device from")
        device_class = sorted(vendor.device_classes.values())[0]
        for node in cluster_facts.kubelet_nodes:
            for driver in vendor.drivers:
                if k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver},spec.nodeName={node}").items:
                    return driver, device_class, node, vendor.test_image, None
        pytest.skip(f"driver(s) {', '.join(vendor.drivers)} publish no devices on a node run by a kubelet "
                    f"(kubelet nodes: {', '.join(cluster_facts.kubelet_nodes)})")
    real_node = request.getfixturevalue("real_node")
    fake = request.getfixturevalue("fake_driver")({real_node.name: "tiny"})
    real_node.run_for(fake)
    return fake.drivers.gpu, f"{fake.config.instance}-gpu", real_node.name, images.SHELL_IMAGE, \
        ["sh", "-c", "exec sleep 3600"]


@pytest.mark.needs_kubelet
@pytest.mark.dra_feature("DynamicResourceAllocation", maturity="ga")
def test_kubelet_prepares_and_unprepares_the_drivers_claims(k8s, dra_namespace, kubelet_target):
    """A pod with a claim on the driver's devices starts on a kubelet node (NodePrepareResources
    succeeded) and the kubelet counts the prepared claim; deleting the pod unprepares it (count back,
    no failed call). Judged from the kubelet's own metrics, so it holds for any driver."""
    driver, device_class, node, image, command = kubelet_target
    ns = dra_namespace
    before = checks.kubelet_dra_metrics(k8s, node, driver)
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("one", device_class))
    k8s.core.create_namespaced_pod(ns, objects.pod_on_node("prepared", node, image, command=command,
                                                          claim_template="one", pull_policy="IfNotPresent"))
    checks.running(k8s, ns, "prepared", timeout=120)
    claim = checks.pod_claim(k8s, ns, "prepared")
    assert {r.driver for r in claim.status.allocation.devices.results} == {driver}
    during = checks.kubelet_dra_metrics(k8s, node, driver)
    assert during["in_use"] == before["in_use"] + 1, (before, during)
    assert during.get("PrepareResources", 0) > before.get("PrepareResources", 0)

    k8s.core.delete_namespaced_pod("prepared", ns)
    wait.until("pod prepared to be gone (after NodeUnprepareResources)",
               lambda: not k8s.core.list_namespaced_pod(ns).items, 120,
               diagnostics=lambda: wait.describe_namespace(k8s, ns))
    after = checks.kubelet_dra_metrics(k8s, node, driver)
    assert after["in_use"] == before["in_use"], (before, after)
    assert after.get("UnprepareResources", 0) > during.get("UnprepareResources", 0)
    assert after.get("PrepareResources-error", 0) == before.get("PrepareResources-error", 0)
    assert after.get("UnprepareResources-error", 0) == before.get("UnprepareResources-error", 0)
