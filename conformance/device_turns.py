"""Vendor mode: the tests of a run that use the vendor's devices take turns (a file lock of the run), and
each gives its devices back before the next turn starts (its pods and claims deleted, waited for)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from conformance import checks
from conformance.published_devices import held_on
from harness.core.locking import file_lock
from harness.k8s import errors, wait
from harness.k8s.client import Clients


def give_back(k8s: Clients, namespace: str, drivers=(), kubelet_nodes=(), timeout: float = 120) -> None:
    """Delete the namespace's pods and claims and wait until they are gone: the devices are free again;
    on kubelet nodes also until the kubelet holds no more claims of `drivers` prepared than the cluster
    has allocated there (it may unprepare after the claim is gone)."""

    pods = k8s.core.list_namespaced_pod(namespace).items
    binding = _pods_in_prebind(k8s, namespace, pods)
    # The pods not on a node go first, and are gone, before a bound pod frees its devices: else the scheduler
    # may give the freed devices to a waiting pod of this namespace while it is being deleted, and kube-scheduler
    # v1.37.2 can then hold them in flight for up to 120 s (docs/conformance.md "Found upstream").
    _delete_pods(k8s, namespace, [p.metadata.name for p in pods if not p.spec.node_name], timeout)
    _delete_pods(k8s, namespace, [p.metadata.name for p in pods if p.spec.node_name], timeout)
    try:  # a PodGroup holds its claims reserved: it goes too
        groups = k8s.scheduling.list_namespaced_pod_group(namespace).items
    except errors.NotFound:  # the cluster does not serve PodGroups
        groups = []
    for group in groups:
        wait.ignore_not_found(k8s.scheduling.delete_namespaced_pod_group, group.metadata.name, namespace)
    for claim in k8s.resource.list_namespaced_resource_claim(namespace).items:
        wait.ignore_not_found(k8s.resource.delete_namespaced_resource_claim, claim.metadata.name, namespace)
    wait.until(f"the claims of {namespace} to be gone",
               lambda: not k8s.resource.list_namespaced_resource_claim(namespace).items, timeout,
               diagnostics=lambda: wait.describe_namespace(k8s, namespace))
    if binding:
        # kube-scheduler v1.37.2 releases the in-flight allocation of a pod it was binding only at its next
        # PreBind look (every 5 s while binding conditions are pending), and a release for a claim that is
        # gone by then requeues no waiting pod (assumecache Restore finds no object and emits no event;
        # docs/conformance.md "Found upstream"): the next turn's pods would wait for the 5-minute
        # unschedulable flush. Outwait that look, once.
        wait.until(f"kube-scheduler to give up binding {', '.join(binding)}", _after(PREBIND_LOOK_SECONDS + 1),
                   PREBIND_LOOK_SECONDS + 10)
    for node in kubelet_nodes:
        for driver in drivers:
            wait.until(f"the kubelet on {node} to unprepare the claims of {driver} that are gone",
                       lambda: checks.kubelet_dra_metrics(k8s, node, driver)["in_use"] <= held_on(k8s, driver, node),
                       timeout, diagnostics=lambda: f"kubelet: {checks.kubelet_dra_metrics(k8s, node, driver)}")


def _delete_pods(k8s: Clients, namespace: str, names: list[str], timeout: float) -> None:
    if not names:
        return
    for name in names:
        wait.ignore_not_found(k8s.core.delete_namespaced_pod, name, namespace)

    def left() -> set[str]:
        return set(names) & {p.metadata.name for p in k8s.core.list_namespaced_pod(namespace).items}

    wait.until(f"pods {', '.join(names)} of {namespace} to be gone", lambda: not left(), timeout,
               diagnostics=lambda: wait.describe_namespace(k8s, namespace))


PREBIND_LOOK_SECONDS = 5  # k8s.io/kubernetes@v1.37.2 dynamicresources.go PreBind: PollUntilContextTimeout(5 s)


def _after(seconds: float):
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


def _pods_in_prebind(k8s: Clients, namespace: str, pods: list) -> list[str]:
    """The namespace's pods the scheduler is binding: not bound to a node, yet a claim of theirs is already
    reserved for them (the scheduler reserves in PreBind, then may wait there for binding conditions)."""
    claims = k8s.resource.list_namespaced_resource_claim(namespace).items
    reserved = {ref.uid for c in claims for ref in ((c.status.reserved_for or []) if c.status else [])}
    return [p.metadata.name for p in pods
            if not p.spec.node_name and p.metadata.uid in reserved]


@contextlib.contextmanager
def taking_turns(lock_dir: Path) -> Iterator[None]:

    with file_lock(lock_dir / "vendor-devices.lock"):
        yield
