"""Partitionable devices (KEP-4815, beta in 1.37): a driver publishes shared counter sets (a GPU's
memory and compute) and devices that consume from them (its partitions, the whole GPU), and the real
scheduler never lets the allocated devices of a set consume more than it has.

Runs against the driver under test (`partitions_under_test`): the fake driver's a100-mig profile (MIG
placements), or a vendor's driver whose slices show devices consuming shared counters, e.g.
dra-example-driver with --gpu-partitions. What must and must not fit is worked out from the counters
the slices publish, never from device names.
"""

from __future__ import annotations

import pytest

from conformance import checks, objects

pytestmark = [pytest.mark.dra_feature("DRAPartitionableDevices", maturity="beta")]


def _allocated(k8s, ns: str, pod: str) -> list[str]:
    return sorted(device for _, _, device in checks.allocated_devices(checks.pod_claim(k8s, ns, pod)))


def test_device_using_a_whole_counter_set_blocks_the_others_until_freed(k8s, dra_namespace, partitions_under_test):
    ns = dra_namespace
    pool = partitions_under_test(2)
    first, second = pool.counter_sets
    big = first.blocker()
    if big is None:
        pytest.skip(f"no device of {first.path} takes so much that no other device of the set fits beside it "
                    f"(devices: {first.describe()})")
    others = [d for d in first.devices if d != big]
    where = f"driver {pool.driver}, node {pool.node}, {first.path} ({first.describe()})"
    for name, devices in (("whole", (big,)), ("any-other", tuple(others)), ("control", second.devices)):
        k8s.resource.create_namespaced_resource_claim_template(ns, pool.template(name, devices=devices))

    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("big", "whole")))
    checks.running(k8s, ns, "big", timeout=120)
    assert _allocated(k8s, ns, "big") == [big.name], where

    # The big device holds the set: none of the set's other devices can be allocated ...
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("blocked", "any-other")))
    checks.unschedulable(k8s, ns, "blocked")  # fails, with the pod's state, if the scheduler placed it
    # ... while a device of another set is served at once.
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("control", "control")))
    checks.running(k8s, ns, "control", timeout=120)
    (device,) = _allocated(k8s, ns, "control")
    assert device in {d.name for d in second.devices}, f"{second.path}: got {device}"

    # Freeing the big device returns the counters: the waiting pod gets a device of the set.
    k8s.core.delete_namespaced_pod("big", ns)
    checks.running(k8s, ns, "blocked", timeout=120)
    (device,) = _allocated(k8s, ns, "blocked")
    assert device in {d.name for d in others}, f"{where}: got {device}"


def test_devices_never_overdraw_their_counter_set(k8s, dra_namespace, partitions_under_test):
    ns = dra_namespace
    pool = partitions_under_test(1)
    (counter_set,) = pool.counter_sets
    together, rest = counter_set.fill()
    if len(together) < 2 or not rest:
        pytest.skip(f"{counter_set.path}: needs two or more devices that fit together and one that does not fit "
                    f"beside them (devices: {counter_set.describe()})")
    where = (f"driver {pool.driver}, node {pool.node}, {counter_set.path} with counters "
             f"{ {c: str(v) for c, v in sorted(counter_set.counters.items())} }")
    k8s.resource.create_namespaced_resource_claim_template(
        ns, pool.template("together", count=len(together), devices=tuple(together)))
    k8s.resource.create_namespaced_resource_claim_template(ns, pool.template("one-more", devices=tuple(rest)))
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("together", "together")))
    checks.running(k8s, ns, "together", timeout=120)
    assert _allocated(k8s, ns, "together") == sorted(d.name for d in together), where

    # The set has no room left for any of its other devices.
    k8s.core.create_namespaced_pod(ns, pool.pod(objects.pod_with_template_claim("one-more", "one-more")))
    checks.unschedulable(k8s, ns, "one-more")  # fails, with the pod's state, if one of them was allocated
