"""The devices a device plugin advertises: the whole GPUs of a node profile, each with its NUMA node
and a health the plugin can change (ListAndWatch streams send the complete list on every change)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from fake_devices import profile as profiles
from fake_devices import render

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"  # the API's two values (deviceplugin/v1beta1/constants.go)
NUMA_ATTRIBUTE = "resource.kubernetes.io/numaNode"
MAX_ID_LENGTH = 63  # api.proto: "Max length of this field is 63 characters"


@dataclass(frozen=True)
class Device:
    id: str
    numa_node: int | None = None


def gpus_of_profile(profile_name: str, node: str) -> list[Device]:
    """The whole GPUs the profile gives `node`, named as the fake DRA driver names them (gpu-0, ...),
    so the same physical device has the same name on both paths. MIG partitions are not advertised:
    a classic device plugin hands out whole GPUs."""
    prof = profiles.load(profile_name)
    drivers = render.Drivers("deviceplugin.invalid")
    devices, _ = render.devices_by_driver(prof, node, drivers).get(drivers.gpu, ([], []))
    result = []
    for device in devices:
        if "-mig-" in device["name"]:
            continue
        numa = (device.get("attributes") or {}).get(NUMA_ATTRIBUTE, {}).get("int")
        result.append(Device(device["name"], numa))
    return result


class DeviceList:
    """The advertised devices and their health; `wait_changed` lets a ListAndWatch stream sleep until
    the list changes or the plugin stops."""

    def __init__(self, devices: list[Device]):
        self._devices = list(devices)
        self._health = {d.id: HEALTHY for d in devices}
        self._version = 0
        self._closed = False
        self._changed = threading.Condition()

    def snapshot(self) -> tuple[int, list[tuple[Device, str]]]:
        with self._changed:
            return self._version, [(d, self._health[d.id]) for d in self._devices]

    def ids(self) -> list[str]:
        return [d.id for d in self._devices]

    def set_health(self, device_id: str, health: str) -> None:
        if device_id not in self._health:
            raise KeyError(device_id)
        if health not in (HEALTHY, UNHEALTHY):
            raise ValueError(f"health {health!r}: allowed {HEALTHY}, {UNHEALTHY}")
        with self._changed:
            if self._health[device_id] != health:
                self._health[device_id] = health
                self._version += 1
                self._changed.notify_all()

    def wait_changed(self, seen: int, timeout: float) -> bool:
        """True when the list is newer than version `seen`; False on timeout or close."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or self._version != seen, timeout)
            return not self._closed and self._version != seen

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
