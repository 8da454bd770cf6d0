"""What a driver's published ResourceSlices show it can do, for the features a vendor file may claim
(spec.features) that need something in the slices. One place for both sides: the suite's check that
a claim is backed by the slices (conformance/test_driver_checks.py) and the kind backend, which writes
the deployed fake driver's vendor file from what its slices show (harness.backends.kind.vendor_file)."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from fake_devices.quantity import parse

RANGE_BOUNDS = ("min", "max", "step")


def quantity(text) -> Decimal:
    return parse(str(text))


def consumable(device: dict) -> dict[str, dict]:
    """{capacity name: its published entry} of the capacities with a requestPolicy."""
    return {name: entry for name, entry in (device.get("capacity") or {}).items() if entry.get("requestPolicy")}


def ranged(device: dict) -> dict[str, dict]:
    """{capacity name: its published entry} of the capacities whose requestPolicy has a validRange."""
    return {name: entry for name, entry in consumable(device).items() if entry["requestPolicy"].get("validRange")}


def _fractional_quantity(text) -> bool:
    value = quantity(text)
    return value != value.to_integral_value()


def fractional(device: dict) -> dict[str, dict]:
    """The capacities whose requestPolicy.validRange has a fractional min, max or step: with
    DRAFractionalCapacityRange the scheduler rounds requests for them in milli-units (with integer
    arithmetic it would read 120m as 1)."""
    return {name: entry for name, entry in ranged(device).items()
            if any(_fractional_quantity(v) for k, v in entry["requestPolicy"]["validRange"].items()
                   if k in RANGE_BOUNDS and v is not None)}


Check = Callable[[list[dict], list[dict]], bool]  # (slices, their devices) -> shown
# a feature a vendor file may claim -> (what the slices must show for it, whether they do)
PUBLISHED: dict[str, tuple[str, Check]] = {
    "DRAPartitionableDevices": ("shared counters consumed by devices (sharedCounters, consumesCounters)",
                                lambda slices, devices: any(s["spec"].get("sharedCounters") for s in slices)
                                and any(d.get("consumesCounters") for d in devices)),
    "DRAConsumableCapacity": ("a device that allows multiple allocations (allowMultipleAllocations) with a capacity",
                              lambda slices, devices: any(d.get("allowMultipleAllocations") and d.get("capacity")
                                                          for d in devices)),
    "DRADeviceBindingConditions": ("a device with binding conditions (bindingConditions, bindingFailureConditions)",
                                   lambda slices, devices: any(d.get("bindingConditions") for d in devices)),
    "DRAFractionalCapacityRange": ("a capacity whose requestPolicy.validRange has a fractional min, max or step",
                                   lambda slices, devices: any(fractional(d) for d in devices)),
}


def devices_of(slices: list[dict]) -> list[dict]:
    return [d for s in slices for d in s["spec"].get("devices") or []]


def not_shown(slices: list[dict]) -> list[str]:
    """The features of PUBLISHED that `slices` (ResourceSlices as dicts) do not show."""
    devices = devices_of(slices)
    return [feature for feature, (_, shown) in PUBLISHED.items() if not shown(slices, devices)]
