"""Questions the conformance tests ask the cluster, with waits that explain themselves on timeout."""

from __future__ import annotations

import re
import secrets
import threading
import time
from typing import Any

from conformance import objects
from conformance.objects import ENV_DONE
from harness.k8s import errors, wait, watching
from harness.k8s.client import Clients


def pod_claim(k8s: Clients, namespace: str, pod: str, claim: str = "gpu", timeout: float = 60):
    """The ResourceClaim generated for `pod`'s claim entry `claim`, once the pod is bound to it."""
    def generated():
        status = k8s.core.read_namespaced_pod(pod, namespace).status
        for entry in status.resource_claim_statuses or []:
            if entry.name == claim and entry.resource_claim_name:
                return entry.resource_claim_name
        return None

    name = wait.until(f"the claim {claim!r} of pod {pod}", generated, timeout,
                      diagnostics=lambda: wait.describe_namespace(k8s, namespace))
    return k8s.resource.read_namespaced_resource_claim(name, namespace)


def allocated_devices(claim) -> list[tuple[str, str, str]]:
    """(request, pool, device) of every allocated device, in allocation order."""
    return [(r.request, r.pool, r.device) for r in claim.status.allocation.devices.results]


def unschedulable(k8s: Clients, namespace: str, pod: str, timeout: float = 30):
    """Wait until the scheduler reports `pod` unschedulable; return the PodScheduled condition."""
    def condition():
        found = k8s.core.read_namespaced_pod(pod, namespace)
        for c in found.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return c
        return None

    result = wait.until(f"pod {pod} to be reported unschedulable", condition, timeout,
                        diagnostics=lambda: wait.describe_namespace(k8s, namespace))
    assert k8s.core.read_namespaced_pod(pod, namespace).spec.node_name is None
    return result


def running(k8s: Clients, namespace: str, pod: str, timeout: float = 60):
    return wait.pod_phase(k8s, namespace, pod, "Running", timeout=timeout)


# --- extended resources ------------------------------------------------------------------------

EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"


def extended_resource_claim(k8s: Clients, namespace: str, pod: str, timeout: float = 60):
    """(pod, claim): the pod once the scheduler recorded `status.extendedResourceClaimStatus`, and
    the ResourceClaim it names."""
    def recorded():
        found = k8s.core.read_namespaced_pod(pod, namespace)
        status = found.status.extended_resource_claim_status
        return found if status and status.resource_claim_name else None

    found = wait.until(f"the extended-resource claim of pod {pod}", recorded, timeout,
                       diagnostics=lambda: wait.describe_namespace(k8s, namespace))
    claim = k8s.resource.read_namespaced_resource_claim(found.status.extended_resource_claim_status.resource_claim_name,
                                                        namespace)
    return found, claim


def request_mappings(pod) -> list[tuple[str, str, str]]:
    """(container, resource, request) of `pod.status.extendedResourceClaimStatus.requestMappings`."""
    return [(m.container_name, m.resource_name, m.request_name)
            for m in pod.status.extended_resource_claim_status.request_mappings]


def claim_deleted(k8s: Clients, namespace: str, claim: str, timeout: float = 60) -> None:
    wait.until(f"claim {namespace}/{claim} to be deleted",
               lambda: claim not in {c.metadata.name for c in k8s.resource.list_namespaced_resource_claim(namespace).items},
               timeout, diagnostics=lambda: wait.describe_namespace(k8s, namespace))


def scheduling_state(pod) -> str:
    """"Running", "Unschedulable" (the scheduler said so) or the pod's phase."""
    if pod.status.phase == "Running":
        return "Running"
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return "Unschedulable"
    return pod.status.phase or "Unknown"


