"""Driver checks: what a driver publishes is well-formed and consistent (issue item 8).

In the default mode the driver under test is the fake driver publishing `dgx-h100` and `a100-mig`; in
vendor mode (`--dra-driver-config`) it is the vendor's driver, as it is. Each failure names the
pool/device and the defect.
"""

from __future__ import annotations

import pytest

from conformance import driver_checks
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
