"""Start, track and stop the processes of a local cluster.

Each component runs in its own session (so a Ctrl-C in the terminal that ran `cluster up` does not
reach it) with its output in `logs/<name>.log`. Its pid and start time go to `pids/<name>.json`: the
start time guards against killing an unrelated process that reused the pid. Stopping also sweeps
for any process started the way `start` does it (its own session, working in the cluster's
directory) whose command line names that directory as a whole path: this catches what a killed `up`
started but never recorded. Never a substring: cluster `rel-g` must not claim the processes of
`rel-gx`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness.backends.local.health import Readiness
from harness.core import proctime
from harness.core.files import tail  # noqa: F401  (process.tail: the log of a component, for callers here)

# What may stand before or after a path inside one command-line argument (`--flag=/a,/b`, `unix:/a`).
_BEFORE = r"(?:^|(?<=[=,:;\s\"']))"
_AFTER = r"(?=$|[/,:;\s\"'])"
GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL


@dataclass(frozen=True)
class Running:
    name: str
    pid: int
    create_time: float
    log: Path
    # Held so the exit code stays readable: subprocess reaps dropped Popen objects on its own.
    popen: subprocess.Popen | None = field(default=None, compare=False, repr=False)
    # The start as the kernel counts it (proctime): what `alive` matches, immune to clock steps.
    # None in records written before it was kept; those fall back to the wall-clock start.
    started_after_boot: float | None = None
    boot_id: str = ""


def start(name: str, argv: list[str], cluster_dir: Path, env: dict[str, str] | None = None,
          ready: Readiness | None = None) -> Running:
    logs = cluster_dir / "logs"
    pids = cluster_dir / "pids"
    logs.mkdir(parents=True, exist_ok=True)
    pids.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=cluster_dir, env={**os.environ, **(env or {})}, start_new_session=True)
    return record(name, proc.pid, argv, cluster_dir, env, popen=proc, ready=ready)


def record(name: str, pid: int, argv: list[str], cluster_dir: Path, env: dict[str, str] | None = None,
           popen: subprocess.Popen | None = None, ready: Readiness | None = None) -> Running:
    """Write `pids/<name>.json` for a process started for this cluster (by `start`, or forked by another process:
    realnode/forked.py) and return it as Running."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        created = 0.0
    start_offset = proctime.started_after_boot(pid)
    running = Running(name, pid, created, cluster_dir / "logs" / f"{name}.log", popen, start_offset,
                      proctime.boot_id())
    # argv and env overrides: what the supervisor (supervisor.py) needs to start it again; `ready`: how it
    # tells the restarted process serves again.
    (cluster_dir / "pids" / f"{name}.json").write_text(json.dumps(
        {"pid": pid, "createTime": created, "startedAfterBoot": start_offset, "bootId": proctime.boot_id(),
         "argv": argv, "env": env or {}, "ready": (ready or Readiness()).as_record()}))
    return running


