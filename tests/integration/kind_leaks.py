"""What a kind run must leave behind (nothing), shared by the kind integration tests: node containers
(also those stored in our stopped dockerd's data root), docker bridges, our dockerd's registration,
processes naming the cluster, mounts, the builders' temporary directories, the cluster's state, the
FORWARD policies and (when no real node holds the machine-wide record) the kubelets' sysctls.
Also the one opt-in condition of those tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil

from harness.backends.kind import backend as kind
from harness.backends.kind import preflight as kind_preflight
from harness.backends.kind.host import docker, enginechoice, hostnet
from harness.backends.local.realnode import host as machine_settings
from harness.core import paths


def why_not(what: str) -> str | None:
    """Why the kind tests cannot run here (opt-in, no kind, no engine possible), or None."""
    if os.environ.get("DRA_HARNESS_KIND_E2E") != "1":
        return f"opt-in: set DRA_HARNESS_KIND_E2E=1 ({what})"
    if not (os.environ.get("DRA_HARNESS_KIND") or kind_preflight.which_with_cached_kind("kind")):
        return "kind is neither on PATH nor in the cache (dra-harness binaries install --kind)"
    return "; ".join(enginechoice.decide(enginechoice.detect()).problems) or None


def engine_env() -> dict[str, str] | None:
    """How to reach the engine the kind backend uses now (ours while it runs), or None when ours is stopped."""
    ours = docker.running()
    if ours is not None:
        return ours.environ()
    facts = enginechoice.detect()
    return dict(os.environ) if facts.engine_reachable else None


def node_containers(name: str) -> list[str]:
    env = engine_env()
    if env is None:
        return []
    out = subprocess.run(["docker", "ps", "--all", "--format", "{{.Names}}", f"--filter=name=^{name}-"],
                         capture_output=True, text=True, env=env, timeout=60)
    return out.stdout.split()


def _stored_containers() -> set[str]:
    """Every container our dockerd's data root holds, running or not (readable while it is stopped)."""
    directory = docker.Layout.default().data_root / "containers"
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


def docker_bridges() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith("br-") and (p / "bridge").is_dir()}


def _leftover_dirs() -> set[str]:
    cache = paths.cache_root()
    found = {str(p) for pattern in ("driver-base/build-*", "driver-base/*.partial", "kind-node/build-*",
                                    "kind-node/*.partial", "kind-node/rootfs-*.work", "driver-base/rootfs-*.work",
                                    "kwok-image-*")
             for p in cache.glob(pattern)}
    return found  # (pytest's shared directories are the suite test's own check: other runs make them too)


def _mounts(name: str) -> list[str]:
    roots = (str(paths.state_root()), str(paths.cache_root()))
    return [line for line in Path("/proc/mounts").read_text().splitlines()
            if any(root in line for root in roots) or f"/{name}" in line]


def _processes(name: str) -> list[str]:
    socket = str(docker.Layout.default().socket)
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if name in line or (socket in line and "dockerd" in line):
            found.append(f"{proc.info['pid']}: {line[:200]}")
    return found


class Before:
    def __init__(self, name: str):
        self.name = name
        self.host = hostnet.snapshot()
        self.bridges = docker_bridges()
        self.dirs = _leftover_dirs()
        self.stored = _stored_containers()
        self.engine_ours = docker.Layout.default().record.exists()
        # Real nodes of other clusters running now: the kubelet's machine-wide sysctls are theirs (set by their
        # kubelets, restored by the last of them to leave), so `host` does not hold the machine's own values.
        self.real_node_owners = machine_settings.owners()

    def leaks(self) -> list[str]:
        name, found = self.name, []
        if node_containers(name):
            found.append(f"node containers: {node_containers(name)}")
        if _stored_containers() - self.stored:
            found.append(f"containers stored in our dockerd's data root: {_stored_containers() - self.stored}")
        if docker_bridges() - self.bridges:
            found.append(f"docker bridges: {docker_bridges() - self.bridges}")
        if not self.engine_ours and docker.Layout.default().record.exists():
            found.append("our dockerd is still registered (engine.json)")
        if _processes(name):
            found.append(f"processes: {_processes(name)}")
        if _mounts(name):
            found.append(f"mounts: {_mounts(name)}")
        if _leftover_dirs() - self.dirs:
            found.append(f"temporary directories: {_leftover_dirs() - self.dirs}")
        if kind.state_dir(name).exists():
            found.append(f"state: {kind.state_dir(name)}")
        now = hostnet.snapshot()
        if now["forwardPolicy"] != self.host["forwardPolicy"]:
            found.append(f"FORWARD policy {self.host['forwardPolicy']} -> {now['forwardPolicy']}")
        if not self.real_node_owners and not machine_settings.owners():  # else real nodes' owners restore them
            found += [f"sysctl {s}: {self.host['sysctls'].get(s)} -> {now['sysctls'].get(s)}"
                      for s in hostnet.KUBELET_SYSCTLS if now["sysctls"].get(s) != self.host["sysctls"].get(s)]
        return found
