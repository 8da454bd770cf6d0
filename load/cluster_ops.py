"""Kubernetes operations of the load scenarios (set-up, unblocking events, clean-up) and the watch
that timestamps pod bindings. Runs inside the locust process (gevent-patched), so it uses plain
blocking calls; concurrency comes from gevent pools."""

from __future__ import annotations

import time

import gevent
import gevent.event
import gevent.pool

from fake_devices.config import PROFILE_LABEL
from harness.k8s import api, errors, watching
from harness.k8s.nodes import KWOK_NOT_STARTED_LABEL
from load.scenarios import LOAD_LABEL

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
# What the node lifecycle controller puts on a node without a kubelet (or whose KWOK stopped): the
# pods of a run on a given cluster tolerate them on the run's own nodes (see `tolerations`).
NODE_CONDITION_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


# Only bound pods: a pod enters the watch (ADDED) when it is bound, and the apiserver sends none of the
# events before (created, claim status): fewer events for the generator to decode on a burst.
BOUND = "spec.nodeName!="


class BindingWatch:
    """Records, per pod, the monotonic time its binding (spec.nodeName) was first seen."""

    def __init__(self, core: api.CoreV1Api, namespace: str):
        self.core, self.namespace = core, namespace
        self.bound_at: dict[str, float] = {}
        self.claimed: set[str] = set()
        self._changed = gevent.event.Event()
        # What the watch itself saw, so a timed-out event can say whether the watch was the problem.
        self.events_seen = 0
        self.last_event_at: float | None = None
        self.restarts = 0
        self.error: str | None = None  # why the watch stopped, if it stopped before stop()
        self._follow: watching.Follow | None = None

    def start(self) -> "BindingWatch":
        listing = self.core.list_namespaced_pod(self.namespace, field_selector=BOUND)
        now = time.monotonic()
        for pod in listing.items:
            if pod.spec.node_name:
                self.bound_at[pod.metadata.name] = now
                self.claimed.add(pod.metadata.name)  # bound before the run: never an event's result
        # Its thread is a (gevent-patched) thread rather than a greenlet: locust mistakes greenlets spawned
        # during test_start for users when it stops them.
        self._follow = watching.Follow(self.core.list_namespaced_pod, self.namespace, on_event=self._seen,
                                       on_relist=self._relisted, on_error=self._failed, timeout_seconds=300,
                                       bookmarks=False, name="binding-watch",
                                       field_selector=BOUND).start(listing.metadata.resource_version)
        return self

    def _seen(self, kind: str, pod) -> None:
        self.events_seen += 1
        self.last_event_at = time.monotonic()
        self._bound(pod)

    def _bound(self, pod) -> None:
        if pod.spec.node_name and pod.metadata.name not in self.bound_at:
            self.bound_at[pod.metadata.name] = time.monotonic()
            self._changed.set()

    def _relisted(self, pods: list) -> None:
        self.restarts += 1  # after a 410: bound while no watch ran, the list is the only one to say so
        for pod in pods:
            self._bound(pod)

    def _failed(self, err: Exception) -> bool:
        self.error = f"the pod watch failed: {watching.describe(err)}"
        return False

    def stop(self) -> None:
        if self._follow is not None:
            self._follow.stop(join_seconds=0)

    def next_binding_after(self, since: float, timeout: float, among: set[str] | None = None,
                           issued: float | None = None) -> float | None:
        """Seconds from `since` (the unblocking call returned) to the first binding not yet attributed
        to another event. A binding seen while the call was still returning (after `issued`) counts,
        as 0: on a loaded machine the scheduler can bind before the client has read the response, and
        such an event was counted as missed."""
        deadline = time.monotonic() + timeout
        earliest = since if issued is None else min(issued, since)
        while True:
            self._changed.clear()
            candidates = [(t, name) for name, t in self.bound_at.items()
                          if t >= earliest and name not in self.claimed and (among is None or name in among)]
            if candidates:
                when, name = min(candidates)
                self.claimed.add(name)
                return max(0.0, when - since)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._changed.wait(remaining):  # woken by the next binding
                return None

    def wait_all_bound(self, names: set[str], stall_timeout: float) -> set[str]:
        """Wait until every pod of `names` is bound; give up when no pod at all got bound for
        `stall_timeout` seconds. Returns the pods not bound (empty: all were)."""
        while True:
            self._changed.clear()
            missing = {name for name in names if name not in self.bound_at}
            if not missing or not self._changed.wait(stall_timeout):  # woken by the next binding
                return missing


