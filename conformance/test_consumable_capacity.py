"""Consumable capacity (beta in 1.37): a device that allows multiple allocations is shared by several
claims up to its capacity, with its request policy applied and each share recorded in the allocation.

Runs against the driver under test (`shareable_under_test`): the fake driver's NVMe drives (profile
tiny: 1Ti, requests from 10Gi in steps of 10Gi, 100Gi by default), or a vendor's shareable devices,
e.g. dra-example-driver with --gpu-allow-multiple-allocations (memory from 1Gi in steps of 1Gi,
compute from 1 in steps of 1, the whole device by default). What fits and what each request is
rounded to is worked out from the capacities and request policies the slices publish.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from conformance import capacity, checks, objects
from harness.config import capabilities

pytestmark = [pytest.mark.dra_feature("DRAConsumableCapacity", maturity="beta")]


def _share(k8s, ns, pod):
    claim = checks.pod_claim(k8s, ns, pod)
    result, = claim.status.allocation.devices.results
    return result


def _amounts(amounts: dict[str, Decimal]) -> dict[str, str]:
    return {name: str(int(value)) if value == value.to_integral_value() else str(value)
            for name, value in amounts.items()}


def _consumed(result, names) -> dict[str, Decimal]:
    """What the allocation records as consumed of the capacities `names` (those with a request policy)."""
    return {name: capabilities.quantity(value) for name, value in (result.consumed_capacity or {}).items()
            if name in names}


def _template(pool, name: str, device, amounts: dict[str, Decimal] | None) -> dict:
    return objects.claim_template(name, requests=[pool.request(devices=(device,),
                                                               capacity=_amounts(amounts) if amounts else None)])


def test_claims_share_a_device_up_to_its_capacity(k8s, dra_namespace, shareable_under_test):
    ns = dra_namespace
    pool = shareable_under_test(1)
    device = pool.devices[0]
    capacities = capabilities.consumable(device.published)
    # Two claims of (at most) half of every consumable capacity each: both fit on the one device.
    half = {c: capacity.largest_valid(e, capabilities.quantity(e["value"]) / 2) for c, e in capacities.items()}
    if any(v is None for v in half.values()):
        pytest.skip(f"{device.path}: no valid request of half a capacity ({capacities})")
    shares: dict[str, Decimal] = {c: v for c, v in half.items() if v is not None}
    # Then one claim of a little more than is left of the first capacity (the least of the others).
    name = sorted(capacities)[0]
    left = capabilities.quantity(capacities[name]["value"]) - 2 * shares[name]
    more = capacity.smallest_valid_above(capacities[name], left)
    least = {c: capacity.smallest_valid(e, Decimal(0)) for c, e in capacities.items() if c != name}
    if more is None or any(v is None for v in least.values()):
        pytest.skip(f"{device.path}: no valid request of more than the {left} of {name} left by two halves")
    too_much = {name: more, **{c: v for c, v in least.items() if v is not None}}
    where = f"driver {pool.driver}, node {pool.node}, device {device.path}, capacities {capacities}"
    for template, amounts in (("half-a", shares), ("half-b", shares), ("too-much", too_much)):
        k8s.resource.create_namespaced_resource_claim_template(ns, _template(pool, template, device, amounts))

    for pod in ("half-a", "half-b"):
        k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim(pod, pod)))
    a, b = (checks.running(k8s, ns, p, timeout=120) and _share(k8s, ns, p) for p in ("half-a", "half-b"))
    assert (a.device, b.device) == (device.name, device.name), where
    assert a.share_id and b.share_id and a.share_id != b.share_id, (where, a.share_id, b.share_id)
    assert (_consumed(a, shares), _consumed(b, shares)) == (shares, shares), (where, a, b)

    # What the halves hold leaves too little for the third claim, until one of them goes.
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("too-much", "too-much")))
    checks.unschedulable(k8s, ns, "too-much")
    k8s.core.delete_namespaced_pod("half-a", ns)
    checks.running(k8s, ns, "too-much", timeout=120)
    third = _share(k8s, ns, "too-much")
    assert third.device == device.name and _consumed(third, too_much) == too_much, (where, third)


def test_request_policy_rounds_up_to_a_valid_size(k8s, dra_namespace, shareable_under_test):
    ns = dra_namespace
    pool = shareable_under_test(2)
    odd_device, default_device = pool.devices[:2]
    capacities = capabilities.consumable(odd_device.published)
    # A request between two valid sizes of the first capacity with room for one: rounded up to the next.
    between = None
    for name, entry in sorted(capacities.items()):
        low = capacity.smallest_valid(entry, Decimal(0))
        above = capacity.smallest_valid(entry, low + Decimal("0.001")) if low is not None else None
        if low is not None and above is not None and above - low > 1:
            between = name, (low + above) / 2, above
            break
    if between is None:
        pytest.skip(f"{odd_device.path}: no capacity whose policy has a size between two valid ones ({capacities})")
    name, asked, rounded = between
    asked = Decimal(int(asked))  # a whole number of units: a quantity every API client writes the same way
    least = {c: capacity.smallest_valid(e, Decimal(0)) for c, e in capacities.items() if c != name}
    odd = {name: asked, **{c: v for c, v in least.items() if v is not None}}
    k8s.resource.create_namespaced_resource_claim_template(ns, _template(pool, "odd", odd_device, odd))
    k8s.resource.create_namespaced_resource_claim_template(ns, _template(pool, "default", default_device, None))
    for pod in ("odd", "default"):
        k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim(pod, pod)))
        checks.running(k8s, ns, pod, timeout=120)
    where = f"driver {pool.driver}, node {pool.node}, capacities {capacities}"
    assert _consumed(_share(k8s, ns, "odd"), capacities).get(name) == capacity.smallest_valid(capacities[name], asked) == rounded, (
        f"{where}: {name} {asked} requested on {odd_device.path}, {_share(k8s, ns, 'odd').consumed_capacity} allocated")
    expected = {c: capacity.default_share(e) for c, e in capabilities.consumable(default_device.published).items()}
    assert _consumed(_share(k8s, ns, "default"), expected) == expected, (
        f"{where}: a request naming no amount on {default_device.path}: "
        f"{_share(k8s, ns, 'default').consumed_capacity} allocated, the policy's defaults are {expected}")
