"""Which published devices a DeviceClass selects, by evaluating its CEL selectors here (cel-python).

The scheduler evaluates a class's selectors against every device of every driver in the cluster, so
a class that selects, or fails on, another driver's device is a defect of the class: claims of it can
land on the wrong hardware, or fail with a CEL runtime error. Evaluating locally over the published
ResourceSlices sees all devices at once and allocates nothing.

The environment mirrors the DRA one: `device.driver`, `device.attributes[domain][name]` (an
unqualified attribute lives in the driver's domain), `device.allowMultipleAllocations`. Capacity and
the Kubernetes CEL extensions (quantity, semver) are not modelled: an expression that uses them is
"not evaluated" here (never a pass, never a failure). A missing key or member is a runtime error,
as it is in the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import celpy

RUNTIME_ERRORS = ("no such key", "no such member", "no such attribute")  # what the scheduler would also hit


@dataclass
class Selection:
    """What one class selects among the published devices."""
    name: str
    selected: list[tuple[str, str, str]] = field(default_factory=list)  # (driver, pool, device)
    errors: list[tuple[tuple[str, str, str], str]] = field(default_factory=list)  # runtime errors, per device
    not_evaluated: str = ""  # why the class could not be evaluated here (unsupported CEL), else ""

    def drivers(self) -> set[str]:
        return {driver for driver, _, _ in self.selected}


def _activation(driver: str, device: dict) -> dict:
    attributes: dict[str, dict] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, _, local = name.rpartition("/")
        kind, = [k for k, v in value.items() if v is not None][:1] or [None]
        if kind is not None:
            attributes.setdefault(domain or driver, {})[local] = value[kind]
    return {"device": celpy.json_to_cel({"driver": driver, "attributes": attributes,
                                         "allowMultipleAllocations": bool(device.get("allowMultipleAllocations"))})}


def _newest_devices(slices: list[dict]):
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
        newest[key] = max(newest.get(key, 0), s["spec"]["pool"]["generation"])
    for s in slices:
        driver, pool = s["spec"]["driver"], s["spec"]["pool"]["name"]
        if s["spec"]["pool"]["generation"] == newest[(driver, pool)]:
            for device in s["spec"].get("devices") or []:
                yield driver, pool, device


def evaluate(device_class: dict, slices: list[dict]) -> Selection:
    """Evaluate a DeviceClass (as a dict) against every device in `slices` (all drivers')."""
    result = Selection(device_class["metadata"]["name"])
    env = celpy.Environment()
    programs = []
    for selector in (device_class.get("spec") or {}).get("selectors") or []:
        expression = (selector.get("cel") or {}).get("expression", "")
        try:
            programs.append(env.program(env.compile(expression)))
        except Exception as err:  # cel-python's parser or a construct it does not know
            result.not_evaluated = f"selector {expression!r} cannot be evaluated here: {err}"
            return result
    for driver, pool, device in _newest_devices(slices):
        where = (driver, pool, device["name"])
        activation = _activation(driver, device)
        matched = True
        for program in programs:  # all selectors must be true, like the scheduler's
            try:
                value = program.evaluate(activation)
            except Exception as err:
                text = str(err)
                if any(marker in text for marker in RUNTIME_ERRORS):
                    result.errors.append((where, text))
                else:
                    result.not_evaluated = f"cannot be evaluated here ({text[:200]})"
                    return result
                matched = False
                break
            if isinstance(value, Exception):
                result.errors.append((where, str(value)))
                matched = False
                break
            if not bool(value):
                matched = False
                break
        if matched:
            result.selected.append(where)
    return result


def defects(selection: Selection, own_drivers: tuple[str, ...], vendor_file_field: str) -> list[str]:
    """What is wrong with a class that should select `own_drivers`' devices and nothing else."""
    if selection.not_evaluated:
        return []
    found = []
    foreign = [d for d in selection.selected if d[0] not in own_drivers]
    if foreign:
        sample = ", ".join("/".join(d) for d in foreign[:3])
        found.append(f"DeviceClass {selection.name} ({vendor_file_field}) selects {len(foreign)} device(s) of "
                     f"other drivers, e.g. {sample}: its selectors must pin device.driver")
    if not any(d[0] in own_drivers for d in selection.selected):
        found.append(f"DeviceClass {selection.name} ({vendor_file_field}) selects none of the devices of "
                     f"{', '.join(own_drivers)}")
    if selection.errors:
        (driver, pool, device), text = selection.errors[0]
        found.append(f"DeviceClass {selection.name} ({vendor_file_field}): its selector fails with a CEL runtime "
                     f"error on {len(selection.errors)} device(s), e.g. {driver}/{pool}/{device} ({text}); the "
                     "scheduler refuses claims of the class while such a device is published")
    return found
