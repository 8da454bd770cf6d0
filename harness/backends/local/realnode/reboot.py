"""A real node rebooted, as far as the node's own directory holds a machine: what the kubelet and a DRA
driver's plugin meet after a power cycle (KP-RESTART-CDI, docs/contract.md: the CDI directory is a
tmpfs, so a plugin that answers a repeated Prepare from its checkpoint without writing the claim's CDI
spec again leaves the pod in CreateContainerError; kubernetes/kubernetes#141433).

What a reboot takes and what it keeps, mapped onto the node directory:
- gone: every process of the node (the kubelet, containerd and its shims, the pods' containers; the
  kubelet plugins are the caller's to stop first and start after, it started them), every mount under
  the node (pod volumes, network namespaces, container root filesystems), and what a host keeps on
  tmpfs: containerd's and runc's state (/run/containerd, /run/runc), the CDI directory (/var/run/cdi)
  and the CNI IPAM reservations of the dead pods;
- kept: what is on disk: containerd's root (images, its records of the old containers), the kubelet's
  root (its DRA checkpoint, the plugin registry, the plugins' own data and checkpoints), the node's
  configuration, its cgroups and its bridge.
Then containerd and the kubelet start again with the command lines and environment they were started
with (their pid records), and this returns once the kubelet's healthz answers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path

from harness.backends.local import process
from harness.backends.local.realnode import cgroups, kubelet, node, teardown
from harness.core.errors import HarnessError
from harness.core.nodelayout import RealNodeRecord

KILL_TIMEOUT = 15.0  # the node's containers gone after SIGKILL


def reboot(cluster_dir: Path, record: RealNodeRecord) -> None:
    """Power the node off (everything at once, no clean shutdown), empty its tmpfs places, boot it."""
    cluster_dir = Path(cluster_dir)
    kubelet_argv, kubelet_env = _recorded_command(cluster_dir, record, record.kubelet_process)
    containerd_argv, containerd_env = _recorded_command(cluster_dir, record, record.containerd_process)
    dirs = record.dirs
    # The kubelet first, so that it starts nothing again meanwhile; then the containers, containerd, its shims.
    _kill(cluster_dir, record, record.kubelet_process)
    _kill_containers(record)
    _kill(cluster_dir, record, record.containerd_process)
    survivors = process.terminate(teardown.processes_mentioning(dirs.base), 0)
    if survivors:
        raise HarnessError(f"rebooting {record.name}: {process.describe(survivors)} survived SIGKILL")
    left = teardown.unmount_all(dirs.base)
    if left:
        raise HarnessError(f"rebooting {record.name}: cannot unmount {', '.join(left)}")
    for tmpfs in (dirs.containerd_state, dirs.runc_root, dirs.cdi, dirs.cni_ipam):
        _empty(tmpfs)
    dirs.containerd_socket.unlink(missing_ok=True)  # /run/containerd: gone with the tmpfs
    started = process.start(record.containerd_process, containerd_argv, cluster_dir, containerd_env)
    node.wait_ready(lambda: _answers(dirs.containerd_socket), started, node.CONTAINERD_TIMEOUT,
                    f"containerd socket {dirs.containerd_socket}", during="boot after a reboot")
    started = process.start(record.kubelet_process, kubelet_argv, cluster_dir, kubelet_env)
    url = kubelet.health_url(record)
    node.wait_ready(lambda: node.healthy(url), started, node.KUBELET_TIMEOUT, url, during="boot after a reboot")


def _recorded_command(cluster_dir: Path, record: RealNodeRecord, name: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment overrides `name` was started with (process.start's record)."""
    path = cluster_dir / "pids" / f"{name}.json"
    try:
        data = json.loads(path.read_text())
        return list(data["argv"]), dict(data.get("env") or {})
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise HarnessError(f"cannot reboot {record.name}: no usable record of {name} in {path} ({err})") from None


def _kill(cluster_dir: Path, record: RealNodeRecord, name: str) -> None:
    """SIGKILL the recorded component `name` at once (no grace: a power cut)."""
    left = process.stop_named(cluster_dir, [name], grace_seconds=0)
    if left:
        raise HarnessError(f"rebooting {record.name}: {'; '.join(left)}")


def _kill_containers(record: RealNodeRecord) -> None:
    """SIGKILL every process in the node's cgroups (the pods' containers and pause processes) until none
    is left; the cgroups themselves stay (the kubelet finds and reuses them)."""
    deadline = time.monotonic() + KILL_TIMEOUT
    while left := cgroups.pids(record.id):
        if time.monotonic() > deadline:
            raise HarnessError(f"rebooting {record.name}: processes {sorted(left)[:10]} in its cgroups survived "
                               f"SIGKILL for {KILL_TIMEOUT:.0f}s")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


def _empty(directory: Path) -> None:
    """Remove what `directory` holds, keeping the directory (a tmpfs after boot is empty, not absent)."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(str(path))
            return True
        except OSError:
            return False
