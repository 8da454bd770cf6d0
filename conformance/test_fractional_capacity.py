"""Fractional capacity (DRAFractionalCapacityRange, beta in 1.37, off unless the compatibility
version is >= 1.37; the all-dra preset switches it on).

With the gate on, a capacity whose `requestPolicy.validRange` has a fractional min, max or step is
computed in milli-units: a request is rounded up to min + n * step exactly (125m -> 150m with a 50m
step), where the integer arithmetic of plain consumable capacity would read every fraction as 1. The
API validates such ranges in milli-units too.

Runs against the driver under test (`fractional_under_test`): the fake driver's NVMe drives (profile
nvme-storage: I/O bandwidth as capacity `ioShare` = 1 with `validRange {min: 0, step: 50m, max: 800m}`
and default 0, next to the byte-sized `size`), or a vendor's shareable devices with such a capacity.
Every request size and what it must be rounded to is worked out from the range the slices publish
(conformance/under_test.py); a vendor driver that publishes none is "not applicable" (a failure when
its vendor file claims DRAFractionalCapacityRange).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from conformance import capacity, checks, objects
from harness.config import capabilities

pytestmark = [pytest.mark.dra_feature("DRAFractionalCapacityRange", maturity="beta", discovered=True)]

NO_FIT = "cannot allocate all claims"  # the scheduler's DRA plugin, per node, when no device fits
DEVICES = "dra_fractional_devices"  # test property: the devices (driver/pool/device) the test's claims got


@pytest.fixture
def allocated(record_property):
    """The devices the test's assertions saw allocated, recorded as a test property."""
    found: set[str] = set()
    yield found
    record_property(DEVICES, sorted(found))


def _capacity(pool) -> tuple[str, dict]:
    """The first fractional capacity of the pool's first device: (name, its published entry)."""
    name, entry = sorted(capabilities.fractional(pool.devices[0].published).items())[0]
    return name, entry


def _template(k8s, ns: str, pool, name: str, requests: dict[str, str], devices=None) -> None:
    chosen = tuple(devices if devices is not None else pool.devices[:1])
    k8s.resource.create_namespaced_resource_claim_template(ns, objects.claim_template(
        name, requests=[pool.request(devices=chosen, capacity=requests or None)]))


def _run(k8s, ns: str, pool, pod: str) -> None:
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim(pod, pod)))


def _allocation(k8s, ns: str, pod: str, allocated: set[str]):
    """The single allocation result of the pod's claim, once the pod runs."""
    checks.running(k8s, ns, pod, timeout=120)
    (result,) = checks.pod_claim(k8s, ns, pod).status.allocation.devices.results
    allocated.add(f"{result.driver}/{result.pool}/{result.device}")
    return result


def _consumed(result) -> dict[str, Decimal]:
    return {name: capabilities.quantity(value) for name, value in (result.consumed_capacity or {}).items()}


def _texts(amounts: dict[str, Decimal]) -> dict[str, str]:
    return {name: capacity.milli_text(value) for name, value in amounts.items()}


def _refused_everywhere(k8s, ns: str, pod: str, node: str) -> str:
    condition = checks.unschedulable(k8s, ns, pod)
    assert checks.every_node_says(condition.message, NO_FIT, [node]), condition.message
    return condition.message


def test_fractional_request_is_rounded_up_to_the_milli_step(k8s, dra_namespace, fractional_under_test, allocated):
    ns = dra_namespace
    pool = fractional_under_test(1)
    device = pool.devices[0]
    name, entry = _capacity(pool)
    where = f"driver {pool.driver}, node {pool.node}, device {device.path}, capacity {name} {entry}"
    odd = capacity.between_steps(entry)
    if odd is None:
        pytest.skip(f"{where}: no request lies between two valid amounts of the range")
    asked, rounded = odd  # e.g. 125m between steps of 50m: 0 + 3 * 50m is the next valid amount
    others = capacity.beside(device.published, name, 3)
    room = capabilities.quantity(entry["value"]) - rounded - capacity.default_share(entry)
    aligned = capacity.largest_valid(entry, room / 2)  # on a step already, written as a decimal below
    claims = {"odd": {name: asked, **others}, "aligned": {name: aligned, **others}, "unasked": {}}
    if aligned is None or aligned <= 0 or not capacity.fit(device.published, list(claims.values())):
        pytest.skip(f"{where}: a request of {asked}, one on a step and one naming no amount do not fit together "
                    f"(other capacities: {others})")
    _template(k8s, ns, pool, "odd", {name: capacity.milli_text(asked), **_texts(others)})
    _template(k8s, ns, pool, "aligned", {name: capacity.decimal_text(aligned), **_texts(others)})
    _template(k8s, ns, pool, "unasked", {})
    for pod in claims:
        _run(k8s, ns, pool, pod)

    results = {pod: _allocation(k8s, ns, pod, allocated) for pod in claims}
    for pod, requests in claims.items():
        expected = capacity.consumed(device.published, requests)
        assert _consumed(results[pod]) == expected, (
            f"{where}: claim {pod} asked for {_texts(requests) or 'no amount (the policy defaults)'}, "
            f"was allocated {results[pod].consumed_capacity}, expected {_texts(expected or {})}")
    # Integer arithmetic would have read the odd request as 1 (and rounded or refused it accordingly).
    assert _consumed(results["odd"])[name] == rounded, where
    assert {r.device for r in results.values()} == {device.name}, where
    assert len({r.share_id for r in results.values()}) == 3, where