def recorded(cluster_dir: Path) -> dict[str, Running]:
    result = {}
    for path in sorted((cluster_dir / "pids").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            fields = identity_fields(data)
            if not fields["pid"]:
                continue
            result[path.stem] = Running(path.stem, **{**fields, "log": cluster_dir / "logs" / f"{path.stem}.log"})
        except (OSError, ValueError):
            continue
    return result


identity = proctime.identity  # process.identity(): for this backend's records, as before


def identity_fields(data: dict) -> dict:
    """`identity()` read back as Running's fields (a malformed entry names no process)."""
    try:
        offset = data.get("startedAfterBoot")
        return {"pid": int(data["pid"]), "create_time": float(data["createTime"]), "log": Path(),
                "started_after_boot": None if offset is None else float(offset), "boot_id": str(data.get("bootId") or "")}
    except (KeyError, TypeError, ValueError, AttributeError):
        return {"pid": 0, "create_time": 0.0, "log": Path()}


def alive(running: Running) -> bool:
    if running.pid <= 0:
        return False
    if running.popen is not None:  # our own child: its pid cannot be reused before we reap it
        return running.popen.poll() is None
    return proctime.is_running(running.pid, running.create_time, running.started_after_boot, running.boot_id)


def exit_code(running: Running) -> int | None:
    """The exit code of a component this process started and that has ended (else None)."""
    return running.popen.poll() if running.popen is not None else None


def mentions(arg: str, directory: Path) -> bool:
    """Whether a command-line argument names `directory` or a path below it: the directory must be a
    whole path (not `/x/clusters/rel-gx` for `/x/clusters/rel-g`, not `/other/x/clusters/rel-g`)."""
    return re.search(_BEFORE + re.escape(os.path.abspath(directory)) + _AFTER, arg) is not None


def _started_like_a_component(proc: psutil.Process, cluster_dir: Path) -> bool:
    """Started by `start` for this cluster: a session leader working in the cluster directory. A
    user's `tail -f <cluster>/logs/...` or `kubectl --kubeconfig <cluster>/kubeconfig` is neither."""
    directory = os.path.abspath(cluster_dir)
    try:
        return os.getsid(proc.pid) == proc.pid and proc.cwd() in (directory, f"{directory} (deleted)")
    except (OSError, psutil.Error):
        return False


def processes_of(cluster_dir: Path) -> list[psutil.Process]:
    """Every live process started for this cluster: the recorded ones (pid and start time), any
    started like a component that names its directory in an argument, and all their children."""
    found: dict[int, psutil.Process] = {}
    for running in recorded(cluster_dir).values():
        if alive(running):
            found[running.pid] = psutil.Process(running.pid)
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid == os.getpid() or proc.pid in found:
                continue
            if any(mentions(arg, cluster_dir) for arg in proc.info["cmdline"] or []) \
                    and _started_like_a_component(proc, cluster_dir):
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


def describe(procs: list[psutil.Process], limit: int = 5) -> str:
    """`pid N (name), ...` for a message, at most `limit` of them."""
    parts = []
    for proc in procs[:limit]:
        try:
            parts.append(f"pid {proc.pid} ({proc.name()})")
        except psutil.Error:
            parts.append(f"pid {proc.pid}")
    return ", ".join(parts) + (f" and {len(procs) - limit} more" if len(procs) > limit else "")


def stop_named(cluster_dir: Path, names: Sequence[str], grace_seconds: float = GRACE_SECONDS) -> list[str]:
    """Stop just these recorded components (SIGTERM, SIGKILL after the grace period); their pid files go."""
    recorded_now = recorded(cluster_dir)
    procs = []
    for name in names:
        if name in recorded_now and alive(recorded_now[name]):
            try:
                procs.append(psutil.Process(recorded_now[name].pid))
            except psutil.NoSuchProcess:
                continue
    stuck = terminate(procs, grace_seconds)
    if stuck:
        return [f"{describe([p])} survived SIGKILL" for p in stuck]
    for name in names:
        (cluster_dir / "pids" / f"{name}.json").unlink(missing_ok=True)
    return []


def stop_all(cluster_dir: Path, order: Sequence[list[str]] = (), grace_seconds: float = GRACE_SECONDS) -> list[str]:
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
            return [f"{describe([p])} survived SIGKILL" for p in stuck]
    for path in (cluster_dir / "pids").glob("*.json"):
        path.unlink(missing_ok=True)
    return []


def _task_states(pid: int) -> list[str]:
    """The state letter of every thread of `pid` (empty when it is gone)."""
    states = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                states.append(handle.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # this thread just went
    return states


def _gone(proc: psutil.Process) -> bool:
    """Gone for good: no such process, or a zombie all of whose threads have exited too. The main
    thread of a multi-threaded process (every Go binary) turns zombie first while the other threads
    are still exiting, and those still hold its open files: its listening sockets close only when
    the last thread is through. Judging by the main thread alone made `cluster down` see a port
    "still listening" right after a component was stopped."""
    try:
        if proc.status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return True
    return all(state in "ZXx" for state in _task_states(proc.pid))


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
