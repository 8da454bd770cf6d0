"""The fake driver's kubelet plugin on a real node: one host process per driver name.

The plugin registers through the kubelet's plugins_registry directory and writes CDI specs where
this node's containerd reads them. It runs as a host process (not a pod): the node has no image
with Python in it, and a host process needs no image at all. It is recorded like the cluster's other
processes, so `cluster down` stops it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from harness.backends.local import process
from harness.backends.local.realnode.layout import RealNodeRecord
from harness.errors import ComponentError

READY_TIMEOUT = 30.0


def argv(node: RealNodeRecord, driver: str, kubeconfig: Path, instance: str | None, namespace: str | None,
         health_interval: float = 10.0) -> list[str]:
    dirs = node.dirs
    args = [sys.executable, "-m", "fake_devices.kubeletplugin", f"--driver={driver}", f"--node={node.name}",
            f"--kubeconfig={kubeconfig}", f"--plugins-dir={dirs.plugins}", f"--registry-dir={dirs.plugins_registry}",
            f"--cdi-dir={dirs.cdi}", f"--state-dir={dirs.plugin_state / driver}",
            f"--health-interval={health_interval}"]
    if instance:
        args.append(f"--instance={instance}")
    if namespace:
        args.append(f"--namespace={namespace}")
    return args


def start(cluster_dir: Path, node: RealNodeRecord, driver: str, kubeconfig: Path, instance: str | None = None,
          namespace: str | None = None, timeout: float = READY_TIMEOUT) -> process.Running:
    """Start the plugin for `driver` and wait for its `ready` line (both sockets serve)."""
    name = node.plugin_process(driver)
    log = cluster_dir / "logs" / f"{name}.log"
    offset = log.stat().st_size if log.exists() else 0  # a restarted plugin appends to the same log
    running = process.start(name, argv(node, driver, kubeconfig, instance, namespace), cluster_dir)
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


def stop(cluster_dir: Path, node: RealNodeRecord, driver: str, kill: bool = False) -> None:
    """Stop the plugin (SIGTERM, or SIGKILL to simulate a crash); its checkpoint stays."""
    import psutil

    name = node.plugin_process(driver)
    running = process.recorded(cluster_dir).get(name)
    if running is None:
        return
    if process.alive(running):
        proc = psutil.Process(running.pid)
        if kill:
            proc.kill()
        process.terminate([proc], 0.0 if kill else 5.0)
    (cluster_dir / "pids" / f"{name}.json").unlink(missing_ok=True)


class NodePlugins:
    """The kubelet plugins one user (a test, a CLI command) runs on a real node; `close()` stops them."""

    def __init__(self, cluster_dir: Path, node: RealNodeRecord, kubeconfig: Path):
        self.cluster_dir, self.node, self.kubeconfig = cluster_dir, node, kubeconfig
        self._started: dict[str, tuple[str | None, str | None]] = {}

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def cdi_dir(self) -> Path:
        return self.node.dirs.cdi

    def run(self, driver: str, instance: str | None = None, namespace: str | None = None) -> None:
        start(self.cluster_dir, self.node, driver, self.kubeconfig, instance, namespace)
        self._started[driver] = (instance, namespace)

    def run_for(self, fake_driver) -> tuple[str, ...]:
        """Run a plugin for every driver name of a fake_devices FakeDriver; returns the names."""
        config = fake_driver.config
        for driver in fake_driver.drivers.all():
            self.run(driver, config.instance, config.namespace)
        return tuple(fake_driver.drivers.all())

    def stop(self, driver: str, kill: bool = False) -> None:
        stop(self.cluster_dir, self.node, driver, kill=kill)

    def restart(self, driver: str, kill: bool = True) -> None:
        """Stop (by default: crash) and start the plugin again, as a driver upgrade or crash would."""
        instance, namespace = self._started[driver]
        self.stop(driver, kill=kill)
        self.run(driver, instance, namespace)

    def cdi_specs(self, driver: str | None = None) -> list[Path]:
        prefix = f"{driver}-" if driver else ""
        return sorted(p for p in self.cdi_dir.glob(f"{prefix}*.json"))

    def close(self) -> None:
        for driver in list(self._started):
            self.stop(driver)
        self._started.clear()
