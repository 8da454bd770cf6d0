"""Checks of what a DRA driver publishes, as pure functions over ResourceSlice dicts.

Each returns a list of defects, each naming the slice/pool/device and what is wrong, so a failing
conformance test says exactly what the driver got wrong. Used by test_driver_checks.py against the
driver under test (fake or a vendor's), and by the self-tests against deliberately broken drivers.
"""

from __future__ import annotations

import re
from collections import defaultdict

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


def _quantity(text) -> float:
    from fake_devices.schema import quantity_value

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


ALL_CHECKS = {"pools are complete": pools_complete, "device names are unique": devices_unique,
              "standard attributes have standard types": standard_attributes,
              "numaNode agrees with pcieRoot": numa_consistent_with_pcie_root,
              "counters add up": counters_add_up}
