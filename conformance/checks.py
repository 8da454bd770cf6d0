"""Questions the conformance tests ask the cluster, with waits that explain themselves on timeout."""

from __future__ import annotations

from harness import wait
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
