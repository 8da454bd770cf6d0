"""Remove a real node completely, also one whose start was killed half-way, and say what is left.

Order: kubelet plugins and the kubelet (they talk to the API server and to containerd), then every
process in the node's cgroups (the pods' containers and pause processes), containerd and its shims
(found by the node directory in their command lines), then the mounts under the node directory
(container root filesystems, pod volumes, network namespaces, the kubelet's rshared bind mount),
the bridge, the cgroups and the directory. The machine-wide settings are restored by the last node.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import psutil

from harness.backends.commands import Runner
from harness.backends.local import process
from harness.backends.local.realnode import cgroups, host, network
from harness.core.nodelayout import RealNodeRecord, node_root, records

GRACE_SECONDS = 5.0
MOUNTINFO = Path("/proc/self/mountinfo")


def mounts_under(directory: Path, mountinfo: Path = MOUNTINFO) -> list[Path]:
    """Mount points at or below `directory`, deepest first."""
    prefix = str(directory).rstrip("/")
    found = []
    try:
        with open(mountinfo) as handle:
            for line in handle:
                # mountinfo escapes space, tab, newline and backslash as \ooo octal
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
                if point == prefix or point.startswith(prefix + "/"):
                    found.append(Path(point))
    except OSError:
        return []
    return sorted(found, key=lambda p: (-len(p.parts), str(p)))


def unmount_all(directory: Path, runner: Runner | None = None) -> list[str]:
    runner = runner or Runner()
    for _ in range(3):  # a stacked mount (the kubelet's self bind mount) shows up once per layer
        points = mounts_under(directory)
        if not points:
            return []
        for point in points:
            if runner.query(["umount", point]).returncode != 0:
                runner.query(["umount", "-l", point])
    return [f"mount {p}" for p in mounts_under(directory)]


def processes_mentioning(directory: Path | str) -> list[psutil.Process]:
    """Processes with `directory` (as a whole path, see process.mentions) in their command line."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(process.mentions(arg, Path(directory)) for arg in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _stop(cluster_dir: Path, names: list[str]) -> None:
    recorded = process.recorded(cluster_dir)
    procs = []
    for name in names:
        running = recorded.get(name)
        if running and process.alive(running):
            procs.append(psutil.Process(running.pid))
    process.terminate(procs, GRACE_SECONDS)


def _step(what: str, action: Callable[[], list[str] | None]) -> list[str]:
    """One step of the teardown; an OS error ends that step only, named among the leftovers, so the
    steps after it (mounts, bridge, cgroups, directory, machine settings) still run."""
    try:
        return action() or []
    except OSError as err:
        return [f"{what}: {err}"]


def teardown(cluster_dir: Path, node: RealNodeRecord) -> list[str]:
    dirs = node.dirs
    recorded = process.recorded(cluster_dir)
    plugins = [n for n in recorded if n.startswith(f"kubelet-plugin-{node.name}-")]
    leftovers = _step("stopping the kubelet and plugins", lambda: _stop(cluster_dir, plugins + [node.kubelet_process]))
    # kills the containers; the cgroups go below, once empty (what is left now is not a leftover yet)
    _step("killing the containers", lambda: cgroups.remove(node.id, timeout=0.5))
    leftovers += _step("stopping containerd", lambda: _stop(cluster_dir, [node.containerd_process]))
    leftovers += _step("stopping the node's processes", lambda: [
        f"{process.describe([p])} survived SIGKILL"
        for p in process.terminate(processes_mentioning(dirs.base), GRACE_SECONDS)])
    leftovers += _step("unmounting", lambda: unmount_all(dirs.base))
    leftovers += _step("deleting the bridge", lambda: network.delete_bridge(node.bridge))
    leftovers += _step("removing the cgroups", lambda: cgroups.remove(node.id))
    if not leftovers:
        shutil.rmtree(dirs.base, ignore_errors=True)
        if dirs.base.exists():
            leftovers.append(f"directory {dirs.base}")
    for path in (cluster_dir / "pids").glob(f"*-{node.name}*.json"):
        path.unlink(missing_ok=True)
    return leftovers


def teardown_all(cluster_dir: Path, cluster_data: dict) -> list[str]:
    """Tear down every real node of the cluster and release the machine settings; returns leftovers."""
    nodes = records(cluster_data)
    if not nodes:
        return []
    leftovers = []
    for node in nodes:
        leftovers += teardown(cluster_dir, node)
    leftovers += host.release(cluster_dir)
    try:
        node_root().rmdir()  # only when no other cluster's node lives there
    except OSError:
        pass
    return leftovers


def leftovers_of(node: RealNodeRecord) -> list[str]:
    """What of `node` still exists on the machine (for tests and `cluster status`)."""
    found = [f"pid {p.pid} ({' '.join(p.cmdline()[:2])})" for p in processes_mentioning(node.directory)]
    found += [f"mount {p}" for p in mounts_under(Path(node.directory))]
    if network.bridge_exists(node.bridge):
        found.append(f"bridge {node.bridge}")
    found += [f"cgroup {c}" for c in cgroups.existing(node.id)]
    if Path(node.directory).exists():
        found.append(f"directory {node.directory}")
    return found
