"""What the real-node code needs to know about this machine, in one record read once.

`HostFacts.read()` looks at the machine (the system, the user, /proc, /sys/fs/cgroup, PATH, the node
root); the deciding code takes the record as an argument and looks at nothing itself
(preflight.problems_of), so a unit test hands in the machine it means instead of patching every
function that would look at this one. The record holds what was found, not what it means: the
messages and decisions stay with the modules that own them (preflight, noderuntime, inotify).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.backends.commands import Runner
from harness.backends.local.realnode import cgroups, host, inotify
from harness.binaries import noderuntime
from harness.core.nodelayout import node_root

PROC = Path("/proc")
# The programs a real node runs from PATH: `ip` for its bridge (network.py), `umount` at teardown.
COMMANDS = ("ip", "umount")


@dataclass(frozen=True)
class HostFacts:
    system: str  # platform.system(): a real node needs "Linux"
    euid: int
    cgroup_hierarchies: tuple[Path, ...]  # mount points, as cgroups.hierarchies() finds them
    filesystems: frozenset[str]  # the kernel's, as /proc/filesystems lists them
    missing_commands: tuple[str, ...]  # of COMMANDS, those not on PATH
    runc: Path | None  # the machine's tools a real node uses (noderuntime.find_host_tools); None: not found
    cni_dir: Path | None
    busybox: Path | None  # statically linked
    read_only_sysctls: frozenset[str]  # of host.SYSCTLS, those that exist here and this user may not write
    inotify_limits: Mapping[str, int]  # inotify.INSTANCES / WATCHES, as far as the kernel has them
    inotify_usage: inotify.Usage  # held by this user (euid) now
    node_root: Path  # where the nodes' directories go (DRA_HARNESS_NODE_ROOT)
    # The nearest existing path at or above node_root when it is not a writable directory (the root
    # cannot be created there); None: it can be.
    node_root_blocked_by: Path | None

    @property
    def cgroup_layout(self) -> str:
        return cgroups.layout_of(self.cgroup_hierarchies)

    @property
    def host_tools_missing(self) -> list[str]:
        return noderuntime.host_tools_missing(self.runc, self.cni_dir, self.busybox)

    @classmethod
    def read(cls, runner: Runner | None = None, proc: Path = PROC) -> HostFacts:
        """This machine's facts, each read once; nothing is created or changed. `runner` looks up the
        programs on PATH; `proc` is where /proc is (a test's directory)."""
        runner = runner or Runner()
        system = platform.system()
        euid = os.geteuid()
        runc, cni_dir, busybox = noderuntime.find_host_tools()
        proc_sys = proc / "sys"
        root = node_root()
        existing = next(p for p in [root, *root.parents] if p.exists())
        return cls(
            system=system,
            euid=euid,
            cgroup_hierarchies=tuple(cgroups.hierarchies(mountinfo=proc / "self" / "mountinfo")),
            filesystems=_filesystems(proc / "filesystems"),
            missing_commands=tuple(c for c in COMMANDS if not runner.which(c)),
            runc=runc,
            cni_dir=cni_dir,
            busybox=busybox,
            read_only_sysctls=frozenset(
                name for name in host.SYSCTLS
                if (path := host.sysctl_path(name, proc_sys)).exists() and not os.access(path, os.W_OK)),
            inotify_limits=inotify.limits(proc),
            # Counting walks every process; elsewhere there is no /proc to walk (and no real node).
            inotify_usage=inotify.usage(euid, proc) if system == "Linux" else inotify.Usage(0, 0),
            node_root=root,
            # checked without creating anything
            node_root_blocked_by=None if existing.is_dir() and os.access(existing, os.W_OK) else existing,
        )


def _filesystems(path: Path) -> frozenset[str]:
    """The names /proc/filesystems lists, one a line after an optional `nodev`."""
    try:
        return frozenset(line.split()[-1] for line in path.read_text().splitlines() if line.strip())
    except OSError:
        return frozenset()
