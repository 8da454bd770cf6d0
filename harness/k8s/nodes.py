"""What the backends and the suite agree on about nodes, whatever backend made the cluster: when a
node counts as Ready, how a node run by a real kubelet is marked, and the images such a node of the
local backend has preloaded (it never pulls). Neutral ground: the suite imports this, never a backend."""

from __future__ import annotations

# Pods land on a real node only when they ask to (the KWOK nodes stay the default target).
REAL_NODE_TAINT_KEY = "dra-harness.x-k8s.io/real-node"
KUBELET_LABEL = "dra-harness.x-k8s.io/kubelet"
# A pod with this label is bound but never started by KWOK (its simulated nodes' kubelet): as scheduler_perf's
# pods, which nothing runs. The throughput scenarios mark their pods so (docs/load.md): no status write per pod.
KWOK_NOT_STARTED_LABEL = "dra-harness.x-k8s.io/kwok-not-started"

# Images the local backend builds and imports into a real node's containerd.
IMAGE_REGISTRY = "dra-harness.local"
IMAGE_RECIPE = "1"  # bump when an image's content or recipe changes
PAUSE_IMAGE = f"{IMAGE_REGISTRY}/pause:{IMAGE_RECIPE}"
SHELL_IMAGE = f"{IMAGE_REGISTRY}/shell:{IMAGE_RECIPE}"
# A shell command for SHELL_IMAGE's containers: wait until the pod is deleted, then end at once. A `sleep` run as the
# container's first process ignores SIGTERM, so each deletion waited out the grace period (plus the kubelet's next
# look): measured on the real node, 3.0-3.5 s from delete to gone with `exec sleep 3600`, 1.4 s with this.
UNTIL_DELETED = "trap 'exit 0' TERM; sleep 3600 & wait"

NOT_READY_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def is_ready(node) -> bool:
    """Ready condition True and no not-ready/unreachable taint (a kubernetes client V1Node)."""
    conditions = (node.status.conditions or []) if node.status else []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    taints = (node.spec.taints or []) if node.spec else []
    return ready and not any(t.key in NOT_READY_TAINTS for t in taints)


def why_not_ready(node) -> str:
    """Why a node (a kubernetes client V1Node, or None when it never registered) is not Ready, in words:
    its Ready condition's reason and message, or the not-ready taints it still carries."""
    if node is None:
        return "never registered (its kubelet did not start or cannot reach the API server)"
    conditions = (node.status.conditions or []) if node.status else []
    ready = next((c for c in conditions if c.type == "Ready"), None)
    if ready is None:
        return "registered, no Ready condition yet"
    if ready.status != "True":
        return f"Ready={ready.status} ({ready.reason}: {ready.message})"
    taints = sorted(t.key for t in (node.spec.taints or []) if t.key in NOT_READY_TAINTS) if node.spec else []
    return f"Ready but still tainted {', '.join(taints)}"


def pods_to_remove_with(core, node: str) -> list:
    """The pods bound to `node` that whoever removes the node must delete first: all but DaemonSets'. A
    cluster's node agents (kind's kube-proxy) land on every node, simulated ones too; they are not a
    test's to delete (their DaemonSet makes new ones at once) and the pod garbage collector removes them
    with the node."""
    return [pod for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
            if not any(ref.kind == "DaemonSet" for ref in (pod.metadata.owner_references or []))]
