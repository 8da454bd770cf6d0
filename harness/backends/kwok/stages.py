"""The lifecycle KWOK plays for simulated nodes and pods, as KWOK Stage objects.

The `kwok` controller does nothing without stages (kwokctl normally writes its defaults into the
config). Ours are deliberately small: a node becomes Ready at once and keeps a slow status heartbeat
(liveness comes from its Lease, as with a real kubelet); a bound pod becomes Running at once (unless
labelled KWOK_NOT_STARTED_LABEL: the load tests' burst pods stay bound and Pending, as scheduler_perf's),
a Job's pod then Succeeds, and a deleted pod goes away (the kubelet's part of graceful deletion).
Templates are Go text/template over the object, with KWOK's helper functions (Now, NodeIP, ...).
"""

from __future__ import annotations

import yaml

from harness.k8s.nodes import KWOK_NOT_STARTED_LABEL

API = "kwok.x-k8s.io/v1alpha1"
NODE_LEASE_SECONDS = 40  # a kubelet's default (nodeLeaseDurationSeconds): renewed every 10 s

_NODE_STATUS = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- type: {{ .type | Quote }}
  status: {{ .status | Quote }}
  reason: {{ .reason | Quote }}
  message: {{ .message | Quote }}
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ or $.metadata.creationTimestamp $now | Quote }}
{{ end }}
addresses:
- type: InternalIP
  address: {{ NodeIP | Quote }}
- type: Hostname
  address: {{ .metadata.name | Quote }}
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
{{ with .status.capacity }}
capacity:
{{ YAML . 1 }}
{{ end }}
{{ with .status.allocatable }}
allocatable:
{{ YAML . 1 }}
{{ end }}
phase: Running
"""

_POD_RUNNING = """\
{{ $now := Now }}
phase: Running
startTime: {{ $now | Quote }}
conditions:
{{ range list "PodReadyToStartContainers" "Initialized" "ContainersReady" "Ready" }}
- type: {{ . }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
{{ range .spec.readinessGates }}
- type: {{ .conditionType | Quote }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with .spec.initContainers }}
initContainerStatuses:
{{ range . }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  restartCount: 0
{{ if eq (or .restartPolicy "") "Always" }}
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ else }}
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
{{ end }}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ with PodIPsWith .spec.nodeName (or .spec.hostNetwork false) (or .metadata.uid "") (or .metadata.name "") (or .metadata.namespace "") }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
"""

_POD_SUCCEEDED = """\
{{ $now := Now }}
phase: Succeeded
conditions:
{{ range list "Ready" "ContainersReady" }}
- type: {{ . }}
  status: "False"
  reason: PodCompleted
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
"""


def _stage(name: str, kind: str, expressions: list[dict], next_: dict, delay: dict | None = None) -> dict:
    spec: dict = {"resourceRef": {"apiGroup": "v1", "kind": kind}, "selector": {"matchExpressions": expressions},
                  "next": next_}
    if delay:
        spec["delay"] = delay
    return {"apiVersion": API, "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def _ready_is(operator: str) -> dict:
    return {"key": '.status.conditions.[] | select( .type == "Ready" ) | .status', "operator": operator,
            "values": ["True"]}


NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
# A gojq path: the label's key holds dots and a slash.
NOT_STARTED_UNLESS_ASKED = {"key": f'.metadata.labels["{KWOK_NOT_STARTED_LABEL}"]', "operator": "DoesNotExist"}


def stages() -> list[dict]:
    return [
        _stage("dra-harness-node-ready", "Node", [_ready_is("NotIn")], {"statusTemplate": _NODE_STATUS}),
        # The Lease (--node-lease-duration-seconds) proves liveness; status is refreshed rarely, as a
        # kubelet does, so 1000 nodes cost the apiserver little.
        _stage("dra-harness-node-heartbeat", "Node",
               [{"key": ".status.phase", "operator": "In", "values": ["Running"]}, _ready_is("In")],
               {"statusTemplate": _NODE_STATUS},
               delay={"durationMilliseconds": 300000, "jitterDurationMilliseconds": 360000}),
        _stage("dra-harness-pod-running", "Pod",
               [NOT_DELETED, {"key": ".status.phase", "operator": "In", "values": ["Pending"]}, _ready_is("NotIn"),
                NOT_STARTED_UNLESS_ASKED],
               {"statusTemplate": _POD_RUNNING}),
        _stage("dra-harness-pod-succeeded", "Pod",
               [NOT_DELETED, {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}],
               {"statusTemplate": _POD_SUCCEEDED}),
        _stage("dra-harness-pod-delete", "Pod", [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
               {"delete": True}),
    ]


def config_yaml(node_lease_seconds: int = NODE_LEASE_SECONDS) -> str:
    """The multi-document file passed to `kwok --config`; KWOK renews each node's Lease every quarter of
    `node_lease_seconds` (sigs.k8s.io/kwok v0.8.0 pkg/kwok/controllers/controller.go)."""
    # Parallelism must be explicit: the kwok binary applies no defaults to a config file it is given.
    options = {"nodeLeaseDurationSeconds": node_lease_seconds, "nodeLeaseParallelism": 16,
               "nodePlayStageParallelism": 8,
               "podPlayStageParallelism": 8, "podsOnNodeSyncParallelism": 4}
    documents = [{"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": options}]
    return yaml.safe_dump_all(documents + stages(), sort_keys=False)
