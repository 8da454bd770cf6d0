"""Where a real node keeps its things, and the record of a node in the cluster's state.yaml.

A node's directory is `/var/lib/dra-harness/<id>` (override: DRA_HARNESS_NODE_ROOT), not the
cluster directory: unix socket paths are limited to 107 bytes, and the kubelet's plugin sockets
(`<root>/plugins_registry/<driver>-reg.sock`) need a short prefix. The id is derived from the
cluster directory and node name, so two clusters never share one.

The local backend's real nodes (harness.backends.local.realnode) live by it; it sits in core/ because the
cluster definitions (harness.config.cluster) check socket path lengths with it too.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path

NODE_ROOT_ENV = "DRA_HARNESS_NODE_ROOT"
DEFAULT_NODE_ROOT = "/var/lib/dra-harness"


def node_root() -> Path:
    return Path(os.environ.get(NODE_ROOT_ENV) or DEFAULT_NODE_ROOT)


def node_id(cluster_dir: Path, node_name: str) -> str:
    return hashlib.sha1(f"{cluster_dir}\0{node_name}".encode()).hexdigest()[:8]


@dataclass(frozen=True)
class NodeDirs:
    base: Path

    @property
    def containerd_root(self) -> Path:
        return self.base / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.base / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.base / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.base / "containerd" / "config.toml"

    @property
    def runc_root(self) -> Path:
        return self.base / "runc"

    @property
    def cni_conf(self) -> Path:
        return self.base / "cni" / "net.d"

    @property
    def cni_ipam(self) -> Path:
        return self.base / "cni" / "ipam"

    @property
    def cdi(self) -> Path:
        return self.base / "cdi"

    @property
    def kubelet_root(self) -> Path:
        return self.base / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.base / "kubelet-config.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.base / "pod-logs"

    @property
    def images(self) -> Path:
        return self.base / "images"

    @property
    def plugins(self) -> Path:
        return self.kubelet_root / "plugins"

    @property
    def plugins_registry(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugin_state(self) -> Path:
        return self.base / "driver-state"

    def all(self) -> list[Path]:
        return [self.containerd_root, self.containerd_state, self.runc_root, self.cni_conf, self.cni_ipam, self.cdi,
                self.kubelet_root, self.pod_logs, self.images, self.plugins, self.plugins_registry,
                self.plugin_state]


@dataclass(frozen=True)
class RealNodeRecord:
    """What state.yaml keeps about a real node: enough to use it and to tear it down after a crash."""

    name: str
    id: str
    directory: str
    bridge: str
    subnet: str
    address: str
    kubelet_port: int
    healthz_port: int

    @property
    def dirs(self) -> NodeDirs:
        return NodeDirs(Path(self.directory))

    @property
    def kubelet_process(self) -> str:
        return f"kubelet-{self.name}"

    @property
    def containerd_process(self) -> str:
        return f"containerd-{self.name}"

    def plugin_process(self, driver: str) -> str:
        return f"kubelet-plugin-{self.name}-{driver}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RealNodeRecord":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def records(cluster_data: dict) -> list[RealNodeRecord]:
    return [RealNodeRecord.from_dict(d) for d in cluster_data.get("realNodes", [])]
