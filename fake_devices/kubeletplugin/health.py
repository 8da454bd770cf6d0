"""Device health for the kubelet (DRAResourceHealth), derived from the fault-injection state.

The source is the same ConfigMap `<instance>-faults` that the control-plane half turns into device
taints (fake_devices/faults.py), so a fault shows up in the slice and in the pod's
allocatedResourcesStatus alike. Mapping (a MIG device shares its GPU's fault, as in the slices):

| fault        | health    | why                                                                 |
|--------------|-----------|---------------------------------------------------------------------|
| none/cleared | HEALTHY   |                                                                     |
| warning      | HEALTHY   | taint effect None: informational, the device works                  |
| degraded     | HEALTHY   | taint effect NoSchedule: no new allocations, running workloads keep it |
| unhealthy    | UNHEALTHY | taint effect NoExecute: pods using it are evicted                   |
| lost         | UNHEALTHY | the device vanished from its slice                                   |

UNKNOWN: before the fault state was read, or for a device that is neither published nor faulted
(it disappeared for another reason). Every message says which of these applies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fake_devices import faultkinds, render

HEALTHY, UNHEALTHY, UNKNOWN = "HEALTHY", "UNHEALTHY", "UNKNOWN"
# fault kind -> (health, message), from the one table of fault kinds
FAULT_HEALTH = {k.name: (k.kubelet_health, k.health_message) for k in faultkinds.KINDS.values()}


@dataclass(frozen=True)
class DeviceHealth:
    pool: str
    device: str
    health: str
    message: str
    since: int  # Unix seconds of the last change of health or message


def fault_kinds(devices: list[str], faults: dict[str, str]) -> dict[str, str | None]:
    """Each device's fault kind (or None), exactly as the slice renderer applies faults."""
    remaining = {d["name"]: d for d in render.apply_faults([{"name": name} for name in devices], faults)}
    kinds: dict[str, str | None] = {}
    for name in devices:
        if name not in remaining:
            kinds[name] = "lost"
        else:
            taints = remaining[name].get("taints") or []
            kinds[name] = taints[0]["value"] if taints else None
    return kinds


def assess(devices: list[tuple[str, str]], published: set[tuple[str, str]], faults: dict[str, str] | None,
           fault_source: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(pool, device) -> (health, message)."""
    if faults is None:
        return {key: (UNKNOWN, f"fault state not read yet from {fault_source}") for key in devices}
    kinds = fault_kinds(sorted({name for _, name in devices}), faults)
    result = {}
    for pool, name in devices:
        kind = kinds.get(name)
        if kind is not None:
            health, message = FAULT_HEALTH[kind]
            if name not in faults:
                message += f" (inherited from {name.split('-mig-', 1)[0]})"
        elif (pool, name) in published:
            health, message = HEALTHY, "no fault injected"
        else:
            health, message = UNKNOWN, "not published by the driver and no fault injected"
        result[(pool, name)] = (health, message)
    return result


class HealthMonitor:
    """Current health of every known device, with a version that changes whenever any device's
    health or message changes; streams wait on it."""

    def __init__(self, known: Callable[[], list[tuple[str, str]]], published: Callable[[], set[tuple[str, str]]],
                 fault_source: str, clock: Callable[[], float] = time.time):
        self._known, self._published = known, published
        self._fault_source = fault_source
        self._clock = clock
        self._faults: dict[str, str] | None = None
        self._state: dict[tuple[str, str], DeviceHealth] = {}
        self._version = 0
        self._closed = False
        self._cond = threading.Condition()

    def set_faults(self, faults: dict[str, str] | None) -> None:
        with self._cond:
            self._faults = None if faults is None else dict(faults)
        self.recompute()

    def recompute(self) -> None:
        devices = self._known()
        published = self._published()
        with self._cond:
            assessed = assess(devices, published, self._faults, self._fault_source)
            now = int(self._clock())
            state = {}
            for key, (health, message) in assessed.items():
                old = self._state.get(key)
                if old is not None and (old.health, old.message) == (health, message):
                    state[key] = old
                else:
                    state[key] = DeviceHealth(key[0], key[1], health, message, now)
            if state != self._state:
                self._state = state
                self._version += 1
                self._cond.notify_all()

    def snapshot(self) -> tuple[int, list[DeviceHealth]]:
        with self._cond:
            return self._version, [self._state[k] for k in sorted(self._state)]

    def wait_change(self, version: int, timeout: float, still_wanted: Callable[[], bool]) -> None:
        """Return when the version differs from `version`, on close, when `still_wanted()` turns
        false (after `wake()`), or after `timeout` seconds (a periodic resend)."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != version or self._closed or not still_wanted(), timeout)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
