"""The one cgroup a real node may use: `/dra-harness-<id>` in every hierarchy of the machine.

The kubelet (cgroupDriver cgroupfs, cgroupRoot /dra-harness-<id>) and runc create everything below
it (kubepods/, the QoS classes, pods, containers). We never move, unmount or reorganise the
machine's own cgroups: we add one directory per hierarchy, and remove it (deepest first, after
killing whatever still runs inside) when the node goes.

Works on cgroup v1 (one mount per controller), hybrid (v1 plus /sys/fs/cgroup/unified) and v2.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
MOUNTINFO = Path("/proc/self/mountinfo")


def hierarchies(root: Path = CGROUP_ROOT, mountinfo: Path = MOUNTINFO) -> list[Path]:
    """Mount points of the machine's cgroup hierarchies (v1 controllers, named ones, unified)."""
    found = []
    try:
        with open(mountinfo) as handle:
            for line in handle:
                fields = line.split()
                fstype = fields[fields.index("-") + 1]
                mount_point = Path(fields[4])
                if fstype in ("cgroup", "cgroup2") and (mount_point == root or root in mount_point.parents):
                    found.append(mount_point)
    except (OSError, ValueError, IndexError):
        return []
    return sorted(set(found))


def layout(root: Path = CGROUP_ROOT) -> str:
    """'v2', 'hybrid' or 'v1' (or 'none' when nothing is mounted)."""
    return layout_of(hierarchies(root), root)


def layout_of(mounts: Sequence[Path], root: Path = CGROUP_ROOT) -> str:
    """layout(), from hierarchies already read (HostFacts keeps them)."""
    mounts = list(mounts)
    if mounts == [root]:
        return "v2"
    if not mounts:
        return "none"
    return "hybrid" if any(m.name == "unified" for m in mounts) else "v1"


def parent_name(node_id: str) -> str:
    return f"dra-harness-{node_id}"


def create(node_id: str, mounts: Sequence[Path] | None = None, root: Path = CGROUP_ROOT) -> list[Path]:
    """Create the node's parent cgroup in every hierarchy (`mounts`: the machine's, read when not
    given; `root`: where a pure v2 hierarchy is mounted); returns the directories made."""
    made = []
    for mount in hierarchies() if mounts is None else mounts:
        directory = mount / parent_name(node_id)
        directory.mkdir(exist_ok=True)
        made.append(directory)
        # A new cpuset cgroup starts with no CPUs or memory nodes: give it its parent's.
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (directory / name).exists() and (mount / name).exists() and not (directory / name).read_text().strip():
                (directory / name).write_text((mount / name).read_text())
        if mount == root:  # pure v2: let the kubelet's children use the controllers we have
            controllers = (directory / "cgroup.controllers").read_text().split()
            if controllers:
                (directory / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in controllers))
    return made


def existing(node_id: str, mounts: Sequence[Path] | None = None) -> list[Path]:
    """The node's parent cgroups that exist, in the hierarchies `mounts` (the machine's when not given)."""
    mounts = hierarchies() if mounts is None else mounts
    return [m / parent_name(node_id) for m in mounts if (m / parent_name(node_id)).is_dir()]


def _tree(top: Path) -> list[Path]:
    """`top`'s cgroup directories below it, deepest first. The walk tolerates directories that vanish
    under it: runc and containerd remove a container's cgroups while the node is torn down (a
    Path.rglob raises FileNotFoundError then; os.walk skips what it can no longer list)."""
    return [Path(parent) / name for parent, names, _ in os.walk(top, topdown=False) for name in names]


def _pids(directory: Path) -> set[int]:
    pids: set[int] = set()
    for path in [directory, *_tree(directory)]:
        try:
            pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue
    return pids


def pids(node_id: str, mounts: Sequence[Path] | None = None) -> set[int]:
    found: set[int] = set()
    for directory in existing(node_id, mounts):
        found |= _pids(directory)
    return found


def remove(node_id: str, timeout: float = 10.0, mounts: Sequence[Path] | None = None) -> list[str]:
    """Kill what still runs in the node's cgroups and remove them; returns what is left."""
    mounts = hierarchies() if mounts is None else mounts  # read once: the machine's hierarchies stay
    deadline = time.monotonic() + timeout
    while True:
        remaining = pids(node_id, mounts)
        for pid in remaining:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        left = []
        for top in existing(node_id, mounts):
            # Deepest first: a cgroup directory can only be removed once it has no children.
            for directory in _tree(top):
                try:
                    directory.rmdir()
                except OSError:
                    pass
            try:
                top.rmdir()
            except OSError as err:
                left.append(f"cgroup {top}: {err.strerror}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
