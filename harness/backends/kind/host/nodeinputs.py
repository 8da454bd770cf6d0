"""What the offline node image is made from (kind's module, the binaries, kubeadm and kube-proxy built
here, the dropped capabilities) and the cache key and tag they give it."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness import binaries
from harness.backends.commands import Runner
from harness.backends.kind.host import wrapper_file
from harness.backends.kind.host.debianrootfs import DEBIAN_SUITE, PACKAGES, ROOTFS_RECIPE
from harness.binaries import gobuild, manifest
from harness.core import paths
from harness.core.errors import HarnessError
from harness.core.progress import Reporter

IMAGE_RECIPE = "2"  # bump when the node layer changes without any input changing (2: cri-base.json as kind's)
KIND_MODULE = "sigs.k8s.io/kind"
KIND_VERSION = "v0.33.0"
NODE_BINARIES = ("kubeadm", "kube-proxy")  # built for the image only (the cluster binaries lack them)
IMAGE_REPOSITORY = "dra-harness.local/kind-node"


def image_tag(kubernetes_version: str, key: str) -> str:
    return f"{IMAGE_REPOSITORY}:v{kubernetes_version}-{key[:12]}"


@dataclass(frozen=True)
class Inputs:
    kubernetes_version: str
    kind_dir: Path  # sigs.k8s.io/kind@v0.33.0 in the module cache
    kind_sum: str
    cluster_bins: Path  # kubelet, kubectl, kube-apiserver, ... etcd
    node_bins: Path  # kubeadm, kube-proxy
    runtime_dir: Path  # containerd, containerd-shim-runc-v2, ctr, pause
    drops: tuple[str, ...]  # capabilities the wrapper removes

    def key_material(self) -> dict:
        def hashes(directory: Path) -> dict:
            return {name: entry["sha256"] for group in manifest.load(directory)["groups"].values()
                    for name, entry in group["files"].items()}
        return {"recipe": IMAGE_RECIPE, "rootfsRecipe": ROOTFS_RECIPE, "suite": DEBIAN_SUITE, "packages": sorted(PACKAGES), "kind": self.kind_sum,
                "kubernetes": self.kubernetes_version, "drops": sorted(self.drops),
                "binaries": {**hashes(self.cluster_bins), **hashes(self.node_bins), **hashes(self.runtime_dir)},
                "wrapper": hashlib.sha256(wrapper_file.SOURCE.read_bytes()).hexdigest()}


def kind_module(work: Path) -> tuple[Path, str]:
    """kind's module in the Go module cache (downloaded once): its directory and checksum."""
    out = Runner().query(["go", "mod", "download", "-json", f"{KIND_MODULE}@{KIND_VERSION}"], cwd=work, timeout=600)
    try:
        info = json.loads(out.stdout)
    except ValueError:
        info = {"Error": (out.stderr or "no output").strip()}
    if info.get("Error") or out.returncode != 0:
        raise HarnessError(f"cannot download {KIND_MODULE}@{KIND_VERSION} from the Go module proxy: {info.get('Error')}")
    return Path(info["Dir"]), info["Sum"]


def ensure_node_binaries(version: str, reporter: Reporter) -> Path:
    """kubeadm and kube-proxy v<version>, built once and cached with their SHA-256."""
    os_name, arch = binaries.host_platform()
    target = paths.cache_root() / "binaries" / f"kind-node-v{version}_{os_name}-{arch}"
    target.mkdir(parents=True, exist_ok=True)
    with manifest.locked(target):
        recorded = manifest.load(target)
        if not manifest.group_ok(target, recorded, "kubernetes-node", version):
            work = paths.cache_root() / "build" / f"kubernetes-v{version}-node"
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            gobuild.build_kubernetes_commands(version, NODE_BINARIES, work, out, reporter)
            for name in NODE_BINARIES:
                manifest.install_file(out / name, target / name)
            shutil.rmtree(out, ignore_errors=True)
            manifest.record(target, recorded, "kubernetes-node", version, NODE_BINARIES, "build")
    return target

