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
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass(frozen=True)
class Running:
    name: str
    pid: int
    create_time: float
    log: Path
    # Held so the exit code stays readable: subprocess reaps dropped Popen objects on its own.
    popen: subprocess.Popen | None = field(default=None, compare=False, repr=False)


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
    running = Running(name, proc.pid, created, log_path, proc)
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
    """The exit code of a component this process started and that has ended (else None)."""
    return running.popen.poll() if running.popen is not None else None


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


def stop_all(cluster_dir: Path, order: list[list[str]] = (), grace_seconds: float = 5.0) -> list[str]:
    """Stop everything of the cluster: the named components group by group in `order` (clients
    before the apiserver, the apiserver before etcd, so none spends its grace period retrying a
    server that is already gone), then whatever else is left. SIGTERM first, SIGKILL after the grace
    period. Returns descriptions of processes that could not be stopped (normally empty).
    """
    recorded_now = recorded(cluster_dir)
    for group in [*order, None]:
        if group is None:
            procs = processes_of(cluster_dir)
        else:
            procs = []
            for name in group:
                running = recorded_now.get(name)
                if running and alive(running):
                    procs.append(psutil.Process(running.pid))
        stuck = terminate(procs, grace_seconds)
        if stuck:
            return [f"pid {p.pid}" for p in stuck]
    for path in (cluster_dir / "pids").glob("*.json"):
        path.unlink(missing_ok=True)
    return []


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def terminate(procs: list[psutil.Process], grace_seconds: float) -> list[psutil.Process]:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + (grace_seconds if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            for proc in procs:  # reap our own children; others are reaped by init
                try:
                    os.waitpid(proc.pid, os.WNOHANG)
                except (ChildProcessError, OSError):
                    pass
            procs = [p for p in procs if not _gone(p)]
            if not procs:
                return []
            time.sleep(0.05)
    return procs


def tail(path: Path, lines: int = 20) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            return "\n".join(handle.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