def pods_settled(k8s: Clients, namespace: str, running: int, unschedulable: int, timeout: float = 60) -> dict:
    """Wait until exactly `running` pods of the namespace run and `unschedulable` are refused by the
    scheduler; return {pod name: pod}."""
    def settled():
        pods = {p.metadata.name: p for p in k8s.core.list_namespaced_pod(namespace).items}
        states = [scheduling_state(p) for p in pods.values()]
        if (states.count("Running"), states.count("Unschedulable")) == (running, unschedulable) \
                and len(states) == running + unschedulable:
            return pods
        return None

    return wait.until(f"{running} running and {unschedulable} unschedulable pods in {namespace}", settled, timeout,
                      diagnostics=lambda: wait.describe_namespace(k8s, namespace))


# --- device taints -----------------------------------------------------------------------------

def device_taints(k8s: Clients, driver: str, pool: str, device: str) -> list:
    """The taints a driver publishes on one device (in the newest generation of its pool)."""
    slices = [s for s in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items
              if s.spec.pool.name == pool]
    if not slices:
        return []
    newest = max(s.spec.pool.generation for s in slices)
    for item in slices:
        if item.spec.pool.generation != newest:
            continue
        for found in item.spec.devices or []:
            if found.name == device:
                return list(found.taints or [])
    return []


def published_taints(k8s: Clients, driver: str, pool: str, device: str, expected: list[tuple[str, str, str]],
                     timeout: float = 30) -> list:
    """Wait until `device` carries exactly the taints `expected` as (key, value, effect); return them."""
    def matches():
        taints = device_taints(k8s, driver, pool, device)
        return (taints,) if [(t.key, t.value, t.effect) for t in taints] == expected else None

    (taints,) = wait.until(f"device {driver}/{pool}/{device} to carry the taints {expected}", matches, timeout,
                           diagnostics=lambda: f"taints now: {device_taints(k8s, driver, pool, device)}")
    return taints


def rule_condition(k8s: Clients, rule: str, reason: str, timeout: float = 30):
    """Wait until the DeviceTaintRule's EvictionInProgress condition has `reason`; return the condition."""
    def current():
        status = k8s.resource.read_device_taint_rule(rule).status
        for c in (status.conditions if status else None) or []:
            if c.type == "EvictionInProgress" and c.reason == reason:
                return c
        return None

    def observed() -> str:
        status = k8s.resource.read_device_taint_rule(rule).status
        return f"conditions now: {(status.conditions if status else None) or []}"

    return wait.until(f"DeviceTaintRule {rule} condition EvictionInProgress with reason {reason}", current, timeout,
                      diagnostics=observed)


def taint_eviction_caught_up(k8s: Clients, namespace: str, timeout: float = 30) -> None:
    """Wait until kube-controller-manager's device taint eviction controller has handled every
    DeviceTaintRule change made before this call (call it after deleting a NoExecute rule and before a
    pod may be allocated the device it tainted).

    Why: the scheduler and the eviction controller act on caches of their own, and the controller
    follows rules and claims through separate informers with no order between them
    (pkg/controller/devicetainteviction/device_taint_eviction.go, v1.37.2: one event handler per
    informer; the decision to evict is read from the cache, not checked against the API). A pod
    allocated a device right after its NoExecute rule was deleted is evicted by a controller that sees
    the allocation before the deletion (seen in CI: "DeviceTaintManagerEviction: Marking for deletion"
    on the pod that recovery let in; the node-taint twin is kubernetes/kubernetes#119862).

    How: the controller handles one informer's events in order and writes the status of each new rule
    at once, so when a rule created now (effect None, selecting no device: harmless to everyone) has
    its EvictionInProgress condition, every earlier rule deletion has been seen. The rule is deleted
    again before returning."""
    name = f"{namespace}-seen-{secrets.token_hex(3)}"[:63]
    k8s.resource.create_device_taint_rule({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": name},
        "spec": {"deviceSelector": {"driver": f"{name}.no-such-driver.invalid"},
                 "taint": {"key": "dra-harness.x-k8s.io/barrier", "value": "true", "effect": "None"}}})
    try:
        rule_condition(k8s, name, "NoEffect", timeout)
    finally:
        wait.ignore_not_found(k8s.resource.delete_device_taint_rule, name)


