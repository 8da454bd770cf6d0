"""Ctrl-C during `cluster up --backend kind` and during `conformance run --backend kind` leaves nothing:
no node container (running or stopped) in the engine, no docker bridge, no dockerd the harness started,
no mount, no temporary build or pytest directory, no state, no process naming the cluster; the host's
FORWARD policies as before and, once no real node holds the machine-wide record, the kubelets' sysctls.

Opt-in like test_kind_offline.py (DRA_HARNESS_KIND_E2E=1, kind on PATH or DRA_HARNESS_KIND, a machine
where the harness can provide an engine or has one); each test starts a real kind cluster (minutes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest

from harness.backends import kind
from harness.backends.kindhost import docker, hostnet
from harness.backends.local.realnode import host as machine_settings
from harness.core import paths
from harness.k8s import wait

pytestmark = [pytest.mark.integration, pytest.mark.kind_e2e]


def _why_not() -> str | None:
    if os.environ.get("DRA_HARNESS_KIND_E2E") != "1":
        return "opt-in: set DRA_HARNESS_KIND_E2E=1 (starts real kind clusters, minutes each)"
    if not (os.environ.get("DRA_HARNESS_KIND") or kind.which_with_cached_kind("kind")):
        return "kind is neither on PATH nor in the cache (dra-harness binaries install --kind)"
    return "; ".join(docker.decide(docker.detect()).problems) or None


WHY_NOT = _why_not()
UP_TIMEOUT = 1200.0
STOP_TIMEOUT = 600.0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    if os.environ.get("DRA_HARNESS_KIND"):
        env["PATH"] = str(Path(os.environ["DRA_HARNESS_KIND"]).parent) + os.pathsep + env["PATH"]
    return env


def _engine_env() -> dict[str, str] | None:
    """How to reach the engine the kind backend uses now (ours while it runs), or None when ours is stopped."""
    ours = docker.running()
    if ours is not None:
        return ours.environ()
    facts = docker.detect()
    return dict(os.environ) if facts.engine_reachable else None


def _node_containers(name: str) -> list[str]:
    env = _engine_env()
    if env is None:
        return []
    out = subprocess.run(["docker", "ps", "--all", "--format", "{{.Names}}", f"--filter=name=^{name}-"],
                         capture_output=True, text=True, env=env, timeout=60)
    return out.stdout.split()


def _stored_containers() -> set[str]:
    """Every container our dockerd's data root holds, running or not (readable while it is stopped)."""
    directory = docker.Layout.default().data_root / "containers"
    return {p.name for p in directory.iterdir()} if directory.is_dir() else set()


def _docker_bridges() -> set[str]:
    return {p.name for p in Path("/sys/class/net").iterdir() if p.name.startswith("br-") and (p / "bridge").is_dir()}


def _leftover_dirs() -> set[str]:
    cache = paths.cache_root()
    found = {str(p) for pattern in ("driver-base/build-*", "driver-base/*.partial", "kind-node/build-*",
                                    "kind-node/*.partial", "kind-node/rootfs-*.work", "driver-base/rootfs-*.work")
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
        self.bridges = _docker_bridges()
        self.dirs = _leftover_dirs()
        self.stored = _stored_containers()
        self.engine_ours = docker.Layout.default().record.exists()

    def leaks(self) -> list[str]:
        name, found = self.name, []
        if _node_containers(name):
            found.append(f"node containers: {_node_containers(name)}")
        if _stored_containers() - self.stored:
            found.append(f"containers stored in our dockerd's data root: {_stored_containers() - self.stored}")
        if _docker_bridges() - self.bridges:
            found.append(f"docker bridges: {_docker_bridges() - self.bridges}")
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
        if not machine_settings.owners():  # else the real nodes' owners restore them when they leave
            found += [f"sysctl {s}: {self.host['sysctls'].get(s)} -> {now['sysctls'].get(s)}"
                      for s in hostnet.KUBELET_SYSCTLS if now["sysctls"].get(s) != self.host["sysctls"].get(s)]
        return found


def _interrupt_when(argv: list[str], ready, what: str, log: Path) -> int:
    """Start the CLI in its own process group, send SIGINT to the group (a terminal's Ctrl-C) once
    `ready()` holds, and return its exit status."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=_env(), start_new_session=True)
    try:
        wait.until(what, lambda: ready() or proc.poll() is not None, UP_TIMEOUT, interval=1.0,
                   diagnostics=lambda: log.read_text()[-2000:])
        assert proc.poll() is None, f"the command ended before it could be interrupted:\n{log.read_text()[-3000:]}"
        os.killpg(proc.pid, signal.SIGINT)
        return proc.wait(timeout=STOP_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_ctrl_c_while_kind_creates_the_nodes_leaves_nothing(tmp_path):
    name = f"intr-{uuid.uuid4().hex[:5]}"
    before = Before(name)
    code = _interrupt_when(["cluster", "up", "--backend", "kind", "--name", name, "--config", "kind-small"],
                           lambda: len(_node_containers(name)) == 3, f"kind to create the 3 node containers of {name}",
                           tmp_path / "up.log")
    text = (tmp_path / "up.log").read_text()
    assert code == 130, text[-3000:]
    assert "interrupted" in text
    assert before.leaks() == [], text[-3000:]


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_ctrl_c_during_the_suite_on_kind_leaves_nothing_and_reports_what_finished(tmp_path):
    name = f"intr-{uuid.uuid4().hex[:5]}"
    before = Before(name)
    pytest_dirs = set(Path(tempfile.gettempdir()).glob("dra-harness-pytest-*"))
    report = tmp_path / "report"

    started: set[Path] = set()  # pytest's shared directory of our run (others' runs may make some meanwhile)

    def suite_running() -> bool:  # the vendor file is written just before pytest starts; pytest makes its dir
        if not (kind.state_dir(name) / kind.VENDOR_FILE).is_file():
            return False
        started.update(set(Path(tempfile.gettempdir()).glob("dra-harness-pytest-*")) - pytest_dirs)
        return bool(started)

    code = _interrupt_when(["conformance", "run", "--backend", "kind", "--name", name, "--report-dir", str(report)],
                           suite_running, "the conformance suite to start on the kind cluster", tmp_path / "run.log")
    text = (tmp_path / "run.log").read_text()
    assert code == 130, text[-3000:]
    assert "report (interrupted)" in text, text[-3000:]
    assert not [d for d in started if d.exists()], f"pytest's shared directory left: {started}"
    assert (report / "report.md").is_file()
    assert before.leaks() == [], text[-3000:]
