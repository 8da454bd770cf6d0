"""Consumable capacity (beta in 1.37): one NVMe drive shared by several claims up to its capacity,
with the drive's request policy applied and each share recorded in the allocation."""

from __future__ import annotations

import pytest

from conformance import checks, objects

pytestmark = [pytest.mark.dra_feature("DRAConsumableCapacity", maturity="beta"),
              pytest.mark.fake_devices("the tiny profile (shareable NVMe drives with a known request policy)")]


def _nvme(driver, index: int) -> list[str]:
    return [f'device.attributes["{driver.drivers.storage}"].index == {index}']


def _share(k8s, ns, pod):
    claim = checks.pod_claim(k8s, ns, pod)
    result, = claim.status.allocation.devices.results
    return result


def test_claims_share_a_drive_up_to_its_capacity(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    driver = fake_driver({simulated_node: "tiny"})  # nvme-0: 1Ti, shareable; requests 10Gi + k*10Gi
    nvme = f"{driver.config.instance}-nvme"
    for name, size in (("half-a", "500Gi"), ("half-b", "500Gi"), ("too-much", "30Gi")):
        k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
            name, requests=[objects.request(nvme, selectors=_nvme(driver, 0), capacity={"size": size})]))

    for pod in ("half-a", "half-b"):
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(pod, pod))
    a, b = (checks.running(k8s, ns, p) and _share(k8s, ns, p) for p in ("half-a", "half-b"))
    assert (a.device, b.device) == ("nvme-0", "nvme-0")
    assert a.share_id and b.share_id and a.share_id != b.share_id
    assert (a.consumed_capacity["size"], b.consumed_capacity["size"]) == ("500Gi", "500Gi")

    # 1000Gi of 1024Gi are taken; 30Gi does not fit in what is left.
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("too-much", "too-much"))
    checks.unschedulable(k8s, ns, "too-much")
    k8s.core.delete_namespaced_pod("half-a", ns)
    checks.running(k8s, ns, "too-much")
    assert _share(k8s, ns, "too-much").device == "nvme-0"


def test_request_policy_rounds_up_to_a_valid_size(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    driver = fake_driver({simulated_node: "tiny"})
    nvme = f"{driver.config.instance}-nvme"
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "odd", requests=[objects.request(nvme, selectors=_nvme(driver, 1), capacity={"size": "15Gi"})]))
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "default", requests=[objects.request(nvme, selectors=_nvme(driver, 1))]))
    for pod in ("odd", "default"):
        k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(pod, pod))
        checks.running(k8s, ns, pod)
    assert _share(k8s, ns, "odd").consumed_capacity["size"] == "20Gi"  # min 10Gi, step 10Gi
    assert _share(k8s, ns, "default").consumed_capacity["size"] == "100Gi"  # the policy's default