def disruption_target(pod):
    """The pod's DisruptionTarget=True condition, if any."""
    for c in (pod.status.conditions or []) if pod.status else []:
        if c.type == "DisruptionTarget" and c.status == "True":
            return c
    return None


def is_evicted(event_type: str, pod) -> bool:
    """An eviction became visible: marked as disruption target, terminating or gone."""
    return event_type == "DELETED" or pod.metadata.deletion_timestamp is not None or disruption_target(pod) is not None


class PodHistory:
    """Every change of the pods of a namespace, stamped with time.monotonic() when it arrived.

    A watch in a background thread, started from a list's resourceVersion, so nothing that happens
    after start() is missed (a pod marked and deleted within milliseconds included). Use as a
    context manager around the steps whose effects are to be timed.
    """

    def __init__(self, k8s: Clients, namespace: str):
        self.k8s, self.namespace = k8s, namespace
        self.events: list[tuple[float, str, Any]] = []  # (monotonic time, event type, pod)
        self._changed = threading.Condition()
        self.error: Exception | None = None
        self._follow = watching.Follow(k8s.core.list_namespaced_pod, namespace, on_event=self._record,
                                       on_error=self._broke, name=f"pod-history-{namespace}")

    def __enter__(self) -> "PodHistory":
        self._follow.start(self.k8s.core.list_namespaced_pod(self.namespace).metadata.resource_version)
        return self

    def __exit__(self, *exc) -> None:
        self._follow.stop()

    def _record(self, kind: str, pod: Any) -> None:
        arrived = time.monotonic()
        with self._changed:
            self.events.append((arrived, kind, pod))
            self._changed.notify_all()

    def _broke(self, err: Exception) -> bool:
        # a history with a gap would be a lie (no relist after a 410): report it to waiters and end
        with self._changed:
            self.error = err
            self._changed.notify_all()
        return False

    def first(self, pod: str, predicate) -> tuple[float, Any] | None:
        """(arrival time, pod) of the first recorded change of `pod` with predicate(type, pod) true."""
        with self._changed:
            for arrived, kind, obj in self.events:
                if obj.metadata.name == pod and predicate(kind, obj):
                    return arrived, obj
        return None

    def wait_for(self, what: str, pod: str, predicate, timeout: float) -> tuple[float, Any]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = self.first(pod, predicate)  # re-entrant: Condition wraps an RLock
                if found:
                    return found
                if self.error is not None:
                    raise AssertionError(f"watching pods of {self.namespace} failed: {self.error}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
        raise wait.WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}\n"
                               + wait.describe_namespace(self.k8s, self.namespace))

    def eviction(self, pod: str, timeout: float = 30) -> tuple[float, Any]:
        """(arrival time, pod) of the first sign that `pod` is being evicted."""
        return self.wait_for(f"pod {pod} to be evicted", pod, is_evicted, timeout)

    def evicted_by_taint_manager(self, pod: str, timeout: float = 30):
        """The DisruptionTarget condition the device taint eviction controller put on `pod`."""
        _, obj = self.wait_for(f"pod {pod} to be marked as DisruptionTarget", pod,
                               lambda kind, p: disruption_target(p) is not None, timeout)
        return disruption_target(obj)

    def gone(self, pod: str, timeout: float = 30) -> float:
        arrived, _ = self.wait_for(f"pod {pod} to be deleted", pod, lambda kind, p: kind == "DELETED", timeout)
        return arrived


def untouched(k8s: Clients, history: PodHistory, namespace: str, pod: str) -> None:
    """`pod` was never marked for eviction while `history` watched, and still runs."""
    found = history.first(pod, is_evicted)
    assert found is None, f"pod {pod} was evicted: {found[1].status.conditions if found else ''}"
    current = k8s.core.read_namespaced_pod(pod, namespace)
    assert current.metadata.deletion_timestamp is None and current.status.phase == "Running", \
        f"pod {pod}: phase {current.status.phase}, deletionTimestamp {current.metadata.deletion_timestamp}"


