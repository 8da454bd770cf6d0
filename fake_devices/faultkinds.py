"""The fault kinds a test can inject into the fake driver, and everything each one causes: one table.

The slices (render.apply_faults), the kubelet plugin's DRAResourceHealth stream (kubeletplugin/health.py)
and the reference health monitor (healthmonitor.py) all read their consequence from `KINDS`, so a new kind
or a changed consequence is one row here. The fault ConfigMap (faults.py) stores, per node, the text
`device=kind,device=kind`; `decode` and `encode` are its only reader and writer, and refuse an unknown kind
the same way on both sides (a reader cannot fail: it reports the entry it skipped).

Pure data and the standard library: the kubelet plugin imports it at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from fake_devices.errors import Problem

TAINT_KEY = "dra-harness.x-k8s.io/fault"  # the device taint a fault publishes; its value is the kind


@dataclass(frozen=True)
class FaultKind:
    name: str
    taint_effect: str | None  # the device taint it publishes in the slice; None: no taint
    removes_device: bool  # the device disappears from its slice
    kubelet_health: str  # what the plugin's health stream reports: HEALTHY | UNHEALTHY
    monitor_state: str  # the reference health monitor's verdict: healthy | degraded | failed
    meaning: str  # what it does, for people (the health stream's message)

    @property
    def health_message(self) -> str:
        return f"fault '{self.name}' injected: {self.meaning}"


KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("warning", "None", False, "HEALTHY", "healthy",
              "published with a taint of effect None; the device works"),
    FaultKind("degraded", "NoSchedule", False, "HEALTHY", "degraded",
              "NoSchedule taint, no new allocations; running workloads keep the device"),
    FaultKind("unhealthy", "NoExecute", False, "UNHEALTHY", "failed",
              "NoExecute taint, pods using the device are evicted"),
    FaultKind("lost", None, True, "UNHEALTHY", "failed", "the device is no longer published"),
)}
NAMES = tuple(KINDS)
ALLOWED = ", ".join(NAMES)


def problem(where: str, kind: str) -> Problem | None:
    """The problem with a fault kind, or None if it is one."""
    return None if kind in KINDS else Problem(where, kind, "unknown fault kind", ALLOWED)


def decode(text: str, where: str = "faults") -> tuple[dict[str, str], list[Problem]]:
    """`device=kind,...` -> ({device: kind}, problems). An entry with an unknown kind or no device is left out
    and reported, so a hand-edited ConfigMap cannot stop a driver, and the reader still says what it skipped."""
    result: dict[str, str] = {}
    problems: list[Problem] = []
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        device, _, kind = item.partition("=")
        if not device:
            problems.append(Problem(where, item, "no device before '='", "device=kind"))
        elif (found := problem(where, kind)) is not None:
            problems.append(Problem(where, item, f"unknown fault kind {kind!r}", found.allowed))
        else:
            result[device] = kind
    return result, problems


def encode(faults: dict[str, str]) -> str:
    """{device: kind} -> `device=kind,...` (sorted); raises ValueError on an unknown kind: nothing else may
    be written."""
    unknown = sorted(kind for kind in faults.values() if kind not in KINDS)
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)} (allowed: {ALLOWED})")
    return ",".join(f"{device}={kind}" for device, kind in sorted(faults.items()))
