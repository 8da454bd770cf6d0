"""The one workload manifest of the rehearsal, and how to tell which path served a pod.

The manifest never changes: a container that asks for `<resource>: 1` in its limits, prints what
either path put into its environment, and waits. It tolerates the real-node taint, so it can run on
the local backend's real node; on simulated nodes nothing runs it.

Path of a bound pod, as the 1.37 scheduler decides it per node (noderesources/fit.go
shouldDelegateResourceToDRA, dynamicresources/extendeddynamicresources.go filterExtendedResources):
a node whose allocatable has the resource > 0 serves it from the device plugin (NodeResourcesFit
counts it, no claim); a node with 0 or none, where a DeviceClass names the resource, serves it
through DRA (the scheduler creates a claim and records it in status.extendedResourceClaimStatus).
"""

from __future__ import annotations

import re

from harness.k8s.nodes import UNTIL_DELETED

DEVICE_PLUGIN, DRA = "device-plugin", "dra"
ENV_DONE = "--- env done ---"
ENV_PATTERN = r"^(FAKE_DEVICE_PLUGIN_|DRA_)"
PRINT_ENV = ["sh", "-c", f"env | grep -E '{ENV_PATTERN}' | sort; echo '{ENV_DONE}'; {UNTIL_DELETED}"]
ENV_LINE = re.compile(r"^((?:FAKE_DEVICE_PLUGIN_|DRA_)[A-Z0-9_]*)=(.*)$")
REAL_NODE_TAINT_KEY = "dra-harness.x-k8s.io/real-node"  # harness.backends.local.realnode.kubelet.TAINT_KEY


def manifest(name: str, resource: str, image: str) -> dict:
    """The workload pod: identical for every pod of a rehearsal but its name."""
    container = {"name": "main", "image": image, "imagePullPolicy": "IfNotPresent", "command": list(PRINT_ENV),
                 "resources": {"limits": {resource: "1"}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 1,
                     "tolerations": [{"key": REAL_NODE_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]}}


def path_of(pod) -> str | None:
    """DRA or DEVICE_PLUGIN for a bound pod; None while it is not bound."""
    if not (pod.spec and pod.spec.node_name):
        return None
    status = pod.status.extended_resource_claim_status if pod.status else None
    return DRA if status and status.resource_claim_name else DEVICE_PLUGIN


def parse_env(text: str) -> dict[str, str] | None:
    """The variables the container printed, or None before it finished printing."""
    if ENV_DONE not in text:
        return None
    return {m[1]: m[2] for m in map(ENV_LINE.match, text.splitlines()) if m}