# --- pod groups, published device attributes, API rejections -----------------------------------

def scheduler_caught_up(k8s: Clients, namespace: str, name: str = "witness", timeout: float = 60):
    """Create a pod without claims and wait until it runs.

    The scheduler handles pod events in the order they arrive and takes pods of equal priority
    first-come first-served, so once this pod is bound, every pod created before it has had its turn:
    one of those still unbound afterwards was held back, not merely not looked at yet.
    """
    k8s.core.create_namespaced_pod(namespace, objects.pod(name, [objects.container("main")]))
    return running(k8s, namespace, name, timeout)


def event_saying(k8s: Clients, namespace: str, pod: str, reason: str, text: str = "", timeout: float = 30) -> str:
    """The message of an event of `pod` with `reason` whose message has `text`, waited for: components record
    events apart from the status they write, and may write them later (seen under load)."""
    def messages() -> list[str]:
        return [e.message or "" for e in k8s.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod}").items if e.reason == reason]

    return wait.until(f"a {reason} event of pod {pod}" + (f" saying {text!r}" if text else ""),
                      lambda: next((m for m in messages() if text in m), None), timeout,
                      diagnostics=lambda: f"its {reason} events: {messages()}\n" + wait.describe_namespace(k8s, namespace))


def pod_gone(k8s: Clients, namespace: str, pod: str, timeout: float = 60, why: str = "") -> None:
    """Wait until `pod` no longer exists (its deletion done, finalizers and all); `why` joins the timeout's text."""
    wait.until(f"pod {namespace}/{pod} to be gone{why}",
               lambda: pod not in {p.metadata.name for p in k8s.core.list_namespaced_pod(namespace).items}, timeout,
               diagnostics=lambda: wait.describe_namespace(k8s, namespace))


def unbound(k8s: Clients, namespace: str, *pods: str) -> None:
    for name in pods:
        found = k8s.core.read_namespaced_pod(name, namespace)
        assert found.spec.node_name is None, f"pod {name} was bound to {found.spec.node_name}"


def pod_group_condition(k8s: Clients, namespace: str, group: str, status: str, timeout: float = 60):
    """Wait until the PodGroup's PodGroupInitiallyScheduled condition has `status`; return the condition."""
    def current():
        found = k8s.scheduling.read_namespaced_pod_group(group, namespace)
        for c in (found.status.conditions if found.status else None) or []:
            if c.type == "PodGroupInitiallyScheduled" and c.status == status:
                return c
        return None

    return wait.until(f"PodGroup {group} condition PodGroupInitiallyScheduled={status}", current, timeout,
                      diagnostics=lambda: wait.describe_namespace(k8s, namespace))


def pod_claim_names(pod) -> dict[str, str]:
    """{pod claim entry: generated ResourceClaim} from `pod.status.resourceClaimStatuses`."""
    return {s.name: s.resource_claim_name for s in (pod.status.resource_claim_statuses or [])}


def claims_controlled_by(k8s: Clients, namespace: str, kind: str, uid: str) -> list:
    """The ResourceClaims of the namespace whose controller is the object `kind` with `uid`."""
    return [c for c in k8s.resource.list_namespaced_resource_claim(namespace).items
            if any(o.controller and o.kind == kind and o.uid == uid for o in (c.metadata.owner_references or []))]


def consumers(claim) -> list[tuple[str | None, str, str, str]]:
    """(apiGroup, resource, name, uid) of every entry of `status.reservedFor`."""
    return [(r.api_group or None, r.resource, r.name, r.uid) for r in (claim.status.reserved_for or [])]


