"""What the node image adds to the Debian root filesystem: kind's base files, containerd's config with
the runc wrapper, the CNI conflist, the binaries and the systemd links, written as a tree; and the
kubeadm patches a cluster of the image needs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from harness.backends.kind.host import wrapper_file
from harness.backends.kind.host.nodeinputs import Inputs
from harness.core.errors import HarnessError

WRAPPER_IN_NODE = "/usr/local/sbin/runc-wrapper"
RUNC_IN_NODE = "/usr/sbin/runc"  # Debian's runc package
POD_SUBNET = "10.244.0.0/16"


def containerd_config(kind_config: str) -> str:
    """kind's containerd config with runc replaced by the wrapper (for both runtime handlers)."""
    marker = "    SystemdCgroup = true\n"
    if kind_config.count(marker) < 1:
        raise HarnessError("kind's containerd config.toml has no `SystemdCgroup = true` runtime option to extend; "
                           "its layout changed")
    return kind_config.replace(marker, marker + f'    BinaryName = "{WRAPPER_IN_NODE}"\n')


def cri_base_spec(default_spec: dict) -> dict:
    """kind's /etc/containerd/cri-base.json: `ctr oci spec` with the product-files hook, without rlimits."""
    spec = json.loads(json.dumps(default_spec))
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append({"path": "/kind/bin/mount-product-files.sh"})
    spec.get("process", {}).pop("rlimits", None)
    return spec


def cni_conflist() -> str:
    """A node-local bridge: pods reach each other on the node and the API server; kindnetd (which would
    route between nodes) is not available offline."""
    return json.dumps({"cniVersion": "1.0.0", "name": "dra-harness-bridge", "plugins": [
        {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=2) + "\n"


def kind_config_patches() -> list[str]:
    """kubeadm config patches a cluster of this image needs (kind's `kubeadmConfigPatches`)."""
    # kubeadm's 1-minute API-call timeout (bootstrapping the admin ClusterRoleBinding) ran out on 2
    # cores busy with other work (measured: `kind create cluster` failed with "context deadline
    # exceeded"); a slow apiserver is what these machines have, so wait longer rather than fail.
    return [
        "kind: InitConfiguration\nskipPhases: [preflight, addon/coredns]\n"
        "timeouts: {controlPlaneComponentHealthCheck: 8m0s, kubernetesAPICall: 5m0s}\n",
        "kind: JoinConfiguration\nskipPhases: [preflight]\n"
        "timeouts: {kubernetesAPICall: 5m0s, tlsBootstrap: 8m0s, discovery: 8m0s}\n",
        "kind: KubeletConfiguration\nfailCgroupV1: false\n",
    ]


def enable_unit_links(unit_text: str, unit: str) -> list[str]:
    """The `.wants` links `systemctl enable` makes for a unit (from its [Install] WantedBy)."""
    links = []
    for line in unit_text.splitlines():
        if line.strip().startswith("WantedBy="):
            links += [f"etc/systemd/system/{target}.wants/{unit}" for target in line.split("=", 1)[1].split()]
    return links


def overlay_files(inputs: Inputs, cri_spec: dict) -> dict[str, tuple[bytes | Path, int]]:
    """Everything the image adds to the Debian root filesystem: path -> (content or source file, mode)."""
    base = inputs.kind_dir / "images" / "base" / "files"
    files: dict[str, tuple[bytes | Path, int]] = {}
    for source in sorted(p for p in base.rglob("*") if p.is_file()):
        relative = source.relative_to(base).as_posix()
        executable = relative.startswith(("usr/local/bin/", "kind/bin/"))
        files[relative] = (source, 0o755 if executable else 0o644)
    files["etc/containerd/config.toml"] = (containerd_config((base / "etc/containerd/config.toml").read_text())
                                           .encode(), 0o644)
    files["etc/containerd/cri-base.json"] = (json.dumps(cri_spec, indent=2).encode(), 0o644)
    files["etc/cni/net.d/10-dra-harness-bridge.conflist"] = (cni_conflist().encode(), 0o644)
    files["kind/version"] = (f"v{inputs.kubernetes_version}".encode(), 0o644)
    files[WRAPPER_IN_NODE.lstrip("/")] = (wrapper_file.render("/usr/bin/python3", RUNC_IN_NODE, inputs.drops,
                                                              clamp_oom=True).encode(), 0o755)
    for name in ("kubelet", "kubectl"):
        files[f"usr/bin/{name}"] = (inputs.cluster_bins / name, 0o755)
    files["usr/bin/kubeadm"] = (inputs.node_bins / "kubeadm", 0o755)
    for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
        files[f"usr/local/bin/{name}"] = (inputs.runtime_dir / name, 0o755)
    return files


def write_tree(directory: Path, files: dict[str, tuple[bytes | Path, int]], links: dict[str, str]) -> None:
    for relative, (content, mode) in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, path)
        else:
            path.write_bytes(content)
        os.chmod(path, mode)
    for relative, target in links.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