def explain_unbound(core, namespace: str, watch: BindingWatch, since: float, queues: dict[str, float]) -> str:
    """Why no waiting pod was bound after an event at `since`: what the watch, the API server and the
    scheduler's queues show. Tells a missed watch from a pod the scheduler did not retry (missed
    requeue) or is holding back (backoff)."""
    seen = [f"seen {time.monotonic() - since:.1f}s after the event"]
    if watch.error:
        seen.append(watch.error)
    quiet = f"{time.monotonic() - watch.last_event_at:.0f}s ago" if watch.last_event_at else "never"
    seen.append(f"watch: {watch.events_seen} pod events, last {quiet}, {watch.restarts} restarts")
    try:
        pods = core.list_namespaced_pod(namespace, label_selector=LOAD_LABEL).items
    except (errors.ApiError, OSError) as err:
        return "; ".join(seen + [f"listing pods failed: {err}"])
    bound_unseen = sorted(p.metadata.name for p in pods if p.spec.node_name and p.metadata.name not in watch.bound_at)
    if bound_unseen:
        seen.insert(0, f"missed watch: {len(bound_unseen)} pods are bound on the API server but the watch never "
                       f"saw it ({', '.join(bound_unseen[:5])})")
    early = sorted(name for name, t in watch.bound_at.items() if t < since and name not in watch.claimed)
    if early:
        seen.append(f"bound before this event's call returned and attributed to no event: {', '.join(early[:5])}")
    late = sorted(name for name, t in watch.bound_at.items() if t >= since and name in watch.claimed)
    if late:
        seen.append(f"bindings after the event went to earlier events: {', '.join(late[:5])}")
    waiting = [p for p in pods if not p.spec.node_name and not p.metadata.deletion_timestamp]
    if waiting:
        reasons: dict[str, str] = {}  # scheduler message -> first pod waiting with it
        for p in waiting:
            condition = next((c for c in (p.status.conditions or []) if c.type == "PodScheduled"), None)
            reasons.setdefault(condition.message if condition and condition.message else "not tried yet", p.metadata.name)
        last = ", ".join(f"{pod_name}: {message[:160]!r}" for message, pod_name in list(reasons.items())[:2])
        seen.append(f"{len(waiting)} waiting pods still Pending (scheduler says {last})")
    if queues:
        seen.append("scheduler queues: " + ", ".join(f"{q} {int(v)}" for q, v in sorted(queues.items())))
        if queues.get("backoff"):
            seen.append("pods in backoff: the scheduler retried and failed, and waits before the next try")
        elif waiting and not bound_unseen and not queues.get("active"):
            seen.append("no pod queued: the event did not requeue a waiting pod (a missed requeue?)")
    return "; ".join(seen)


def tolerations(node_taint: str) -> list[dict]:
    """A run on a given cluster taints its own nodes with `node_taint` (so nothing else lands there)
    and its pods tolerate that taint and the node lifecycle taints (its nodes may have no kubelet).
    Without a node taint (a cluster the run started) its pods tolerate nothing special."""
    if not node_taint:
        return []
    return [{"key": key, "operator": "Exists"} for key in (node_taint, *NODE_CONDITION_TAINTS)]


def pod(name: str, template: str | None = None, extended: str | None = None, *, label: str = "true",
        node_taint: str = "", started: bool = True) -> dict:
    """A pod of the run; `started=False`: once the scheduler binds it, KWOK does not start it (it stays bound
    and Pending), as scheduler_perf's pods, which no kubelet runs (the throughput scenarios)."""
    container: dict = {"name": "main", "image": PAUSE_IMAGE}
    spec: dict = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if node_taint:
        spec["tolerations"] = tolerations(node_taint)
    if template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    if extended:
        container["resources"] = {"limits": {extended: "1"}, "requests": {extended: "1"}}
    labels = {LOAD_LABEL: label, **({} if started else {KWOK_NOT_STARTED_LABEL: "true"})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def pod_group_with_claim(name: str, template: str, *, label: str = "true") -> dict:
    """A PodGroup (scheduling.k8s.io/v1beta1) whose members share one claim made from `template`."""
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "labels": {LOAD_LABEL: label}},
            "spec": {"schedulingPolicy": {"basic": {}},
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]}}


