"""Fractional capacity (DRAFractionalCapacityRange, beta in 1.37, off unless the compatibility
version is >= 1.37; the all-dra preset switches it on).

With the gate on, a capacity whose `requestPolicy.validRange` has a fractional min, max or step is
computed in milli-units: a request is rounded up to min + n * step exactly (120m -> 150m with a 50m
step), where the integer arithmetic of plain consumable capacity would read every fraction as 1. The
API validates such ranges in milli-units too. The fake driver's `nvme-storage` profile publishes each
NVMe drive's I/O bandwidth as capacity `ioShare` = 1 with `validRange {min: 0, step: 50m, max: 800m}`
and default 0, next to its byte-sized `size` capacity.
"""

from __future__ import annotations

import pytest

from conformance import checks, objects

pytestmark = [pytest.mark.dra_feature("DRAFractionalCapacityRange", maturity="beta"),
              pytest.mark.fake_devices("the nvme-storage profile (fractional ioShare capacity)")]

NO_FIT = "cannot allocate all claims"  # the scheduler's DRA plugin, per node, when no device fits


def _drive(driver, index: int) -> list[str]:
    return [f'device.attributes["{driver.drivers.storage}"].index == {index}']


def _share_template(k8s, ns: str, driver, name: str, io_share: str, drive: int | None = 0) -> None:
    nvme = f"{driver.config.instance}-nvme"
    selectors = _drive(driver, drive) if drive is not None else []
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        name, requests=[objects.request(nvme, selectors=selectors, capacity={"ioShare": io_share})]))


def _run(k8s, ns: str, pod: str, node: str) -> None:
    k8s.core.create_namespaced_pod(ns, objects.pod_with_template_claim(pod, pod, {"kubernetes.io/hostname": node}))


def _allocation(k8s, ns: str, pod: str):
    """The single allocation result of the pod's claim, once the pod runs."""
    checks.running(k8s, ns, pod)
    (result,) = checks.pod_claim(k8s, ns, pod).status.allocation.devices.results
    return result


def _refused_everywhere(k8s, ns: str, pod: str, node: str) -> str:
    condition = checks.unschedulable(k8s, ns, pod)
    assert checks.every_node_says(condition.message, NO_FIT, [node]), condition.message
    return condition.message


def test_fractional_request_is_rounded_up_to_the_milli_step(k8s, dra_namespace, fake_driver, simulated_node):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "nvme-storage"})
    _share_template(k8s, ns, driver, "odd", "120m")  # between steps: 0 + 3 * 50m is the next valid value
    _share_template(k8s, ns, driver, "aligned", "0.35")  # on a step already, written as a decimal
    nvme = f"{driver.config.instance}-nvme"
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        "unasked", requests=[objects.request(nvme, selectors=_drive(driver, 0))]))
    for pod in ("odd", "aligned", "unasked"):
        _run(k8s, ns, pod, node)

    odd, aligned, unasked = (_allocation(k8s, ns, p) for p in ("odd", "aligned", "unasked"))
    # Integer arithmetic would have read 120m as 1 (and then refused it: above max 800m).
    assert odd.consumed_capacity == {"ioShare": "150m", "size": "100Gi"}
    assert aligned.consumed_capacity["ioShare"] == "350m"
    assert unasked.consumed_capacity == {"ioShare": "0", "size": "100Gi"}  # the policy's defaults
    assert {odd.device, aligned.device, unasked.device} == {"nvme-0"}
    assert len({odd.share_id, aligned.share_id, unasked.share_id}) == 3


def test_claims_share_a_drive_in_fractions_up_to_the_whole(k8s, dra_namespace, fake_driver, simulated_node):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "nvme-storage"})
    for name, share in (("first", "450m"), ("second", "550m"), ("late", "50m")):
        _share_template(k8s, ns, driver, name, share)
    for pod in ("first", "second"):
        _run(k8s, ns, pod, node)
    first, second = _allocation(k8s, ns, "first"), _allocation(k8s, ns, "second")
    assert (first.device, second.device) == ("nvme-0", "nvme-0")
    assert first.share_id and second.share_id and first.share_id != second.share_id
    assert (first.consumed_capacity["ioShare"], second.consumed_capacity["ioShare"]) == ("450m", "550m")

    # 450m + 550m is the whole drive: 50m more is over its capacity although its size has room.
    _run(k8s, ns, "late", node)
    _refused_everywhere(k8s, ns, "late", node)
    k8s.core.delete_namespaced_pod("first", ns)
    late = _allocation(k8s, ns, "late")
    assert (late.device, late.consumed_capacity["ioShare"]) == ("nvme-0", "50m")


def test_request_above_the_range_maximum_fits_no_drive(k8s, dra_namespace, fake_driver, simulated_node):
    ns, node = dra_namespace, simulated_node
    driver = fake_driver({node: "nvme-storage"})
    _share_template(k8s, ns, driver, "above-max", "850m", drive=None)  # max 800m, though every drive is free
    _share_template(k8s, ns, driver, "above-capacity", "1500m", drive=None)
    _share_template(k8s, ns, driver, "at-max", "800m", drive=None)
    for pod in ("above-max", "above-capacity", "at-max"):
        _run(k8s, ns, pod, node)
    for pod in ("above-max", "above-capacity"):
        _refused_everywhere(k8s, ns, pod, node)
    assert _allocation(k8s, ns, "at-max").consumed_capacity["ioShare"] == "800m"


def _slice_with_range(driver: str, node: str, policy: dict) -> dict:
    device = {"name": "drive-0", "allowMultipleAllocations": True,
              "capacity": {"ioShare": {"value": "1", "requestPolicy": policy}}}
    return objects.resource_slice(f"{driver}-{node}", driver, node, [device])


def test_api_validates_fractional_ranges_in_milli_units(k8s, simulated_node, unique_name):
    """Dry-run creates: the API server validates them fully but stores nothing."""
    driver = unique_name("frac") + ".example.com"
    create = k8s.resource.create_resource_slice
    fractional = {"min": "0", "step": "50m", "max": "800m"}
    create(_slice_with_range(driver, simulated_node, {"default": "100m", "validRange": fractional}), dry_run="All")

    # 120m is no multiple of 50m (integer arithmetic would see 1, 0 and 1 and accept it).
    message = checks.rejected(create, _slice_with_range(driver, simulated_node,
                                                        {"default": "120m", "validRange": fractional}), dry_run="All")
    assert "requestPolicy.validRange.step" in message and "not a multiple of a given step" in message, message

    # 1500u has no exact milli-unit value.
    message = checks.rejected(create, _slice_with_range(driver, simulated_node, {
        "default": "2m", "validRange": {"min": "1500u", "step": "1m"}}), dry_run="All")
    assert "requestPolicy.validRange.min" in message and "cannot be represented as a milli value" in message, message
