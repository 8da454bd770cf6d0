"""Deliberately broken drivers, for testing the tests.

The conformance suite must fail, naming the defect, against a driver that publishes bad data. These
variants post-process what the renderer produced (or ignore faults), so the self-tests can run real
conformance checks against a real, published, broken driver. Never used outside those tests, except
`no-fault-taints`: the health-monitor tests use it so that only the monitor under test isolates a
faulty device (conformance/test_health_monitor.py).
"""

from __future__ import annotations

import copy

STD_NUMA = "resource.kubernetes.io/numaNode"
# on a slice a variant publishes for a node other than the one it was rendered for (so the fake
# driver's controller keeps it with that node instead of deleting it as belonging to no node it serves)
RENDERED_FOR_LABEL = "dra-harness.x-k8s.io/variant-rendered-for"


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


def _refused_by_api(slices: list[dict]) -> list[dict]:
    """A device name the API server refuses (422): the driver must report it, not retry it silently."""
    for slice_obj in slices:
        for device in slice_obj["spec"].get("devices") or []:
            device["name"] = device["name"].upper().replace("-", "_")
            return slices
    return slices  # no device to rename (a driver with nothing on this node)


def _without_identities(device: dict) -> dict:
    """A copy of `device` without uuid or PCI address (so a copy is not also an identity defect)."""
    copied = copy.deepcopy(device)
    copied["attributes"] = {k: v for k, v in (copied.get("attributes") or {}).items()
                            if k.rsplit("/", 1)[-1] not in ("uuid", "pciBusID", "parentUUID")}
    return copied


def _first_with_devices(slices: list[dict]) -> dict | None:
    return next((s for s in slices if s["spec"].get("devices")), None)


def _duplicate_device_names(slices: list[dict]) -> list[dict]:
    """One more slice in the pool (counted in resourceSliceCount) that publishes a device name again."""
    first = _first_with_devices(slices)
    if first is None:
        return slices
    extra = copy.deepcopy(first)
    extra["metadata"]["name"] += "-again"
    extra["spec"]["devices"] = [_without_identities(first["spec"]["devices"][0])]
    extra["spec"]["devices"][0].pop("consumesCounters", None)
    for slice_obj in [*slices, extra]:
        slice_obj["spec"]["pool"]["resourceSliceCount"] = len(slices) + 1
    return [*slices, extra]


def _duplicate_attribute(slices: list[dict], attribute) -> list[dict]:
    """The next device carrying `attribute` gets the value of the first (not a partition of the same
    device: those share a counter set and may share their device's PCI address)."""
    seen, seen_sets = None, set()
    for slice_obj in slices:
        for device in slice_obj["spec"].get("devices") or []:
            name = next((k for k in device.get("attributes") or {} if k.rsplit("/", 1)[-1] == attribute), None)
            if name is None:
                continue
            sets = {use["counterSet"] for use in device.get("consumesCounters") or []}
            if seen is None:
                seen, seen_sets = device["attributes"][name], sets
            elif not sets & seen_sets:
                device["attributes"][name] = copy.deepcopy(seen)
                return slices
    return slices


def _slice_for_missing_node(slices: list[dict]) -> list[dict]:
    """One more slice, for a node that does not exist (a pool of its own)."""
    first = _first_with_devices(slices)
    if first is None:
        return slices
    ghost = copy.deepcopy(first)
    node = first["spec"]["nodeName"] + "-gone"
    ghost["metadata"]["name"] += "-gone"
    ghost["metadata"]["labels"] = {**ghost["metadata"].get("labels", {}), RENDERED_FOR_LABEL: first["spec"]["nodeName"]}
    ghost["spec"]["nodeName"] = node
    ghost["spec"]["pool"] = {"name": node, "generation": 1, "resourceSliceCount": 1}
    ghost["spec"]["devices"] = [_without_identities(d) for d in first["spec"]["devices"]]
    for device in ghost["spec"]["devices"]:
        device.pop("consumesCounters", None)
    return [*slices, ghost]


def _tainted_healthy_device(slices: list[dict]) -> list[dict]:
    """Every device says `health: Healthy`; the first one is nevertheless tainted NoSchedule."""
    tainted = False
    for slice_obj in slices:
        for device in slice_obj["spec"].get("devices") or []:
            device.setdefault("attributes", {})["health"] = {"string": "Healthy"}
            if not tainted:
                device["taints"] = [*device.get("taints", []),
                                    {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}]
                tainted = True
    return slices


TRANSFORMS = {"wrong-numa-type": _wrong_numa_type, "incomplete-pool": _incomplete_pool, "bad-counters": _bad_counters,
              "refused-by-api": _refused_by_api,
              "duplicate-device-names": _duplicate_device_names,
              "duplicate-uuid": lambda slices: _duplicate_attribute(slices, "uuid"),
              "duplicate-pci-bus-id": lambda slices: _duplicate_attribute(slices, "pciBusID"),
              "slice-for-missing-node": _slice_for_missing_node,
              "tainted-healthy-device": _tainted_healthy_device}
IGNORES_FAULTS = {"no-fault-taints"}
# DeviceClass selectors that forget `device.driver == ...`: they select other drivers' devices too
UNPINNED_CLASSES = {"class-selects-other-drivers"}
VARIANTS = (*TRANSFORMS, *IGNORES_FAULTS, *UNPINNED_CLASSES)


def class_expression(variant: str | None, driver: str, device_type: str) -> str:
    """The CEL selector of the fake driver's DeviceClass for `device_type`."""
    if variant in UNPINNED_CLASSES:
        return f'device.attributes[device.driver].type == "{device_type}"'
    return f'device.driver == "{driver}" && device.attributes["{driver}"].type == "{device_type}"'


def apply(variant: str | None, by_driver: dict[str, list[dict]]) -> dict[str, list[dict]]:
    if variant not in TRANSFORMS:
        return by_driver
    return {driver: TRANSFORMS[variant](copy.deepcopy(slices)) for driver, slices in by_driver.items()}
