"""Legacy device plugins on a real node (the migration rehearsal's starting point): one host process
per extended resource, `python -m fake_devices.deviceplugin`, registered through the node's own
plugins_registry directory (the kubelet's machine-wide device-plugins directory would be shared by
every kubelet on this machine). Recorded like the cluster's other processes, so `cluster down` stops it.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import psutil

from fake_devices.deviceplugin import journal
from fake_devices.deviceplugin.plugin import socket_stem
from harness.backends.local import process
from harness.core.errors import ComponentError
from harness.core.nodelayout import RealNodeRecord

READY_TIMEOUT = 30.0


def process_name(node: RealNodeRecord, resource: str) -> str:
    return f"device-plugin-{node.name}-{socket_stem(resource)}"


def state_dir(node: RealNodeRecord, resource: str) -> Path:
    return node.dirs.plugin_state / f"device-plugin-{socket_stem(resource)}"


def argv(node: RealNodeRecord, resource: str, profile: str, pre_start_required: bool = False) -> list[str]:
    dirs = node.dirs
    return [sys.executable, "-m", "fake_devices.deviceplugin", f"--resource={resource}", f"--node={node.name}",
            f"--profile={profile}", f"--plugins-dir={dirs.plugins}", f"--registry-dir={dirs.plugins_registry}",
            f"--state-dir={state_dir(node, resource)}", *(["--pre-start-required"] if pre_start_required else [])]


def start(cluster_dir: Path, node: RealNodeRecord, resource: str, profile: str, pre_start_required: bool = False,
          timeout: float = READY_TIMEOUT) -> process.Running:
    """Start the plugin and wait for its `ready` line (its sockets serve)."""
    name = process_name(node, resource)
    log = cluster_dir / "logs" / f"{name}.log"
    offset = log.stat().st_size if log.exists() else 0  # a restarted plugin appends to the same log
    running = process.start(name, argv(node, resource, profile, pre_start_required), cluster_dir)
    deadline = time.monotonic() + timeout
    while True:
        with open(log, "rb") as handle:
            handle.seek(offset)
            if b"ready\n" in handle.read():
                return running
        if not process.alive(running):
            raise ComponentError(name, "exited during start", log_file=log, log_tail=process.tail(log))
        if time.monotonic() > deadline:
            raise ComponentError(name, f"not ready after {timeout:.0f}s", log_file=log, log_tail=process.tail(log))
        time.sleep(0.05)


def stop(cluster_dir: Path, node: RealNodeRecord, resource: str) -> None:
    """SIGTERM the plugin (its sockets go, the kubelet withdraws the devices); no-op if not running."""
    name = process_name(node, resource)
    running = process.recorded(cluster_dir).get(name)
    if running is None:
        return
    if process.alive(running):
        process.terminate([psutil.Process(running.pid)], 5.0)
    (cluster_dir / "pids" / f"{name}.json").unlink(missing_ok=True)


def calls(node: RealNodeRecord, resource: str) -> list[dict]:
    """Every call the kubelet made into the plugin (fake_devices.deviceplugin.journal)."""
    return journal.read(state_dir(node, resource) / journal.FILE_NAME)


class NodeDevicePlugins:
    """The device plugins one user (a test, the rehearsal) runs on a real node; `close()` stops them
    and removes their call journals."""

    def __init__(self, cluster_dir: Path, node: RealNodeRecord):
        self.cluster_dir, self.node = cluster_dir, node
        self._started: set[str] = set()

    @property
    def name(self) -> str:
        return self.node.name

    def run(self, resource: str, profile: str, pre_start_required: bool = False) -> None:
        self._started.add(resource)
        start(self.cluster_dir, self.node, resource, profile, pre_start_required)

    def stop(self, resource: str) -> None:
        stop(self.cluster_dir, self.node, resource)

    def calls(self, resource: str) -> list[dict]:
        return calls(self.node, resource)

    def close(self) -> None:
        for resource in sorted(self._started):
            self.stop(resource)
            shutil.rmtree(state_dir(self.node, resource), ignore_errors=True)
        self._started.clear()