def allocated_claim(k8s: Clients, namespace: str, claim: str, timeout: float = 60):
    """Wait until the ResourceClaim is allocated; return it."""
    def check():
        found = k8s.resource.read_namespaced_resource_claim(claim, namespace)
        return found if found.status and found.status.allocation else None

    return wait.until(f"claim {namespace}/{claim} to be allocated", check, timeout,
                      diagnostics=lambda: wait.describe_namespace(k8s, namespace))


def published_device(k8s: Clients, driver: str, pool: str, device: str):
    """The device as its driver publishes it in a ResourceSlice (newest generation of the pool)."""
    slices = [s for s in k8s.resource.list_resource_slice(field_selector=f"spec.driver={driver}").items
              if s.spec.pool.name == pool]
    newest = max((s.spec.pool.generation for s in slices), default=None)
    for item in slices:
        if item.spec.pool.generation == newest:
            for found in item.spec.devices or []:
                if found.name == device:
                    return found
    raise AssertionError(f"device {driver}/{pool}/{device} is not published")


def attribute_value(device, attribute: str):
    """The value of one attribute of a published device, whatever its type (None if not set)."""
    found = (device.attributes or {}).get(attribute)
    if found is None:
        return None
    for kind in ("int", "string", "bool", "version"):
        value = getattr(found, kind)
        if value is not None:
            return value
    return None


def allocated_attribute(k8s: Clients, claim, attribute: str) -> dict[str, object]:
    """{driver/pool/device: value of `attribute`} for every device allocated to `claim`, read from the
    ResourceSlices the drivers published (not from the claim)."""
    return {f"{r.driver}/{r.pool}/{r.device}": attribute_value(published_device(k8s, r.driver, r.pool, r.device),
                                                               attribute)
            for r in claim.status.allocation.devices.results}


def rejected(call, *args, status: int = 422, **kwargs) -> str:
    """Call the API expecting a rejection with HTTP `status`; return the server's message."""
    try:
        call(*args, **kwargs)
    except errors.ApiError as err:
        assert err.status == status, f"expected HTTP {status}, got {err.status}: {err.body}"
        return errors.message(err)
    raise AssertionError(f"{getattr(call, '__name__', call)} was accepted, expected HTTP {status}")


def every_node_says(message: str, reason: str, nodes: list[str]) -> bool:
    """True when the scheduler's "0/N nodes are available: ..." message gives `reason` for at least as
    many nodes as `nodes` lists. Other nodes of a shared cluster (say, one another test is creating)
    may add reasons of their own; the nodes under test must all answer with `reason`."""
    match = re.search(rf"(\d+) {re.escape(reason)}(?:[.,]|$)", message)
    return match is not None and message.startswith("0/") and int(match[1]) >= len(nodes)