def test_claims_share_a_device_in_fractions_up_to_the_whole(k8s, dra_namespace, fractional_under_test, allocated):
    ns = dra_namespace
    pool = fractional_under_test(1)
    device = pool.devices[0]
    name, entry = _capacity(pool)
    where = f"driver {pool.driver}, node {pool.node}, device {device.path}, capacity {name} {entry}"
    halves, late = capacity.split_whole(entry), capacity.least_positive(entry)
    if halves is None or late is None:
        pytest.skip(f"{where}: no two valid amounts add up to the whole capacity")
    others = capacity.beside(device.published, name, 3)
    shares = {"first": halves[0], "second": halves[1], "late": late}  # e.g. 450m + 550m, then 50m
    if not capacity.fit(device.published, [{**others, name: late}] * 3):
        pytest.skip(f"{where}: three claims do not fit beside each other in the other capacities ({others})")
    for pod, share in shares.items():
        _template(k8s, ns, pool, pod, {name: capacity.milli_text(share), **_texts(others)})
    for pod in ("first", "second"):
        _run(k8s, ns, pool, pod)
    first, second = (_allocation(k8s, ns, p, allocated) for p in ("first", "second"))
    assert (first.device, second.device) == (device.name, device.name), where
    assert first.share_id and second.share_id and first.share_id != second.share_id, where
    assert (_consumed(first)[name], _consumed(second)[name]) == halves, (where, first, second)

    # The two shares are the whole device: the least amount more is over its capacity although the
    # other capacities have room.
    _run(k8s, ns, pool, "late")
    _refused_everywhere(k8s, ns, "late", pool.node)
    k8s.core.delete_namespaced_pod("first", ns)
    last = _allocation(k8s, ns, "late", allocated)
    assert (last.device, _consumed(last)[name]) == (device.name, late), (where, last)


def test_request_above_the_range_maximum_fits_no_device(k8s, dra_namespace, fractional_under_test, allocated):
    ns = dra_namespace
    pool = fractional_under_test(None)  # every such device of the node, all free
    name, entry = _capacity(pool)
    policy = (entry["value"], entry["requestPolicy"])
    devices = [d for d in pool.devices
               if (d.published["capacity"].get(name, {}).get("value"), d.published["capacity"].get(name, {})
                   .get("requestPolicy")) == policy]
    where = (f"driver {pool.driver}, node {pool.node}, devices {', '.join(d.name for d in devices)}, "
             f"capacity {name} {entry}")
    above = capacity.above_max(entry)
    if above is None:
        pytest.skip(f"{where}: the range has no max below the capacity")
    at_max = capacity.largest_valid(entry, capabilities.quantity(entry["requestPolicy"]["validRange"]["max"]))
    sizes = {"above-max": above, "above-capacity": capacity.above_capacity(entry), "at-max": at_max}
    for pod, size in sizes.items():  # e.g. 850m above a max of 800m, 1500m above a capacity of 1
        _template(k8s, ns, pool, pod, {name: capacity.milli_text(size)}, devices=devices)
        _run(k8s, ns, pool, pod)
    for pod in ("above-max", "above-capacity"):
        _refused_everywhere(k8s, ns, pod, pool.node)
    result = _allocation(k8s, ns, "at-max", allocated)
    assert result.device in {d.name for d in devices} and _consumed(result)[name] == at_max, (where, result)


def _slice_with_range(driver: str, node: str, policy: dict) -> dict:
    device = {"name": "drive-0", "allowMultipleAllocations": True,
              "capacity": {"ioShare": {"value": "1", "requestPolicy": policy}}}
    return objects.resource_slice(f"{driver}-{node}", driver, node, [device])


def test_api_validates_fractional_ranges_in_milli_units(k8s, unique_name):
    """Dry-run creates of a made-up driver's slice: the API server validates them fully but stores
    nothing (so this runs whatever the driver under test publishes)."""
    driver, node = unique_name("frac") + ".example.com", unique_name("node")
    create = k8s.resource.create_resource_slice
    fractional = {"min": "0", "step": "50m", "max": "800m"}
    create(_slice_with_range(driver, node, {"default": "100m", "validRange": fractional}), dry_run="All")

    # 120m is no multiple of 50m (integer arithmetic would see 1, 0 and 1 and accept it).
    message = checks.rejected(create, _slice_with_range(driver, node,
                                                        {"default": "120m", "validRange": fractional}), dry_run="All")
    assert "requestPolicy.validRange.step" in message and "not a multiple of a given step" in message, message

    # 1500u has no exact milli-unit value.
    message = checks.rejected(create, _slice_with_range(driver, node, {
        "default": "2m", "validRange": {"min": "1500u", "step": "1m"}}), dry_run="All")
    assert "requestPolicy.validRange.min" in message and "cannot be represented as a milli value" in message, message
