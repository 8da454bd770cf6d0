"""inotify on this machine: how much a user has in use, and whether real nodes still fit.

The kubelet and containerd of a real node each open several inotify instances (file watchers for
configuration, certificates, plugin sockets, CDI specs, cgroups). The limits are per user and
machine-wide (`fs.inotify.max_user_instances`, default 128; `fs.inotify.max_user_watches`): with a
few clusters side by side a new kubelet dies with "error creating fsnotify watcher: too many open
files" and containerd's CRI plugin does not load. host.py raises the limits for the real nodes it
starts (and restores them with the other settings); preflight.py says what to raise where it cannot.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

INSTANCES = "fs.inotify.max_user_instances"
WATCHES = "fs.inotify.max_user_watches"
# What one real node opens (measured: kubelet 6 instances and 40-80 watches, containerd 2 and 2,
# the Python kubelet plugins none), doubled: the kubelet opens more as pods come and go.
PER_NODE = {INSTANCES: 16, WATCHES: 1024}
# What one kind node container opens (measured on a 3-node kind v0.33.0 cluster, per node: kubelet 7,
# systemd 4, containerd 2, kube-proxy 1, dbus 1 instances, ~150 watches; the control-plane node's
# apiserver and controller-manager 13 more), with room. They run as root whoever runs the harness: at the
# default limit of 128 instances a 10-node kind cluster left its last two kubelets NotReady.
KIND_NODE = {INSTANCES: 24, WATCHES: 1024}
# What a cluster's control plane opens (measured: controller-manager 7, apiserver 3, scheduler 2
# instances, 20 watches in all), with room: counted when it has not started yet.
CONTROL_PLANE = {INSTANCES: 16, WATCHES: 256}
# Left free above what the real nodes need, for everything else this user runs.
MARGIN = {INSTANCES: 128, WATCHES: 65536}
PROC = Path("/proc")


@dataclass(frozen=True)
class Usage:
    instances: int
    watches: int

    def of(self, sysctl: str) -> int:
        return self.instances if sysctl == INSTANCES else self.watches


def usage(uid: int, proc: Path | None = None) -> Usage:
    """inotify instances and watches held by processes of `uid`, from their file descriptors
    (`anon_inode:inotify`) and fdinfo (one `inotify wd:` line per watch). A descriptor shared by
    several processes is counted once per process: an overestimate errs on the safe side."""
    proc = proc or PROC  # looked up at the call: tests point PROC elsewhere
    instances = watches = 0
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:  # /proc/<pid> belongs to the process's effective user
                continue
            fds = os.listdir(proc / entry.name / "fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(proc / entry.name / "fd" / fd) != "anon_inode:inotify":
                    continue
                instances += 1
                with open(proc / entry.name / "fdinfo" / fd) as info:
                    watches += sum(1 for line in info if line.startswith("inotify wd:"))
            except OSError:
                continue
    return Usage(instances, watches)


@dataclass(frozen=True)
class Shortfall:
    sysctl: str
    limit: int
    used: int
    needed: int  # by the new real nodes

    @property
    def raise_to(self) -> int:
        return self.used + self.needed + MARGIN[self.sysctl]

    def __str__(self) -> str:
        return self.describe("the real nodes")

    def describe(self, what: str) -> str:
        return (f"{self.sysctl} is {self.limit} and {self.used} are in use by this user: {what} need "
                f"{self.needed} more; raise it, e.g. `sysctl -w {self.sysctl}={self.raise_to}`")


def limit(sysctl: str, proc: Path | None = None) -> int | None:
    try:
        return int(((proc or PROC) / "sys" / sysctl.replace(".", "/")).read_text())
    except (OSError, ValueError):
        return None  # not on this kernel


def limits(proc: Path | None = None) -> dict[str, int]:
    """Both limits, as far as the kernel has them."""
    found = {sysctl: limit(sysctl, proc) for sysctl in (INSTANCES, WATCHES)}
    return {sysctl: value for sysctl, value in found.items() if value is not None}


def shortfalls(nodes: int, *, control_plane: bool = False, uid: int | None = None,
               footprint: dict[str, int] | None = None) -> list[Shortfall]:
    """The inotify limits too low for `nodes` more nodes of this user (real nodes, or with
    `footprint=KIND_NODE` kind node containers), plus the control plane of their cluster when it has not
    started yet (empty: they fit)."""
    if nodes <= 0:
        return []
    used = usage(os.geteuid() if uid is None else uid)
    current = {sysctl: limit(sysctl) for sysctl in (footprint or PER_NODE)}
    return shortfalls_from(current, used, nodes, control_plane=control_plane, footprint=footprint)


def shortfalls_from(current: Mapping[str, int | None], used: Usage, nodes: int, *, control_plane: bool = False,
                    footprint: dict[str, int] | None = None) -> list[Shortfall]:
    """shortfalls(), decided from limits and usage already read (preflight has them in its HostFacts);
    a limit missing from `current`, or None, is one the kernel lacks: nothing to check."""
    if nodes <= 0:
        return []
    found = []
    for sysctl, per_node in (footprint or PER_NODE).items():
        limit_now = current.get(sysctl)
        needed = nodes * per_node + (CONTROL_PLANE[sysctl] if control_plane else 0)
        if limit_now is not None and limit_now - used.of(sysctl) < needed:
            found.append(Shortfall(sysctl, limit_now, used.of(sysctl), needed))
    return found