def kubelet_dra_metrics(k8s: Clients, node: str, driver: str) -> dict[str, float]:
    """The kubelet's own DRA metrics on `node`: `in_use`, the claims of `driver` it holds prepared
    (dra_resource_claims_in_use); the kubelet's gRPC calls to `driver` by method and status code
    (`NodePrepareResources/OK`, `NodeUnprepareResources/Unavailable`, ...: dra_grpc_operations_duration_seconds,
    labelled by driver); and the counts of successful and failed Prepare/Unprepare operations of all
    drivers together (`PrepareResources`, `PrepareResources-error`, ...: not labelled by driver, so other
    tests on the node move them too)."""
    values = {"in_use": 0.0}
    for line in k8s.get_raw(f"/api/v1/nodes/{node}/proxy/metrics").splitlines():
        if line.startswith("dra_resource_claims_in_use{") and f'driver_name="{driver}"' in line:
            values["in_use"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("dra_grpc_operations_duration_seconds_count{") and f'driver_name="{driver}"' in line:
            method = _label(line, "method_name").rsplit("/", 1)[-1]
            key = f"{method}/{_label(line, 'grpc_status_code')}"
            values[key] = values.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("dra_operations_duration_seconds_count{"):
            key = _label(line, "operation_name") + ("-error" if 'is_error="true"' in line else "")
            values[key] = values.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def _label(line: str, name: str) -> str:
    return line.split(f'{name}="', 1)[1].split('"', 1)[0] if f'{name}="' in line else ""


def grpc_failures(metrics: dict[str, float], method: str) -> dict[str, float]:
    """The kubelet's failed gRPC calls of `method` to one driver, by status code (from kubelet_dra_metrics)."""
    return {key.split("/", 1)[1]: count for key, count in metrics.items()
            if key.startswith(f"{method}/") and key != f"{method}/OK"}


# a container waiting for one of these will not start without a change: fail at once, with it
HOPELESS_WAITING = ("CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                    "CreateContainerConfigError", "CreateContainerError", "RunContainerError")


def _container_problem(pod) -> str | None:
    """Why the pod's containers are not running steadily (reason, exit code, restartCount), or None."""
    for status in (pod.status.container_statuses or []) if pod.status else []:
        state, last = status.state, status.last_state
        if status.restart_count:
            ended = last.terminated if last else None
            detail = (f"last exit: {ended.reason} (exit code {ended.exit_code})" if ended
                      else f"state {state.waiting.reason if state and state.waiting else 'restarting'}")
            return f"container {status.name} restarted {status.restart_count} time(s); {detail}"
        if state and state.terminated:
            return (f"container {status.name} exited: {state.terminated.reason} (exit code "
                    f"{state.terminated.exit_code}); restartCount {status.restart_count}")
        if state and state.waiting and state.waiting.reason in HOPELESS_WAITING:
            return (f"container {status.name} is waiting: {state.waiting.reason}: {state.waiting.message or ''} "
                    f"(restartCount {status.restart_count})")
    return None


def containers_running(k8s: Clients, namespace: str, pod: str, timeout: float = 60, steady_for: float = 5):
    """Wait until every container of `pod` has run, without a restart, for `steady_for` seconds of
    our observation (a container that exits at once looks Running until the kubelet's next status
    report); fail at once, with the container's reason, when one exited, restarted or waits for
    something that will not come (image missing, crash loop)."""
    first_seen: list[float] = []

    def check():
        found = k8s.core.read_namespaced_pod(pod, namespace)
        problem = _container_problem(found)
        if problem:
            raise AssertionError(f"pod {namespace}/{pod}: {problem}")
        statuses = found.status.container_statuses or []
        if not (statuses and all(s.state and s.state.running for s in statuses)):
            return None
        if not first_seen:
            first_seen.append(time.monotonic())
        return found if time.monotonic() - first_seen[0] >= steady_for else None

    return wait.until(f"the containers of pod {namespace}/{pod} to run steadily for {steady_for:.0f}s", check,
                      timeout, diagnostics=lambda: wait.describe_namespace(k8s, namespace))


def still_running(k8s: Clients, namespace: str, pod: str) -> None:
    """The containers of `pod` run and never restarted (a container that exits at once and is
    restarted looks Running in between)."""
    found = k8s.core.read_namespaced_pod(pod, namespace)
    problem = _container_problem(found)
    assert problem is None, f"pod {namespace}/{pod}: {problem}"


ENV_LINE = re.compile(r"^(DRA_[A-Z0-9_]+)=(.*)$")


def printed_env(k8s: Clients, namespace: str, pod: str, timeout: float = 60) -> dict[str, str]:
    """The DRA_* variables the container printed (waits for the line that ends the list)."""
    def logs():
        try:
            text = k8s.core.read_namespaced_pod_log(pod, namespace, container="main") or ""
        except errors.BadRequest:  # the container has not started yet
            return None
        return text if ENV_DONE in text else None

    text = wait.until(f"pod {pod} to print its environment", logs, timeout,
                      diagnostics=lambda: wait.describe_namespace(k8s, namespace))
    return {m[1]: m[2] for m in map(ENV_LINE.match, text.splitlines()) if m}
