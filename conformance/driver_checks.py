"""Checks of what a DRA driver publishes, as pure functions over ResourceSlice dicts.

Each returns a list of defects, each naming the slice/pool/device and what is wrong, so a failing
conformance test says exactly what the driver got wrong. Used by test_driver_checks.py against the
driver under test (fake or a vendor's), and by the self-tests against deliberately broken drivers.
"""

from __future__ import annotations

import re
from collections import defaultdict

from fake_devices.schema import quantity_value

STD = "resource.kubernetes.io/"
PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
PCI_BUS_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
STANDARD_TYPES = {STD + "numaNode": "int", STD + "pcieRoot": "string", STD + "pciBusID": "string"}


def _pools(slices: list[dict]) -> dict[tuple[str, str], list[dict]]:
    pools: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for s in slices:
        pools[(s["spec"]["driver"], s["spec"]["pool"]["name"])].append(s)
    return pools


def _current(pool_slices: list[dict]) -> list[dict]:
    """The slices of the pool's newest generation (older ones are being replaced)."""
    newest = max(s["spec"]["pool"]["generation"] for s in pool_slices)
    return [s for s in pool_slices if s["spec"]["pool"]["generation"] == newest]


def _quantity(text):  # an exact Decimal

    return quantity_value(str(text))


def pools_complete(slices: list[dict]) -> list[str]:
    defects = []
    for (driver, pool), pool_slices in sorted(_pools(slices).items()):
        current = _current(pool_slices)
        counts = {s["spec"]["pool"]["resourceSliceCount"] for s in current}
        if len(counts) != 1:
            defects.append(f"pool {driver}/{pool}: slices disagree on resourceSliceCount {sorted(counts)}")
        elif len(current) != next(iter(counts)):
            defects.append(f"pool {driver}/{pool}: incomplete: resourceSliceCount is {next(iter(counts))} but "
                           f"{len(current)} slice(s) of generation {current[0]['spec']['pool']['generation']} exist")
    return defects


def devices_unique(slices: list[dict]) -> list[str]:
    defects = []
    for (driver, pool), pool_slices in sorted(_pools(slices).items()):
        seen: dict[str, str] = {}
        for s in _current(pool_slices):
            for device in s["spec"].get("devices") or []:
                if device["name"] in seen:
                    defects.append(f"pool {driver}/{pool}: device {device['name']} is published twice "
                                   f"(slices {seen[device['name']]} and {s['metadata']['name']})")
                seen[device["name"]] = s["metadata"]["name"]
    return defects


def standard_attributes(slices: list[dict]) -> list[str]:
    defects = []
    for s in slices:
        for device in s["spec"].get("devices") or []:
            where = f"{s['spec']['driver']}/{s['spec']['pool']['name']}/{device['name']}"
            for name, value in (device.get("attributes") or {}).items():
                expected = STANDARD_TYPES.get(name)
                if expected is None:
                    continue
                kinds = [k for k, v in value.items() if v is not None]
                if kinds != [expected]:
                    defects.append(f"{where}: {name} must be of type {expected}, is {', '.join(kinds) or 'empty'}")
                elif name == STD + "pcieRoot" and not PCIE_ROOT.match(value["string"]):
                    defects.append(f"{where}: {name} {value['string']!r} is not of the form pci<domain>:<bus>")
                elif name == STD + "pciBusID" and not PCI_BUS_ID.match(value["string"]):
                    defects.append(f"{where}: {name} {value['string']!r} is not a PCI address dddd:bb:dd.f")
                elif name == STD + "numaNode" and value["int"] < 0:
                    defects.append(f"{where}: {name} is negative ({value['int']}); it must not be published then")
    return defects


def numa_consistent_with_pcie_root(slices: list[dict]) -> list[str]:
    """All devices behind one PCIe root of a node sit on one NUMA node."""
    roots: dict[tuple[str, str], dict[int, str]] = defaultdict(dict)
    for s in slices:
        node = s["spec"].get("nodeName") or s["spec"]["pool"]["name"]
        for device in s["spec"].get("devices") or []:
            attributes = device.get("attributes") or {}
            root = (attributes.get(STD + "pcieRoot") or {}).get("string")
            numa = (attributes.get(STD + "numaNode") or {}).get("int")
            if root is not None and numa is not None:
                roots[(node, root)].setdefault(numa, f"{s['spec']['driver']}/{device['name']}")
    return [f"node {node}: PCIe root {root} has devices on NUMA nodes {sorted(numas)} "
            f"(e.g. {', '.join(numas[n] for n in sorted(numas))})"
            for (node, root), numas in sorted(roots.items()) if len(numas) > 1]


