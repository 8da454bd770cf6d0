"""Deliberately broken drivers, for testing the tests.

The conformance suite must fail, naming the defect, against a driver that publishes bad data. These
variants post-process what the renderer produced (or ignore faults), so the self-tests can run real
conformance checks against a real, published, broken driver. Never used outside those tests.
"""

from __future__ import annotations

import copy

STD_NUMA = "resource.kubernetes.io/numaNode"


def _wrong_numa_type(slices: list[dict]) -> list[dict]:
    """numaNode published as a string instead of an int."""
    for slice_obj in slices:
        for device in slice_obj["spec"].get("devices") or []:
            value = device["attributes"].get(STD_NUMA)
            if value is not None:
                device["attributes"][STD_NUMA] = {"string": str(value["int"])}
    return slices


def _incomplete_pool(slices: list[dict]) -> list[dict]:
    """Announce one slice more than the pool has."""
    for slice_obj in slices:
        slice_obj["spec"]["pool"]["resourceSliceCount"] += 1
    return slices


def _bad_counters(slices: list[dict]) -> list[dict]:
    """A device consumes more of a counter than its counter set holds."""
    for slice_obj in slices:
        for device in slice_obj["spec"].get("devices") or []:
            for use in device.get("consumesCounters") or []:
                for name in use["counters"]:
                    if name.startswith("memory-slice-"):
                        use["counters"][name] = {"value": "2"}
                return slices
    return slices


TRANSFORMS = {"wrong-numa-type": _wrong_numa_type, "incomplete-pool": _incomplete_pool, "bad-counters": _bad_counters}
IGNORES_FAULTS = {"no-fault-taints"}
VARIANTS = (*TRANSFORMS, *IGNORES_FAULTS)


def apply(variant: str | None, by_driver: dict[str, list[dict]]) -> dict[str, list[dict]]:
    if variant not in TRANSFORMS:
        return by_driver
    return {driver: TRANSFORMS[variant](copy.deepcopy(slices)) for driver, slices in by_driver.items()}
