"""Partitionable devices (KEP-4815, beta in 1.37): MIG placements publish counters, and the real
scheduler enforces the GPU's geometry through them."""

from __future__ import annotations

import pytest

from conformance import checks, objects

pytestmark = [pytest.mark.dra_feature("DRAPartitionableDevices", maturity="beta"),
              pytest.mark.fake_devices("the a100-mig profile (MIG placements and their counters)")]


def _on_gpu(driver, parent: int, *extra: str) -> list[str]:
    attrs = f'device.attributes["{driver.drivers.gpu}"]'
    return [f"{attrs}.parentIndex == {parent}", *(e.format(attrs=attrs) for e in extra)]


def test_full_instance_blocks_every_other_placement_until_freed(k8s, dra_namespace, fake_driver, simulated_node):
    ns = dra_namespace
    driver = fake_driver({simulated_node: "a100-mig"})
    mig_class = f"{driver.config.instance}-mig"
    seven_g = '{attrs}.profile == "7g.80gb"'
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "whole-gpu0", requests=[objects.request(mig_class, selectors=_on_gpu(driver, 0, seven_g))]))
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "any-on-gpu0", requests=[objects.request(mig_class, selectors=_on_gpu(driver, 0, '!(' + seven_g + ')'))]))
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "any-on-gpu1", requests=[objects.request(mig_class, selectors=_on_gpu(driver, 1, '!(' + seven_g + ')'))]))

    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("big", "whole-gpu0"))
    checks.running(k8s, ns, "big")
    assert checks.allocated_devices(checks.pod_claim(k8s, ns, "big")) == [
        ("gpu", simulated_node, "gpu-0-mig-7g-80gb-0")]

    # 7g.80gb holds all 8 memory slices and 7 compute slices of GPU 0: none of its 24 other placements
    # (nor the whole GPU) can be allocated ...
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("blocked", "any-on-gpu0"))
    checks.unschedulable(k8s, ns, "blocked")
    # ... while the same request on GPU 1 is served at once.
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("control", "any-on-gpu1"))
    checks.running(k8s, ns, "control")
    (_, _, device), = checks.allocated_devices(checks.pod_claim(k8s, ns, "control"))
    assert device.startswith("gpu-1-mig-")

    # Freeing the 7g instance returns its counters: the waiting pod gets a placement on GPU 0.
    k8s.core.delete_namespaced_pod("big", ns)
    checks.running(k8s, ns, "blocked")
    (_, _, device), = checks.allocated_devices(checks.pod_claim(k8s, ns, "blocked"))
    assert device.startswith("gpu-0-mig-")


def test_placements_never_exceed_the_memory_slices(k8s, dra_namespace, fake_driver, simulated_node):
    """Ask GPU 0 for eight 1g.10gb instances: only seven memory-slice placements exist (0-6)."""
    ns = dra_namespace
    driver = fake_driver({simulated_node: "a100-mig"})
    one_g = '{attrs}.profile == "1g.10gb"'
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "seven", requests=[objects.request(f"{driver.config.instance}-mig", count=7,
                                           selectors=_on_gpu(driver, 0, one_g))]))
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "one-more", requests=[objects.request(f"{driver.config.instance}-mig", selectors=_on_gpu(driver, 0, one_g))]))
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("seven", "seven"))
    checks.running(k8s, ns, "seven")
    devices = [d for _, _, d in checks.allocated_devices(checks.pod_claim(k8s, ns, "seven"))]
    assert sorted(devices) == [f"gpu-0-mig-1g-10gb-{start}" for start in range(7)]
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim("one-more", "one-more"))
    checks.unschedulable(k8s, ns, "one-more")