def counters_add_up(slices: list[dict]) -> list[str]:
    """Every consumed counter exists in its pool's counter set and never exceeds what the set holds."""
    defects = []
    for (driver, pool), pool_slices in sorted(_pools(slices).items()):
        current = _current(pool_slices)
        sets = {cs["name"]: {k: _quantity(v["value"]) for k, v in cs["counters"].items()}
                for s in current for cs in s["spec"].get("sharedCounters") or []}
        for s in current:
            for device in s["spec"].get("devices") or []:
                for use in device.get("consumesCounters") or []:
                    where = f"{driver}/{pool}/{device['name']}"
                    available = sets.get(use["counterSet"])
                    if available is None:
                        defects.append(f"{where}: consumes from counter set {use['counterSet']!r}, "
                                       "which the pool does not publish")
                        continue
                    for counter, value in use["counters"].items():
                        if counter not in available:
                            defects.append(f"{where}: consumes unknown counter {counter!r} of {use['counterSet']}")
                        elif _quantity(value["value"]) > available[counter]:
                            defects.append(f"{where}: consumes {value['value']} of {counter} but "
                                           f"{use['counterSet']} holds only {available[counter]:g}")
    return defects


def _devices(slices: list[dict]):
    """(driver, pool, slice name, node or None, device) of every device in the newest generation of its pool."""
    for (driver, pool), pool_slices in sorted(_pools(slices).items()):
        for s in _current(pool_slices):
            for device in s["spec"].get("devices") or []:
                yield driver, pool, s["metadata"]["name"], s["spec"].get("nodeName"), device


def _string_attribute(driver: str, device: dict, local_name: str) -> tuple[str, str] | None:
    """(full attribute name, value) of the string attribute `local_name` in any domain (`uuid`,
    `<driver>/uuid`, `vendor.example/uuid` alike), or None."""
    for name, value in (device.get("attributes") or {}).items():
        if name.rsplit("/", 1)[-1].lower() == local_name.lower() and value.get("string"):
            return name, value["string"]
    return None


def identities_unique(slices: list[dict]) -> list[str]:
    """Where a driver publishes device identities, they are unique: a `uuid` attribute within the
    driver (a UUID names one device in the whole cluster), `resource.kubernetes.io/pciBusID` within a
    node (the same address on two nodes is two devices). Partitions of one device (consuming from a
    common counter set of their pool, like a GPU and its MIG instances, or dra-example-driver's
    --gpu-partitions) may share their device's PCI address and uuid."""
    defects = []
    uuids: dict[tuple[str, str], str] = {}
    uuid_sets: dict[tuple[str, str], set[tuple[str, str]]] = {}
    bus_ids: dict[tuple[str, str, str], str] = {}
    counter_sets: dict[tuple[str, str, str], set[str]] = {}
    for driver, pool, slice_name, node, device in _devices(slices):
        where = f"{driver}/{pool}/{device['name']} (slice {slice_name})"
        shares = {use["counterSet"] for use in device.get("consumesCounters") or []}
        found = _string_attribute(driver, device, "uuid")
        if found:
            uuid_key = (driver, found[1])
            pooled = {(pool, name) for name in shares}
            if uuid_key in uuids and not (pooled & uuid_sets[uuid_key]):
                defects.append(f"driver {driver}: {found[0]} {found[1]!r} is published for two devices: "
                               f"{uuids[uuid_key]} and {where}")
            uuids.setdefault(uuid_key, where)
            uuid_sets.setdefault(uuid_key, pooled)
        bus_id = ((device.get("attributes") or {}).get(STD + "pciBusID") or {}).get("string")
        if bus_id:
            key = (driver, node or pool, bus_id)
            if key in bus_ids and not (shares & counter_sets[key]):
                defects.append(f"driver {driver}: {STD}pciBusID {bus_id!r} is published for two devices on "
                               f"{'node ' + node if node else 'pool ' + pool}: {bus_ids[key]} and {where}")
            bus_ids.setdefault(key, where)
            counter_sets.setdefault(key, shares)
    return defects


BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def _says_healthy(device: dict) -> tuple[str, object] | None:
    """(attribute, value) when the driver's own health attribute calls the device healthy: `health`
    (string "Healthy", any case) or `healthy` (bool true), in any domain; None otherwise."""
    for name, value in (device.get("attributes") or {}).items():
        local = name.rsplit("/", 1)[-1].lower()
        if local == "health" and str(value.get("string", "")).lower() == "healthy":
            return name, value["string"]
        if local == "healthy" and value.get("bool") is True:
            return name, True
    return None


def healthy_devices_untainted(slices: list[dict]) -> list[str]:
    """A device the driver itself publishes as healthy carries no NoSchedule/NoExecute taint of the
    driver (slice taints are the driver's own; DeviceTaintRules are separate objects)."""
    defects = []
    for driver, pool, slice_name, _, device in _devices(slices):
        healthy = _says_healthy(device)
        blocking = [t for t in device.get("taints") or [] if t.get("effect") in BLOCKING_EFFECTS]
        if healthy and blocking:
            taints = ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in blocking)
            defects.append(f"{driver}/{pool}/{device['name']} (slice {slice_name}): published as healthy "
                           f"({healthy[0]}={healthy[1]}) but tainted {taints}")
    return defects


def nodes_exist(slices: list[dict], nodes: set[str]) -> list[str]:
    """Every node-local slice belongs to a node of the cluster."""
    return [f"driver {s['spec']['driver']}: slice {s['metadata']['name']} (pool {s['spec']['pool']['name']}) "
            f"is for node {s['spec']['nodeName']!r}, which does not exist"
            for s in slices if s["spec"].get("nodeName") and s["spec"]["nodeName"] not in nodes]


def pools_on_nodes(slices: list[dict], drivers: tuple[str, ...], expected_nodes: list[str]) -> list[str]:
    """Each node expected to have the drivers' devices (the vendor file's nodeSelector) has a
    node-local pool of every driver, with at least one device."""
    has = {(s["spec"]["driver"], s["spec"].get("nodeName")) for s in slices if s["spec"].get("devices")}
    return [f"driver {driver}: node {node} matches the vendor file's nodeSelector but has no ResourceSlice "
            "with devices for it" for driver in drivers for node in expected_nodes if (driver, node) not in has]


def invalid_pools(slices: list[dict]) -> list[str]:
    """The pools the scheduler calls invalid ("invalid resource pools were encountered"), each
    named with its driver and why: incomplete or disagreeing slice counts, a device name twice."""
    return pools_complete(slices) + devices_unique(slices)


# checks over what the driver publishes alone (the cluster-dependent ones take more arguments)
ALL_CHECKS = {"pools are complete": pools_complete, "device names are unique": devices_unique,
              "standard attributes have standard types": standard_attributes,
              "numaNode agrees with pcieRoot": numa_consistent_with_pcie_root,
              "counters add up": counters_add_up,
              "device identities are unique": identities_unique,
              "healthy devices are not tainted": healthy_devices_untainted}


def _has_standard_attribute(slices: list[dict]) -> bool:
    return any(name in STANDARD_TYPES for *_, d in _devices(slices) for name in d.get("attributes") or {})


def _has(slices: list[dict], *names: str) -> bool:
    return all(any(n in (d.get("attributes") or {}) for *_, d in _devices(slices)) for n in names)


# What a check looks at: where the driver publishes none of it, the check is "not applicable" (never
# a pass over nothing). Checks not listed always apply.
APPLIES = {
    "standard attributes have standard types": (_has_standard_attribute,
                                                "publishes no standard (resource.kubernetes.io/) attribute"),
    "numaNode agrees with pcieRoot": (lambda s: _has(s, STD + "numaNode", STD + "pcieRoot"),
                                      "publishes no device with both numaNode and pcieRoot"),
    "counters add up": (lambda s: any(d.get("consumesCounters") for *_, d in _devices(s)),
                        "publishes no device that consumes counters"),
    "device identities are unique": (lambda s: any(_string_attribute(drv, d, "uuid") or
                                                   STD + "pciBusID" in (d.get("attributes") or {})
                                                   for drv, *_, d in _devices(s)),
                                     "publishes neither uuid nor pciBusID attributes"),
    "healthy devices are not tainted": (lambda s: any(_says_healthy(d) for *_, d in _devices(s)),
                                        "publishes no health attribute (health / healthy)"),
}
