"""Start, track and stop the processes of a local cluster.

Each component runs in its own session (so a Ctrl-C in the terminal that ran `cluster up` does not
reach it) with its output in `logs/<name>.log`. Its pid and start time go to `pids/<name>.json`: the
start time guards against killing an unrelated process that reused the pid. Stopping also sweeps
for any process whose command line mentions the cluster's directory, which catches what a killed
`up` started but never recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class Running:
    name: str
    pid: int
    create_time: float
    log: Path


def start(name: str, argv: list[str], cluster_dir: Path, env: dict[str, str] | None = None) -> Running:
    logs = cluster_dir / "logs"
    pids = cluster_dir / "pids"
    logs.mkdir(parents=True, exist_ok=True)
    pids.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=cluster_dir, env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        created = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        created = 0.0
    running = Running(name, proc.pid, created, log_path)
    (pids / f"{name}.json").write_text(json.dumps({"pid": proc.pid, "createTime": created, "argv": argv}))
    return running


def recorded(cluster_dir: Path) -> dict[str, Running]:
    result = {}
    for path in sorted((cluster_dir / "pids").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            result[path.stem] = Running(path.stem, int(data["pid"]), float(data["createTime"]),
                                        cluster_dir / "logs" / f"{path.stem}.log")
        except (OSError, ValueError, KeyError):
            continue
    return result


def alive(running: Running) -> bool:
    try:
        proc = psutil.Process(running.pid)
        return abs(proc.create_time() - running.create_time) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def exit_code(running: Running) -> int | None:
    """Reap a child that died, returning its exit code (None if it is not our child or still running)."""
    try:
        pid, status = os.waitpid(running.pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if pid else None


def processes_of(cluster_dir: Path) -> list[psutil.Process]:
    """Every live process started for this cluster: recorded ones plus any that mention its directory."""
    found: dict[int, psutil.Process] = {}
    for running in recorded(cluster_dir).values():
        if alive(running):
            found[running.pid] = psutil.Process(running.pid)
    marker = str(cluster_dir)
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != os.getpid() and any(marker in arg for arg in proc.info["cmdline"] or []):
                found[proc.pid] = proc
        except psutil.Error:
            continue
    # Children too (a component may fork helpers).
    for proc in list(found.values()):
        try:
            for child in proc.children(recursive=True):
                found[child.pid] = child
        except psutil.Error:
            continue
    return list(found.values())


def stop_all(cluster_dir: Path, grace_seconds: float = 10.0) -> list[str]:
    """SIGTERM everything of the cluster, SIGKILL what is left after the grace period.

    Returns descriptions of processes that could not be stopped (normally empty).
    """
    procs = processes_of(cluster_dir)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, still = psutil.wait_procs(procs, timeout=grace_seconds)
    for proc in still:
        try:
            proc.kill()
        except psutil.Error:
            pass
    _, stuck = psutil.wait_procs(still, timeout=5)
    for path in (cluster_dir / "pids").glob("*.json"):
        path.unlink(missing_ok=True)
    # Reap any of our own children so no zombie is left behind.
    for proc in procs:
        try:
            os.waitpid(proc.pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass
    return [f"pid {p.pid}" for p in stuck]


def tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            return "\n".join(handle.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_gone(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False
