"""The devices this driver publishes for this node: its ResourceSlices, as the API (and so the
scheduler) has them. Prepare reads a device's attributes and capacity from here, so the CDI spec
describes exactly the device that was allocated, whatever produced the slices.

Only slices of the newest generation of each pool count (the scheduler ignores older ones).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fake_devices.kubeletplugin.watch import ListWatch


class Inventory:
    def __init__(self, list_slices: Callable, driver: str, node: str,
                 on_change: Callable[[], None] | None = None):
        self.driver, self.node = driver, node
        self._on_change = on_change
        self._lock = threading.Lock()
        self._devices: dict[tuple[str, str], dict] = {}
        self._seen: dict[tuple[str, str], None] = {}  # every device ever published here (insertion-ordered)
        self._watch = ListWatch(f"slices of {driver} on {node}", list_slices, self._update,
                                field_selector=f"spec.nodeName={node},spec.driver={driver}")

    def start(self) -> "Inventory":
        self._watch.start()
        return self

    def stop(self) -> None:
        self._watch.stop()

    def wait_synced(self, timeout: float) -> bool:
        return self._watch.wait_synced(timeout)

    @property
    def synced(self) -> bool:
        return self._watch.synced

    @property
    def last_error(self) -> str | None:
        return self._watch.last_error

    def lookup(self, pool: str, device: str, *, refresh: bool = True) -> dict | None:
        """The published device, or None. A miss lists again once: the allocation may be based on a
        slice newer than the last watch event."""
        with self._lock:
            found = self._devices.get((pool, device))
        if found is None and refresh:
            self._watch.relist()
            with self._lock:
                found = self._devices.get((pool, device))
        return found

    def devices(self) -> dict[tuple[str, str], dict]:
        with self._lock:
            return dict(self._devices)

    def seen(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._seen)

    def pools(self) -> set[str]:
        with self._lock:
            return {pool for pool, _ in self._devices}

    def _update(self, slices: dict[str, dict]) -> None:
        newest: dict[str, int] = {}
        for obj in slices.values():
            pool = (obj.get("spec") or {}).get("pool") or {}
            newest[pool.get("name", "")] = max(newest.get(pool.get("name", ""), 0), int(pool.get("generation") or 0))
        devices = {}
        for obj in slices.values():
            spec = obj.get("spec") or {}
            pool = spec.get("pool") or {}
            if int(pool.get("generation") or 0) != newest.get(pool.get("name", "")):
                continue
            for device in spec.get("devices") or []:
                devices[(pool.get("name", ""), device.get("name", ""))] = device
        with self._lock:
            changed = devices.keys() != self._devices.keys() or devices != self._devices
            self._devices = devices
            for key in sorted(devices):
                self._seen.setdefault(key, None)
        if changed and self._on_change is not None:
            self._on_change()
