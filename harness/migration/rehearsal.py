"""A node-by-node migration from a device plugin to DRA, while a bounded stream of the unchanged
workload manifest keeps being scheduled; the per-phase count of pods served by each path.

Phases: "device plugin everywhere", then one "migrate <node>" per node (drain the node's device
plugin, evict the pods it served, start the DRA driver there), then "DRA everywhere". The stream runs
in its own thread across all phases: one pod at a time, each waited for until Running (or for
`pod_timeout`), at most `in_flight` alive (the oldest is deleted first). It is paced by a budget, not
by the clock: each phase grants `pods_per_phase` pods for its migration step (the stream keeps going
while the node moves) and as many again once the node has moved; the stream waits when the budget is
spent, so it creates at most 2 x pods_per_phase per phase.
Every wait has a deadline; `close()` deletes every pod it made, also after a failure.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from harness.k8s import errors, wait
from harness.k8s.client import Clients
from harness.migration import workload


@dataclass(frozen=True)
class MigrationNode:
    name: str
    profile: str  # the node profile whose GPUs both paths serve
    devices: int  # how many: the device plugin's count and the DRA driver's devices
    real: bool = False  # run by a real kubelet (the local backend's real node)


class LegacyPath(Protocol):
    def start(self, node: MigrationNode) -> None: ...  # advertise; returns once allocatable shows it
    def drain(self, node: MigrationNode) -> None: ...  # withdraw; returns once allocatable is 0 or gone


class DraPath(Protocol):
    def start(self, node: MigrationNode) -> None: ...  # publish the node's devices; returns once published


@dataclass
class PodRecord:
    name: str
    phase: int
    node: str | None = None
    path: str | None = None  # workload.DEVICE_PLUGIN, workload.DRA, or None (not running in time)
    seconds: float = 0.0  # from create to Running
    devices: list[tuple[str, str, str]] = field(default_factory=list)  # DRA: (driver, pool, device) allocated
    evicted_in: int | None = None  # the phase whose drain deleted it while running
    problem: str = ""


@dataclass
class Phase:
    name: str
    migrated: list[str]  # nodes served by DRA once this phase's migration step is done
    seconds: float = 0.0


@dataclass
class Result:
    resource: str
    nodes: list[MigrationNode]
    phases: list[Phase]
    pods: list[PodRecord]
    problems: list[str]

    def phase_pods(self, index: int) -> list[PodRecord]:
        return [p for p in self.pods if p.phase == index]

    @property
    def ok(self) -> bool:
        return not self.problems and all(p.path for p in self.pods)

    def summary(self) -> list[dict]:
        rows = []
        for index, phase in enumerate(self.phases):
            pods = self.phase_pods(index)
            paths = Counter(p.path for p in pods)
            by_node: dict[str, dict[str, int]] = {}
            for pod in pods:
                if pod.node and pod.path:
                    by_node.setdefault(pod.node, {workload.DEVICE_PLUGIN: 0, workload.DRA: 0})[pod.path] += 1
            rows.append({"phase": phase.name, "migratedNodes": list(phase.migrated), "pods": len(pods),
                         "devicePlugin": paths[workload.DEVICE_PLUGIN], "dra": paths[workload.DRA],
                         "notScheduled": paths[None], "byNode": by_node,
                         "evicted": sum(1 for p in self.pods if p.evicted_in == index),
                         "maxSecondsToRunning": round(max((p.seconds for p in pods if p.path), default=0.0), 2),
                         "seconds": round(phase.seconds, 1)})
        return rows

    def to_dict(self) -> dict:
        return {"resource": self.resource, "ok": self.ok, "problems": list(self.problems),
                "nodes": [{"name": n.name, "profile": n.profile, "devices": n.devices, "real": n.real}
                          for n in self.nodes],
                "phases": self.summary(),
                "pods": [{"name": p.name, "phase": self.phases[p.phase].name, "node": p.node, "path": p.path,
                          "secondsToRunning": round(p.seconds, 2), "devices": [list(d) for d in p.devices],
                          "evictedIn": None if p.evicted_in is None else self.phases[p.evicted_in].name,
                          "problem": p.problem} for p in self.pods]}

    def markdown(self) -> str:
        lines = [f"# Migration rehearsal: `{self.resource}`", "",
                 f"Result: **{'PASS' if self.ok else 'FAIL'}**; nodes: "
                 + ", ".join(f"{n.name} ({n.devices} x {n.profile}{', real kubelet' if n.real else ''})"
                             for n in self.nodes), "",
                 "| phase | pods | via device plugin | via DRA | not scheduled | evicted by drain | slowest to Running (s) "
                 "| per node (device plugin/DRA) |",
                 "|---|---|---|---|---|---|---|---|"]
        for row in self.summary():
            per_node = ", ".join(f"{node} {counts[workload.DEVICE_PLUGIN]}/{counts[workload.DRA]}"
                                 for node, counts in sorted(row["byNode"].items()))
            lines.append(f"| {row['phase']} | {row['pods']} | {row['devicePlugin']} | {row['dra']} | "
                         f"{row['notScheduled']} | {row['evicted']} | {row['maxSecondsToRunning']} | {per_node} |")
        if self.problems:
            lines += ["", "Problems:", *[f"- {p}" for p in self.problems]]
        return "\n".join(lines) + "\n"


_EVICTED = object()  # what a workload pod's wait returns when a drain deleted the pod first


class _Stopped(Exception):
    """The rehearsal is over (done, failed or interrupted): the stream stops waiting at once."""


class Rehearsal:
    def __init__(self, k8s: Clients, namespace: str, resource: str, image: str, nodes: list[MigrationNode],
                 legacy: LegacyPath, dra: DraPath, *, pods_per_phase: int = 4, in_flight: int = 2,
                 pod_timeout: float = 90.0, phase_timeout: float = 300.0,
                 log: Callable[[str], None] = lambda _: None):
        if not nodes:
            raise ValueError("a migration needs at least one node")
        room = sum(n.devices for n in nodes) - max(n.devices for n in nodes)  # while the biggest node migrates
        if not 1 <= in_flight <= room:
            raise ValueError(f"in_flight {in_flight}: the stream must fit on the nodes not being migrated "
                             f"(1 to {room} for these nodes)")
        self.k8s, self.namespace, self.resource, self.image = k8s, namespace, resource, image
        self.nodes, self.legacy, self.dra = list(nodes), legacy, dra
        self.pods_per_phase, self.in_flight = pods_per_phase, in_flight
        self.pod_timeout, self.phase_timeout, self.log = pod_timeout, phase_timeout, log
        names = [f"migrate {n.name}" for n in nodes]
        self.phases = [Phase("device plugin everywhere", [])]
        self.phases += [Phase(name, [n.name for n in nodes[:i + 1]]) for i, name in enumerate(names)]
        self.phases.append(Phase("DRA everywhere", [n.name for n in nodes]))
        self.max_pods = pods_per_phase * len(self.phases) * 2  # what the budgets can grant, at most
        self.pods: list[PodRecord] = []
        self.problems: list[str] = []
        self._phase = 0
        self._lock = threading.Lock()
        self._live: list[str] = []
        self._stop = threading.Event()
        self._budget = 0  # pods the stream may still create in this part of the phase
        self._budget_changed = threading.Condition(self._lock)
        self._stream: threading.Thread | None = None

    # --- the job ------------------------------------------------------------------------------

    def run(self) -> Result:
        try:
            for node in self.nodes:
                self.log(f"{node.name}: device plugin advertises {node.devices} x {self.resource}")
                self.legacy.start(node)
            self._stream = threading.Thread(target=self._run_stream, name="migration-stream", daemon=True)
            self._stream.start()
            for index, phase in enumerate(self.phases):
                started = time.monotonic()
                with self._lock:
                    self._phase = index
                if phase.name.startswith("migrate "):
                    self._grant(self.pods_per_phase)  # the stream keeps going while the node moves
                    self._migrate(self.nodes[index - 1])
                with self._lock:
                    first = len(self.pods)  # the phase's quota of pods counts from the migrated state on
                self._grant(self.pods_per_phase)
                self._wait_for_phase_pods(index, first)
                phase.seconds = time.monotonic() - started
                counts = Counter(p.path for p in self.pods if p.phase == index)
                self.log(f"phase {phase.name!r}: {counts[workload.DEVICE_PLUGIN]} via device plugin, "
                         f"{counts[workload.DRA]} via DRA, {counts[None]} not scheduled")
        except Exception as err:  # the report says what went wrong; close() still cleans up
            self.problems.append(f"{type(err).__name__}: {err}")
        finally:
            self._stop.set()
            if self._stream is not None:
                self._stream.join(self.pod_timeout + 60)
        return Result(self.resource, self.nodes, self.phases, list(self.pods), self.problems)

    def _migrate(self, node: MigrationNode) -> None:
        self.log(f"{node.name}: draining the device plugin")
        self.legacy.drain(node)
        self._evict_device_plugin_pods(node)
        self.log(f"{node.name}: starting the DRA driver")
        self.dra.start(node)

    def _evict_device_plugin_pods(self, node: MigrationNode) -> None:
        """Delete the workload pods the device plugin served on `node` (their devices go to DRA next),
        until none is left: a pod may still have been bound there just before the drain was seen."""
        def none_left() -> bool:
            found = [p for p in self.k8s.core.list_namespaced_pod(self.namespace).items
                     if p.spec.node_name == node.name and workload.path_of(p) == workload.DEVICE_PLUGIN
                     and p.metadata.deletion_timestamp is None]
            for pod in found:
                self._mark_evicted(pod, self._phase)
                wait.ignore_not_found(self.k8s.core.delete_namespaced_pod, pod.metadata.name, self.namespace)
            return not found

        wait.until(f"the device-plugin pods on {node.name} to be evicted", none_left, self.pod_timeout)
        wait.until(f"the evicted pods on {node.name} to be gone",
                   lambda: not [p for p in self.k8s.core.list_namespaced_pod(self.namespace).items
                                if p.spec.node_name == node.name and workload.path_of(p) == workload.DEVICE_PLUGIN],
                   self.pod_timeout, diagnostics=lambda: wait.describe_namespace(self.k8s, self.namespace))

    def _mark_evicted(self, pod, phase: int) -> None:
        name = pod.metadata.name
        with self._lock:
            for record in self.pods:
                if record.name == name and record.evicted_in is None:
                    record.evicted_in = phase
                    # bound there through the device plugin, maybe not Running yet: say so already
                    record.node = record.node or pod.spec.node_name
                    record.path = record.path or workload.path_of(pod)
            if name in self._live:
                self._live.remove(name)

    def _wait_for_phase_pods(self, index: int, first: int) -> None:
        """Until `pods_per_phase` pods created from pod number `first` on (in this phase) ran."""
        def enough() -> bool:
            if self.problems:
                raise AssertionError(self.problems[-1])
            with self._lock:
                return sum(1 for p in self.pods[first:] if p.phase == index and p.path) >= self.pods_per_phase

        wait.until(f"{self.pods_per_phase} workload pods to run in phase {self.phases[index].name!r}", enough,
                   self.phase_timeout, diagnostics=lambda: wait.describe_namespace(self.k8s, self.namespace))

    # --- the stream ---------------------------------------------------------------------------

    def _grant(self, pods: int) -> None:
        """Let the stream create `pods` more (what was left of an earlier grant is dropped)."""
        with self._budget_changed:
            self._budget = pods
            self._budget_changed.notify_all()

    def _take_budget(self) -> bool:
        """Wait until the stream may create a pod (True) or is stopped (False)."""
        with self._budget_changed:
            while not self._stop.is_set():
                if self._budget > 0:
                    self._budget -= 1
                    return True
                self._budget_changed.wait(1.0)  # wakes on a grant; the timeout only re-checks stop
            return False

    def _run_stream(self) -> None:
        try:
            for number in range(self.max_pods):
                if not self._take_budget():
                    return
                self._retire_oldest()
                self._one_pod(f"workload-{number:03d}")
        except _Stopped:
            return
        except Exception as err:
            self.problems.append(f"workload stream: {type(err).__name__}: {err}")

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise _Stopped()

    def _retire_oldest(self) -> None:
        with self._lock:
            oldest = self._live.pop(0) if len(self._live) >= self.in_flight else None
        if oldest is None:
            return
        wait.ignore_not_found(self.k8s.core.delete_namespaced_pod, oldest, self.namespace)
        def gone() -> bool:
            self._check_stop()
            return oldest not in self._pod_names()

        wait.until(f"pod {oldest} to be gone", gone, self.pod_timeout,
                   diagnostics=lambda: wait.describe_namespace(self.k8s, self.namespace))

    def _pod_names(self) -> set[str]:
        return {p.metadata.name for p in self.k8s.core.list_namespaced_pod(self.namespace).items}

    def _one_pod(self, name: str) -> None:
        with self._lock:
            record = PodRecord(name, self._phase)
            self.pods.append(record)
        started = time.monotonic()
        self.k8s.core.create_namespaced_pod(self.namespace, workload.manifest(name, self.resource, self.image))

        def running():
            self._check_stop()
            try:
                pod = self.k8s.core.read_namespaced_pod(name, self.namespace)
            except errors.NotFound:
                if record.evicted_in is not None:
                    return _EVICTED  # a drain deleted it after it was bound there, before it ran
                raise
            return pod if pod.status and pod.status.phase == "Running" else None

        try:
            pod = wait.until(f"workload pod {name} to run", running, self.pod_timeout)
            if pod is _EVICTED:
                return
        except _Stopped:
            with self._lock:
                self.pods.remove(record)  # cut short by the end of the rehearsal: not a result
            raise
        except wait.WaitTimeout:
            pod = self.k8s.core.read_namespaced_pod(name, self.namespace)
            record.node = pod.spec.node_name
            record.problem = _why_not_running(pod)
            self.problems.append(f"{name} (phase {self.phases[record.phase].name!r}) not Running after "
                                 f"{self.pod_timeout:.0f}s: {record.problem}")
            wait.ignore_not_found(self.k8s.core.delete_namespaced_pod, name, self.namespace)
            return
        with self._lock:
            record.node, record.path, record.seconds = pod.spec.node_name, workload.path_of(pod), time.monotonic() - started
            if record.evicted_in is None:
                self._live.append(name)
        if record.path == workload.DRA:
            record.devices = self._claim_devices(pod)

    def _claim_devices(self, pod) -> list[tuple[str, str, str]]:
        claim_name = pod.status.extended_resource_claim_status.resource_claim_name
        claim = errors.ignore_missing(self.k8s.resource.read_namespaced_resource_claim, claim_name, self.namespace)
        if claim is None:  # the pod was already retired
            return []
        allocation = claim.status.allocation if claim.status else None
        return [(r.driver, r.pool, r.device) for r in (allocation.devices.results if allocation else [])]

    # --- clean-up -----------------------------------------------------------------------------

    def close(self, timeout: float = 120.0) -> None:
        """Delete every workload pod (gracefully: on a real node the kubelet must release devices) and wait."""
        self._stop.set()
        if self._stream is not None:
            self._stream.join(self.pod_timeout + 60)
        for name in self._pod_names():
            wait.ignore_not_found(self.k8s.core.delete_namespaced_pod, name, self.namespace)
        wait.until(f"the workload pods of {self.namespace} to be gone", lambda: not self._pod_names(), timeout,
                   diagnostics=lambda: wait.describe_namespace(self.k8s, self.namespace))


def _why_not_running(pod) -> str:
    for condition in (pod.status.conditions or []) if pod.status else []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"{condition.reason}: {condition.message}"
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.state and status.state.waiting:
            return f"container {status.name} waiting: {status.state.waiting.reason}: {status.state.waiting.message}"
    return f"phase {pod.status.phase if pod.status else '?'} on node {pod.spec.node_name}"
