"""The kind cluster config `kind create cluster --config` reads (pure): its nodes, their labels, the
feature gates, CDI in containerd, and the scheduler's configuration mounted into the control plane."""

from __future__ import annotations

from pathlib import Path

import yaml

from fake_devices.config import PROFILE_LABEL
from harness.backends import manifests
from harness.backends.kind.host import nodefiles
from harness.config import featuregates
from harness.config.cluster import ClusterDefinition
from harness.core import schedulerprofiles

# The node image, pinned by digest. This is the default node image of kind v0.33.0
# (sigs.k8s.io/kind@v0.33.0 pkg/apis/config/defaults/image.go; the v0.33.0 release notes list the
# same digest). kind v0.33.0 publishes v1.37.0, so kind clusters run Kubernetes v1.37.0 while the
# local backend runs v1.37.2. When kind publishes a v1.37.2 image, take its reference *with digest*
# from kind's release notes, or build one (`kind build node-image --type release v1.37.2`), and pass
# it with --node-image.
NODE_IMAGE = "kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5"
KIND_API_VERSION = "kind.x-k8s.io/v1alpha4"
OFFLINE_IMAGE_REPOSITORY = "dra-harness.local/kind-node"  # host.nodeinputs.IMAGE_REPOSITORY

# CDI in containerd. containerd 2.x enables it by default, but both driver anchors set it explicitly
# and so do we. Since kind v0.32, a containerdConfigPatch that sets `version = N` is applied only to
# nodes whose containerd config has that version, so we ship one patch per config format: the
# version-2 format kind's node images (v0.33.0) still write, and containerd 2's native version 3.
CONTAINERD_CDI_PATCHES = (
    '''version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
''',
    '''version = 3
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
''',
)
POOL_LABEL = "dra-harness.x-k8s.io/node-pool"
# kube-scheduler's configuration with the suite's second profile (core.schedulerprofiles), written into
# <state>/scheduler/ and mounted read-only at SCHEDULER_NODE_DIR in the control-plane node
SCHEDULER_DIR = "scheduler"
SCHEDULER_NODE_DIR = "/etc/kubernetes/dra-harness"
SCHEDULER_CONFIG = "kube-scheduler.yaml"


def worker_specs(definition: ClusterDefinition | None, nodes: int) -> list[tuple[str, dict[str, str]]]:
    """(pool, labels) of every worker, in order: one per node of each pool of the definition."""
    if definition is None:
        return [("default", {POOL_LABEL: "default"}) for _ in range(nodes)]
    workers = []
    for pool in definition.pools:
        labels = {POOL_LABEL: pool.name, **pool.labels}
        if pool.profile is not None:
            labels[PROFILE_LABEL] = pool.profile.name
        workers += [(pool.name, dict(sorted(labels.items()))) for _ in range(pool.count)]
    return workers


def node_names(name: str, workers: int) -> tuple[str, ...]:
    """The container (and Node) names kind gives: <name>-control-plane, <name>-worker, <name>-worker2, ..."""
    return (f"{name}-control-plane",) + tuple(f"{name}-worker{'' if i == 0 else i + 1}" for i in range(workers))


def scheduler_config(profiles: tuple[schedulerprofiles.SchedulerProfile, ...]) -> dict:
    """kube-scheduler's configuration on the control-plane node: default-scheduler plus `profiles`. With
    --config the scheduler ignores kubeadm's deprecated flags (--kubeconfig, --leader-elect:
    k8s.io/kubernetes@v1.37.2 cmd/kube-scheduler/app/options/options.go), so the file says both."""
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": "/etc/kubernetes/scheduler.conf"},
            "leaderElection": {"leaderElect": True},
            "profiles": [{"schedulerName": "default-scheduler"}, *(p.config() for p in profiles)]}


def _scheduler_patch(has_args: bool) -> dict:
    """kubeadm's ClusterConfiguration (v1beta4, what kind v0.33 writes for 1.36 and later): the scheduler
    reads SCHEDULER_CONFIG from the directory mounted into the node. A JSON patch, because a merge patch
    would replace kind's own extraArgs list (its --feature-gates)."""
    argument = {"name": "config", "value": f"{SCHEDULER_NODE_DIR}/{SCHEDULER_CONFIG}"}
    volume = {"name": "dra-harness", "hostPath": SCHEDULER_NODE_DIR, "mountPath": SCHEDULER_NODE_DIR,
              "readOnly": True, "pathType": "Directory"}
    operations = [{"op": "add", "path": "/scheduler/extraArgs/-", "value": argument} if has_args
                  else {"op": "add", "path": "/scheduler/extraArgs", "value": [argument]},
                  {"op": "add", "path": "/scheduler/extraVolumes", "value": [volume]}]
    return {"group": "kubeadm.k8s.io", "version": "v1beta4", "kind": "ClusterConfiguration",
            "patch": yaml.safe_dump(operations, sort_keys=False)}


def kind_config(name: str, workers: list[tuple[str, dict[str, str]]], features: featuregates.FeatureSettings,
                node_image: str = NODE_IMAGE, scheduler_dir: Path | None = None) -> dict:
    """The kind Cluster config (kind.x-k8s.io/v1alpha4). `scheduler_dir`: a directory with the
    scheduler's configuration (scheduler_config), mounted into the control-plane node."""
    config: dict = {"kind": "Cluster", "apiVersion": KIND_API_VERSION, "name": name}
    if features.gates:
        config["featureGates"] = {gate: value for gate, value in sorted(features.gates.items())}
    if features.runtime_config:
        # kind's runtimeConfig values are strings (it joins them into --runtime-config).
        config["runtimeConfig"] = {gv: str(on).lower() for gv, on in sorted(features.runtime_config.items())}
    config["containerdConfigPatches"] = list(CONTAINERD_CDI_PATCHES)
    if node_image.startswith(OFFLINE_IMAGE_REPOSITORY + ":"):
        # What that image needs (cgroup v1 allowed, no CoreDNS) and cannot do (no kindnetd image).
        config["networking"] = {"disableDefaultCNI": True}
        config["kubeadmConfigPatches"] = nodefiles.kind_config_patches()
    control_plane: dict = {"role": "control-plane", "image": node_image}
    if scheduler_dir is not None:
        control_plane["extraMounts"] = [{"hostPath": str(scheduler_dir), "containerPath": SCHEDULER_NODE_DIR,
                                         "readOnly": True}]
        config["kubeadmConfigPatchesJSON6902"] = [_scheduler_patch(bool(features.gates))]
    nodes: list[dict] = [control_plane]
    for _pool, labels in workers:
        nodes.append({"role": "worker", "image": node_image, "labels": dict(labels)})
    config["nodes"] = nodes
    return config


def config_yaml(config: dict) -> str:
    return ("# Generated by dra-harness (harness/backends/kind/config.py); `kind create cluster --config` reads it.\n"
            + manifests.dump_yaml(config))


def check_node_image(reference: str) -> str:
    return manifests.check_image(reference, "--node-image", "e.g. kindest/node:v1.37.0@sha256:<64 hex digits>")
