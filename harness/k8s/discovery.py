"""What the cluster under test can do, discovered rather than assumed: server version, feature gates
(from the apiserver's `kubernetes_feature_enabled` metric) and served API versions. Conformance tests
skip with the reason when what they need is off."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from harness.k8s import errors
from harness.k8s.client import Clients

_FEATURE = re.compile(r'^kubernetes_feature_enabled\{name="([^"]+)",stage="([^"]*)"\} (\S+)$', re.M)


@dataclass(frozen=True)
class ClusterFacts:
    version: str
    gates: dict[str, bool] = field(default_factory=dict)  # empty when /metrics is not readable
    stages: dict[str, str] = field(default_factory=dict)
    apis: frozenset[str] = frozenset()
    kubelet_nodes: tuple[str, ...] = ()  # Ready nodes run by a real kubelet (not KWOK)

    def gate(self, name: str) -> bool | None:
        """True/False when the cluster says so, None when it cannot be told (no metrics access)."""
        return self.gates.get(name) if self.gates else None

    def to_dict(self) -> dict:
        return {"version": self.version, "gates": dict(sorted(self.gates.items())), "apis": sorted(self.apis),
                "kubeletNodes": list(self.kubelet_nodes)}


def discover(k8s: Clients) -> ClusterFacts:
    version = k8s.version.get_code().git_version
    gates, stages = {}, {}
    try:
        for name, stage, value in _FEATURE.findall(k8s.get_raw("/metrics")):
            gates[name] = float(value) == 1.0
            stages[name] = stage
    except (errors.ApiError, OSError):
        pass  # not allowed to read metrics: gates stay unknown, nothing is skipped for them
    apis: set[str] = set()
    groups = json.loads(k8s.get_raw("/apis"))["groups"]
    for group in groups:
        apis.update(v["groupVersion"] for v in group["versions"])
    apis.add("v1")
    kubelet_nodes = []
    for node in k8s.core.list_node().items:
        simulated = (node.metadata.annotations or {}).get("kwok.x-k8s.io/node") == "fake"
        ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
        if ready and not simulated:
            kubelet_nodes.append(node.metadata.name)
    return ClusterFacts(version, gates, stages, frozenset(apis), tuple(sorted(kubelet_nodes)))
