"""Partitionable devices as the slices describe them: the shared counter sets of a pool, the devices that
consume from each (the partitions of one physical device), and which sets are free."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from conformance.published_devices import BLOCKING_EFFECTS, Device, _newest_slices, in_use
from harness.config.capabilities import quantity
from harness.k8s.client import Clients


@dataclass(frozen=True)
class CounterSet:
    """One shared counter set of a pool and the devices of the pool that consume from it (and from no
    other set): the partitions of one physical device, as the slices describe them."""

    driver: str
    pool: str
    node: str
    name: str
    counters: dict = field(hash=False, compare=False)  # counter -> Decimal
    devices: tuple[Device, ...] = ()

    @property
    def path(self) -> str:
        return f"counter set {self.name} of pool {self.driver}/{self.pool}"

    def consumes(self, device: Device) -> dict[str, Decimal]:
        (use,) = [u for u in device.published.get("consumesCounters") or [] if u.get("counterSet") == self.name]
        return {c: quantity(v["value"]) for c, v in (use.get("counters") or {}).items()}

    def fits(self, device: Device, taken) -> bool:
        """Whether `device` can be allocated beside `taken` (devices of this set) by the counters."""
        left = dict(self.counters)
        for other in taken:
            for counter, value in self.consumes(other).items():
                left[counter] = left.get(counter, Decimal(0)) - value
        return all(value <= left.get(counter, Decimal(0)) for counter, value in self.consumes(device).items())

    def share(self, device: Device) -> Decimal:
        """How much of the set the device takes (the sum of its fractions of each counter)."""
        return sum((value / self.counters[c] for c, value in self.consumes(device).items() if self.counters.get(c)),
                   Decimal(0))

    def blocker(self) -> Device | None:
        """The largest device that, allocated, leaves room for no other device of the set (a whole GPU)."""
        found = [d for d in self.devices if self.fits(d, []) and not any(self.fits(e, [d]) for e in self.devices
                                                                       if e != d)]
        return max(found, key=lambda d: (self.share(d), d.name), default=None)

    def fill(self) -> tuple[list[Device], list[Device]]:
        """Smallest first, each device taken while it fits: (the devices that fit together, the others).
        None of the others fits beside the first: each did not fit when fewer were taken."""
        taken: list[Device] = []
        rest: list[Device] = []
        for device in sorted(self.devices, key=lambda d: (self.share(d), len(d.name), d.name)):
            (taken if self.fits(device, taken) else rest).append(device)
        return taken, rest

    def describe(self, devices=None) -> str:
        chosen = self.devices if devices is None else devices
        def published(device: Device) -> str:  # the quantities as the slice writes them
            (use,) = [u for u in device.published.get("consumesCounters") or [] if u.get("counterSet") == self.name]
            return ", ".join(f"{c} {v['value']}" for c, v in sorted((use.get("counters") or {}).items()))

        return ", ".join(f"{d.name} ({published(d)})" for d in chosen)


def counter_sets(k8s: Clients, drivers, selected: set[tuple[str, str, str]] | None = None
                 ) -> dict[tuple[str, str], list[CounterSet]]:
    """{(driver, node): free counter sets}: node-local sets with at least two devices (selected, if
    given) consuming from them alone, none of the set's devices allocated or carrying a blocking taint."""
    slices = _newest_slices([k8s.api_client.sanitize_for_serialization(s) for s in k8s.resource.list_resource_slice().items
                             if s.spec.driver in drivers])
    used = in_use(k8s)
    shared: dict[tuple[str, str], dict[str, dict[str, Decimal]]] = {}
    members: dict[tuple[str, str, str], list[Device]] = {}
    for s in slices:
        driver, pool = s["spec"]["driver"], s["spec"]["pool"]["name"]
        for counter_set in s["spec"].get("sharedCounters") or []:
            shared.setdefault((driver, pool), {})[counter_set["name"]] = {
                c: quantity(v["value"]) for c, v in (counter_set.get("counters") or {}).items()}
        node = s["spec"].get("nodeName")
        for device in s["spec"].get("devices") or [] if node else []:
            uses = device.get("consumesCounters") or []
            if len(uses) == 1:
                members.setdefault((driver, pool, uses[0]["counterSet"]), []).append(
                    Device(driver, pool, device["name"], node, device))
    found: dict[tuple[str, str], list[CounterSet]] = {}
    for (driver, pool, name), devices in sorted(members.items()):
        counters = shared.get((driver, pool), {}).get(name)
        if counters is None or any((d.driver, d.pool, d.name) in used for d in devices):
            continue
        if any(t.get("effect") in BLOCKING_EFFECTS for d in devices for t in d.published.get("taints") or []):
            continue
        if selected is not None:
            devices = [d for d in devices if (d.driver, d.pool, d.name) in selected]
        if len(devices) >= 2:
            devices.sort(key=lambda d: (len(d.name), d.name))
            found.setdefault((driver, devices[0].node), []).append(
                CounterSet(driver, pool, devices[0].node, name, counters, tuple(devices)))
    return found
