"""The kubelet of a real node: its KubeletConfiguration and command line, as pure data.

Settings that follow from this machine (see docs/real-node.md):
- cgroup v1 is what many CI machines have: `failCgroupV1: false`, the `cgroupfs` driver and our own
  `cgroupRoot`, so nothing the node creates lands outside `/dra-harness-<id>`.
- no CAP_SYS_RESOURCE: `oomScoreAdj: 0` (the kubelet's default -999 is refused).
- the node IP is the node bridge's gateway address; the kubelet serves only there.
- container log, plugin and pod directories are under the node directory.
- eviction thresholds are minimal: a test node must not evict pods because a shared CI disk is full.
"""

from __future__ import annotations

import yaml

from harness.core.nodelayout import RealNodeRecord
from harness.k8s.nodes import KUBELET_LABEL as NODE_KUBELET_LABEL
from harness.k8s.nodes import REAL_NODE_TAINT_KEY

# Pods land on a real node only when they ask to (the KWOK nodes stay the default target); the
# suite reads the same names from harness.k8s.nodes.
TAINT_KEY, KUBELET_LABEL = REAL_NODE_TAINT_KEY, NODE_KUBELET_LABEL


def config(node: RealNodeRecord, ca_file: str) -> dict:
    dirs = node.dirs
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.address,
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": node.address,
        "healthzPort": node.healthz_port,
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/dra-harness-{node.id}",
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        "oomScoreAdj": 0,
        "protectKernelDefaults": False,
        "containerRuntimeEndpoint": f"unix://{dirs.containerd_socket}",
        "imageServiceEndpoint": f"unix://{dirs.containerd_socket}",
        "podLogsDir": str(dirs.pod_logs),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": ca_file}},
        "authorization": {"mode": "Webhook"},
        "resolvConf": "",
        "registerNode": True,
        "registerWithTaints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}],
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "kernelMemcgNotification": False,
        "podCIDR": node.subnet,
        "maxPods": 40,
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "shutdownGracePeriod": "0s",
    }


def config_yaml(node: RealNodeRecord, ca_file: str) -> str:
    return yaml.safe_dump(config(node, ca_file), sort_keys=False)


def argv(binary: str, node: RealNodeRecord, kubeconfig: str, labels: dict[str, str], gate_flags: list[str],
         verbosity: int = 1) -> list[str]:
    label_flag = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return [binary, f"--config={node.dirs.kubelet_config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={node.dirs.kubelet_root}", f"--hostname-override={node.name}",
            f"--node-ip={node.address}", f"--node-labels={label_flag}", *gate_flags, f"--v={verbosity}"]


def health_url(node: RealNodeRecord) -> str:
    return f"http://{node.address}:{node.healthz_port}/healthz"
