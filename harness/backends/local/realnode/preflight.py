"""Can this machine run a real node? Every check, each failure with what to do about it.

Run before anything is built or started, so a machine that cannot host a kubelet gets one clear
message and keeps its state unchanged.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from harness.backends.commands import Runner
from harness.backends.local.realnode import cgroups, host, inotify
from harness.binaries import noderuntime
from harness.core.nodelayout import node_root


def problems(real_nodes: int = 1, runner: Runner | None = None) -> list[str]:
    """Everything that keeps this machine from running `real_nodes` more real nodes (empty: it can)."""
    runner = runner or Runner()
    found = []
    if platform.system() != "Linux":
        return [f"a real node needs Linux (this is {platform.system()})"]
    if os.geteuid() != 0:
        found.append("a real node needs root (the kubelet and containerd mount filesystems, create cgroups, "
                     "network namespaces and a bridge): run as root, or use --real-nodes 0 / the kind backend")
    layout = cgroups.layout()
    if layout == "none":
        found.append("no cgroup hierarchy is mounted under /sys/fs/cgroup")
    if "overlay" not in _filesystems():
        found.append("the kernel has no overlay filesystem (containerd's overlayfs snapshotter needs it)")
    for tool in ("ip", "umount"):
        if not runner.which(tool):
            found.append(f"`{tool}` is not installed (Debian: iproute2 / mount)")
    found += [f"missing: {m} (Debian: apt-get install {noderuntime.DEBIAN_PACKAGES})"
              for m in noderuntime.host_tools_missing()]
    for name in host.SYSCTLS[:4]:
        path = host.sysctl_path(name)
        if path.exists() and not os.access(path, os.W_OK):
            found.append(f"{path} is read-only here: the kubelet must be able to set {name}")
    # Checked with the control plane yet to start; host.acquire raises the limits where it may write them.
    for short in inotify.shortfalls(real_nodes, control_plane=True):
        if not os.access(host.sysctl_path(short.sysctl), os.W_OK):
            found.append(str(short))
    existing = next(p for p in [node_root(), *node_root().parents] if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):  # checked without creating anything
        found.append(f"cannot create the node directory root {node_root()} ({existing} is not a writable "
                     f"directory; set DRA_HARNESS_NODE_ROOT to a short writable path)")
    return found


def _filesystems() -> str:
    try:
        return Path("/proc/filesystems").read_text()
    except OSError:
        return ""
