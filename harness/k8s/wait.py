"""Waiting on cluster state with deadlines, and saying why when the deadline passes.

No fixed sleeps: every wait polls a condition (cheaply, every 0.2 s) until a deadline; on timeout
the error carries the objects and events that explain what the cluster was doing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.core.errors import HarnessError
from harness.k8s.client import Clients
from harness.k8s.errors import ApiError, NotFound, ignore_missing


class WaitTimeout(HarnessError, AssertionError):
    """A condition was not met in time (an AssertionError, so pytest reports it as a failure)."""


# Checks that end every wait at once when waiting is pointless (a control-plane component died: see
# harness.backends.local.liveness). Each raises to abort; the pytest plugin registers one per cluster.
_abort_checks: list[Callable[[], None]] = []


def abort_waits_when(check: Callable[[], None]) -> Callable[[], None]:
    """Call `check` during every `until`; it raises to end the wait. Returns the undo."""
    _abort_checks.append(check)
    return lambda: _abort_checks.remove(check) if check in _abort_checks else None


FIRST_STEP = 0.02


def until(what: str, check: Callable[[], Any], timeout: float, *, interval: float = 0.2,
          diagnostics: Callable[[], str] | None = None) -> Any:
    """Call `check` until it returns something truthy; return that. Raise WaitTimeout at the deadline.
    The first looks come quickly (20 ms, then twice as long each time up to `interval`): most waits of the suite
    end within a few hundred milliseconds, and a fixed 0.2 s step added 0.1 s to each on average."""
    deadline = time.monotonic() + timeout
    last_error: ApiError | None = None
    step = min(interval, FIRST_STEP)
    while True:
        try:
            result = check()
            if result:
                return result
        except ApiError as err:  # transient API errors are retried until the deadline
            last_error = err
        for abort in list(_abort_checks):
            abort()
        if time.monotonic() >= deadline:
            detail = f"\nlast API error: {last_error.status} {last_error.reason}" if last_error else ""
            if diagnostics:
                try:
                    detail += "\n" + diagnostics()
                except Exception as err:  # diagnostics must never hide the timeout itself
                    detail += f"\n(diagnostics failed: {err})"
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(step)
        step = min(interval, step * 2)


# A delete whose object is already gone has done its job (one helper for harness and driver).
ignore_not_found = ignore_missing


def service_account_ready(k8s: Clients, namespace: str, timeout: float = 30) -> None:
    """Pods are refused until the controller-manager created the namespace's `default` ServiceAccount."""
    def exists() -> bool:
        try:
            k8s.core.read_namespaced_service_account("default", namespace)
            return True
        except NotFound:
            return False

    until(f"ServiceAccount {namespace}/default", exists, timeout)


def pod_phase(k8s: Clients, namespace: str, name: str, phase: str, timeout: float = 60):
    def check():
        pod = k8s.core.read_namespaced_pod(name, namespace)
        return pod if pod.status and pod.status.phase == phase else None

    return until(f"pod {namespace}/{name} to be {phase}", check, timeout,
                 diagnostics=lambda: describe_namespace(k8s, namespace))


def describe_namespace(k8s: Clients, namespace: str) -> str:
    """Pods, ResourceClaims and events of a namespace, as text for an error message."""
    lines = [f"--- namespace {namespace} ---"]
    for pod in k8s.core.list_namespaced_pod(namespace).items:
        conditions = "; ".join(f"{c.type}={c.status} {c.reason or ''} {c.message or ''}".strip()
                               for c in (pod.status.conditions or []))
        lines.append(f"pod {pod.metadata.name}: phase={pod.status.phase} node={pod.spec.node_name} {conditions}")
    for claim in k8s.resource.list_namespaced_resource_claim(namespace).items:
        allocation = claim.status.allocation if claim.status else None
        devices = [f"{r.driver}/{r.pool}/{r.device}" for r in (allocation.devices.results if allocation else [])]
        lines.append(f"claim {claim.metadata.name}: allocated={bool(allocation)} devices={devices}")
    def when(event) -> str:
        stamp = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
        return stamp.isoformat() if stamp else ""

    events = sorted(k8s.core.list_namespaced_event(namespace).items, key=when)
    for event in events[-20:]:
        lines.append(f"event {event.involved_object.kind}/{event.involved_object.name}: {event.reason}: {event.message}")
    return "\n".join(lines)


class CreatedObjects:
    """Cluster-scoped objects a test made, deleted in reverse order at teardown."""

    def __init__(self, k8s: Clients):
        self.k8s = k8s
        self._deleters: list[tuple[str, Callable[[], None]]] = []

    def device_class(self, body: dict):
        obj = self.k8s.resource.create_device_class(body)
        self._deleters.append((f"DeviceClass {obj.metadata.name}",
                               lambda: self.k8s.resource.delete_device_class(obj.metadata.name)))
        return obj

    def resource_slice(self, body: dict):
        obj = self.k8s.resource.create_resource_slice(body)
        self._deleters.append((f"ResourceSlice {obj.metadata.name}",
                               lambda: self.k8s.resource.delete_resource_slice(obj.metadata.name)))
        return obj

    def device_taint_rule(self, body: dict):
        obj = self.k8s.resource.create_device_taint_rule(body)
        self._deleters.append((f"DeviceTaintRule {obj.metadata.name}",
                               lambda: self.k8s.resource.delete_device_taint_rule(obj.metadata.name)))
        return obj

    def holds(self, kind: str) -> bool:
        """Whether an object of `kind` (e.g. "DeviceTaintRule") is among those still to delete."""
        return any(what.startswith(kind + " ") for what, _ in self._deleters)

    def delete_all(self) -> None:
        errors = []
        for what, delete in reversed(self._deleters):
            try:
                delete()
            except NotFound:
                pass
            except ApiError as err:
                errors.append(f"{what}: {err.status} {err.reason}")
        self._deleters.clear()
        if errors:
            raise HarnessError("clean-up failed: " + "; ".join(errors))