def group_member(name: str, group: str, template: str, **labels_and_taint) -> dict:
    """A pod of `group` whose claim entry equals the group's, so it uses the group's shared claim."""
    body = pod(name, template=template, **labels_and_taint)
    body["spec"]["schedulingGroup"] = {"podGroupName": group}
    return body


def create_pods(core, namespace: str, pods: list[dict], concurrency: int = 32) -> None:
    pool = gevent.pool.Pool(concurrency)
    for body in pods:
        pool.spawn(_create_with_retry, core, namespace, body)
    pool.join(raise_error=True)


def _create_with_retry(core, namespace: str, body: dict) -> None:
    for attempt in range(8):
        try:
            core.create_namespaced_pod(namespace, body)
            return
        except errors.Conflict:
            return  # already there (a retried create)
        except errors.ApiError as err:
            if errors.busy(err) and attempt < 7:
                gevent.sleep(0.1 * 2 ** attempt)
                continue
            raise


def wait_until(what: str, check, timeout: float, interval: float = 0.5, progress=None):
    """Poll `check` until it returns something true, at most `timeout` seconds; on a timeout the error says
    how far it got (`progress()`, e.g. "752 of 10000 bound")."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            reached = f" ({progress()})" if progress is not None else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{reached}")
        gevent.sleep(interval)


def wait_all_bound(core, namespace: str, names: set[str], what: str, timeout: float) -> None:
    """Wait until every pod of `names` is bound to a node; the timeout says how many were."""
    bound = [0]

    def done() -> bool:
        bound[0] = count_bound(core, namespace, names)
        return bound[0] == len(names)

    wait_until(what, done, timeout, progress=lambda: f"{bound[0]} of {len(names)} bound")


def count_bound(core, namespace: str, names: set[str]) -> int:
    return sum(1 for p in core.list_namespaced_pod(namespace, label_selector=LOAD_LABEL).items
               if p.metadata.name in names and p.spec.node_name)


def all_unschedulable(core, namespace: str, names: set[str]) -> bool:
    """True once the scheduler tried every one of `names` and parked it as unschedulable."""
    parked = 0
    for p in core.list_namespaced_pod(namespace, label_selector=LOAD_LABEL).items:
        if p.metadata.name in names:
            if any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in (p.status.conditions or [])):
                parked += 1
    return parked == len(names)


def label_node_with_profile(core, node: str, profile: str) -> None:
    core.patch_node(node, {"metadata": {"labels": {PROFILE_LABEL: profile}}})


def taint_rule(name: str, driver: str, pool: str, *, label: str = "true") -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": name, "labels": {LOAD_LABEL: label}},
            "spec": {"deviceSelector": {"driver": driver, "pool": pool},
                     "taint": {"key": "dra-harness.x-k8s.io/load", "value": "held", "effect": "NoSchedule"}}}


def extended_class(name: str, driver: str, resource: str, *, label: str = "true") -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {LOAD_LABEL: label}},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}],
                     "extendedResourceName": resource}}


def claim_template(name: str, device_class: str) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}}


def cleanup(core, resource, namespace: str, label: str = "true") -> None:
    """Delete what a load run created (namespace, its DeviceTaintRules, DeviceClasses and ResourceSlices): the objects
    labelled with this run's `label` only, so runs sharing a cluster never remove each other's."""
    selector = f"{LOAD_LABEL}={label}"
    for rule in resource.list_device_taint_rule(label_selector=selector).items:
        errors.ignore_missing(resource.delete_device_taint_rule, rule.metadata.name)
    for cls in resource.list_device_class(label_selector=selector).items:
        errors.ignore_missing(resource.delete_device_class, cls.metadata.name)
    for item in resource.list_resource_slice(label_selector=selector).items:  # requeue-correctness's own pools
        errors.ignore_missing(resource.delete_resource_slice, item.metadata.name)
    errors.ignore_missing(core.delete_namespace, namespace)
