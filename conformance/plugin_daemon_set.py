"""The vendor's kubelet plugin as its DaemonSet runs it (spec.pluginDaemonSet): its pod on a node crashed,
and the DaemonSet's new pod there waited for."""

from __future__ import annotations

from harness.k8s import api, wait
from harness.k8s.client import Clients


def crash_daemon_set_pod(k8s: Clients, namespace: str, name: str, node: str, timeout: float = 120.0) -> None:
    """The vendor's plugin on `node`, run by DaemonSet namespace/name (spec.pluginDaemonSet), crashed: its
    pod there deleted at once (grace period 0: no clean shutdown, only what it checkpointed survives), then
    waited for until the DaemonSet's new pod on the node is ready."""
    owner = api.AppsV1Api(k8s.api_client).read_namespaced_daemon_set(name, namespace).metadata.uid

    def pods() -> list:
        """The DaemonSet's own pods on the node (by owner, not by label: nothing else of the namespace)."""
        return [p for p in k8s.core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
                if any(ref.uid == owner for ref in p.metadata.owner_references or [])]

    before = pods()
    assert before, f"DaemonSet {namespace}/{name} (spec.pluginDaemonSet) runs no pod on node {node}"
    for pod in before:
        wait.ignore_not_found(k8s.core.delete_namespaced_pod, pod.metadata.name, namespace, grace_period_seconds=0)
    gone = {pod.metadata.uid for pod in before}

    def replaced() -> bool:
        return any(p.metadata.uid not in gone and p.metadata.deletion_timestamp is None
                   and p.status.container_statuses and all(c.ready for c in p.status.container_statuses)
                   for p in pods())

    wait.until(f"a new pod of DaemonSet {namespace}/{name} on node {node} to be ready after its pod was deleted",
               replaced, timeout, interval=0.5, diagnostics=lambda: wait.describe_namespace(k8s, namespace))
