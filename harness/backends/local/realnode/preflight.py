"""Can this machine run a real node? Every check, each failure with what to do about it.

Run before anything is built or started, so a machine that cannot host a kubelet gets one clear
message and keeps its state unchanged. The checks decide from the machine's HostFacts alone
(problems_of); problems() reads them first.
"""

from __future__ import annotations

from harness.backends.commands import Runner
from harness.backends.local.realnode import host, inotify
from harness.backends.local.realnode.hostfacts import HostFacts
from harness.binaries import noderuntime


def problems(real_nodes: int = 1, runner: Runner | None = None) -> list[str]:
    """Everything that keeps this machine from running `real_nodes` more real nodes (empty: it can)."""
    return problems_of(HostFacts.read(runner), real_nodes)


def problems_of(facts: HostFacts, real_nodes: int = 1) -> list[str]:
    """Everything that keeps a machine with `facts` from running `real_nodes` more real nodes (empty: it can)."""
    found = []
    if facts.system != "Linux":
        return [f"a real node needs Linux (this is {facts.system})"]
    if facts.euid != 0:
        found.append("a real node needs root (the kubelet and containerd mount filesystems, create cgroups, "
                     "network namespaces and a bridge): run as root, or use --real-nodes 0 / the kind backend")
    if facts.cgroup_layout == "none":
        found.append("no cgroup hierarchy is mounted under /sys/fs/cgroup")
    if "overlay" not in facts.filesystems:
        found.append("the kernel has no overlay filesystem (containerd's overlayfs snapshotter needs it)")
    for tool in facts.missing_commands:
        found.append(f"`{tool}` is not installed (Debian: iproute2 / mount)")
    found += [f"missing: {m} (Debian: apt-get install {noderuntime.DEBIAN_PACKAGES})"
              for m in facts.host_tools_missing]
    for name in host.SYSCTLS[:4]:
        if name in facts.read_only_sysctls:
            found.append(f"{host.sysctl_path(name)} is read-only here: the kubelet must be able to set {name}")
    # Checked with the control plane yet to start; host.acquire raises the limits where it may write them
    # (a limit that was read exists: read-only is what keeps it from being written).
    for short in inotify.shortfalls_from(facts.inotify_limits, facts.inotify_usage, real_nodes, control_plane=True):
        if short.sysctl in facts.read_only_sysctls:
            found.append(str(short))
    if facts.node_root_blocked_by is not None:
        found.append(f"cannot create the node directory root {facts.node_root} ({facts.node_root_blocked_by} is "
                     f"not a writable directory; set DRA_HARNESS_NODE_ROOT to a short writable path)")
    return found
