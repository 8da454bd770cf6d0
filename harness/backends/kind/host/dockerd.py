"""The harness's own dockerd: its files under `<state>/kind-docker/` (`Layout`, the engine record), its
command line, starting it as a detached daemon, and stopping it with what it leaves behind (containers,
networks, mounts, the host settings it changed)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.backends.commands import run_quiet
from harness.backends.kind.host import hostnet, wrapper_file
from harness.backends.kind.host.dockerinstall import Run, found
from harness.backends.kind.host.enginechoice import Decision, Facts
from harness.backends.local import process
from harness.backends.local.realnode import host as machine_settings
from harness.backends.local.realnode import teardown
from harness.core import paths
from harness.core.errors import HarnessError
from harness.core.files import write_atomic

RUNTIME_NAME = "dra-harness-runc"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
SETTLE_SECONDS = 5.0  # no new container for this long: the daemon has served its last interrupted `docker run`
SETTLE_TIMEOUT = 120.0
RUNTIME_DIRS = (Path("/run/containerd/s"), Path("/run/containerd"))
ENGINE_PROCESSES = ("dockerd", "containerd", "docker-proxy")


_run = run_quiet  # short queries: never raises; a missing program or a timeout is 127 / 124


# --- where our own engine lives ----------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    root: Path

    @classmethod
    def default(cls) -> Layout:
        return cls(paths.state_root() / "kind-docker")

    socket = property(lambda self: self.root / "docker.sock")
    pidfile = property(lambda self: self.root / "dockerd.pid")
    data_root = property(lambda self: self.root / "data")
    exec_root = property(lambda self: self.root / "exec")
    config_file = property(lambda self: self.root / "daemon.json")
    log = property(lambda self: self.root / "dockerd.log")
    wrapper = property(lambda self: self.root / "runc-wrapper")
    record = property(lambda self: self.root / "engine.json")
    lock = property(lambda self: self.root / "engine.lock")
    # dockerd's identity where the machine-wide host-settings record looks for an owner's live processes
    pid_record = property(lambda self: self.root / "pids" / "dockerd.json")

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"


def dockerd_argv(dockerd: str, layout: Layout, wrapper: Path | None) -> list[str]:
    argv = [dockerd, f"--host={layout.host}", f"--pidfile={layout.pidfile}", f"--data-root={layout.data_root}",
            f"--exec-root={layout.exec_root}", f"--config-file={layout.config_file}",
            # Leave the host's firewall and forwarding alone; kind's node containers share one
            # bridge network and the API server is published by docker-proxy, neither needs them.
            "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--bridge=none"]
    if wrapper is not None:
        argv += [f"--add-runtime={RUNTIME_NAME}={wrapper}", f"--default-runtime={RUNTIME_NAME}"]
    return argv


def load_record(layout: Layout) -> dict:
    try:
        return json.loads(layout.record.read_text())
    except (OSError, ValueError):
        return {}


def save_record(layout: Layout, record: dict) -> None:
    write_atomic(layout.record, json.dumps(record, indent=1, sort_keys=True))


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def ours_running(layout: Layout, record: dict, cli: str, run: Run) -> bool:
    if not alive(record.get("pid")):
        return False
    out = run([cli, f"--host={layout.host}", "info", "--format", "{{.ServerVersion}}"], timeout=30)
    return out.returncode == 0


def clear_stale(layout: Layout) -> list[str]:
    """What a killed dockerd of ours left under our directory, removed: its processes (dockerd, its
    containerd and shims naming our directory) and its mounts. Call it under the engine lock with no
    dockerd of ours running by the record. dockerd bind-mounts its data root onto itself and removes
    that mount only on a clean shutdown; the next dockerd finds the root already a mount point and
    leaves it for good, so one killed dockerd left the mount behind every later run. The containers'
    overlays and network namespaces under the data and exec roots stay the same way. Returns what is left."""
    for name, proc in _engine_processes(layout):
        try:
            proc.kill()
            proc.wait(timeout=10)
        except (psutil.Error, OSError):
            continue
    left = [f"{name} (pid {proc.pid}) naming {layout.root} survived SIGKILL" for name, proc in _engine_processes(layout)]
    return left + teardown.unmount_all(layout.root)


def _engine_processes(layout: Layout) -> list[tuple[str, psutil.Process]]:
    """The engine's own processes naming our directory (never, say, a user's `tail -f` of our log)."""
    found = []
    for proc in teardown.processes_mentioning(layout.root):
        try:
            name = proc.name()
        except psutil.Error:
            continue
        if name in ENGINE_PROCESSES or name.startswith("containerd-shim"):
            found.append((name, proc))
    return found


def start(layout: Layout, facts: Facts, decision: Decision) -> dict:
    stale = clear_stale(layout)
    if stale:
        raise HarnessError(f"a dockerd of an earlier run left state under {layout.root} that could not be removed: "
                           + "; ".join(stale), hint="stop that process or unmount those paths, then run again")
    for directory in (layout.data_root, layout.exec_root):
        directory.mkdir(parents=True, exist_ok=True)
    layout.config_file.write_text("{}\n")  # never the machine's /etc/docker/daemon.json
    wrapper = None
    if decision.wrapper_drops:
        wrapper = wrapper_file.write(layout.wrapper, sys.executable, found(facts.runc, "runc"), decision.wrapper_drops,
                                     clamp_oom=False)
    baseline = hostnet.snapshot()
    # containerd shims put their sockets under /run/containerd/s whatever their configuration says.
    baseline["runtimeDirs"] = [str(d) for d in RUNTIME_DIRS if d.exists()]
    argv = dockerd_argv(found(facts.dockerd or shutil.which("dockerd"), "dockerd"), layout, wrapper)
    layout.socket.unlink(missing_ok=True)
    # The machine-wide record (shared with the local backend's real nodes): the kubelets inside kind's
    # privileged node containers write the same non-namespaced sysctls theirs do. Registered before
    # dockerd starts; the last owner to leave, real node or our dockerd, restores the baseline once.
    machine_settings.acquire(layout.root)
    with open(layout.log, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    layout.pid_record.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(layout.pid_record, json.dumps(_identity(proc.pid)))  # the record's owner lives while dockerd does
    record = {"startedBy": "dra-harness", "pid": proc.pid, "argv": argv, "hostBaseline": baseline, "cli": facts.cli,
              "wrapperDrops": list(decision.wrapper_drops), "users": [], "registeredBy": {}}
    save_record(layout, record)  # before waiting: an interrupted start is still stopped by release()
    deadline = time.monotonic() + START_TIMEOUT
    cli = found(facts.cli or shutil.which("docker"), "the docker CLI")
    while True:
        if proc.poll() is not None:
            problems = stop(layout, record)
            raise HarnessError(f"dockerd exited with {proc.returncode} while starting" +
                               (f" (and: {'; '.join(problems)})" if problems else ""), log_file=layout.log)
        if _run([cli, f"--host={layout.host}", "info", "--format", "{{.ServerVersion}}"], timeout=10).returncode == 0:
            break
        if time.monotonic() > deadline:
            stop(layout, record)
            raise HarnessError(f"dockerd did not answer on {layout.socket} within {START_TIMEOUT:.0f}s",
                               log_file=layout.log)
        time.sleep(0.3)
    changed = hostnet.changes(baseline, hostnet.snapshot())
    if changed:  # should not happen with --iptables=false --ip-forward=false; put it back at once
        record["changedAtStart"] = changed
        hostnet.restore(baseline)
    return record


def _identity(pid: int) -> dict:
    return process.identity(pid)


def remove_containers(docker: list[str], filters: tuple[str, ...] = (), *, run: Run = _run,
                      clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                      settle: float = SETTLE_SECONDS, timeout: float = SETTLE_TIMEOUT) -> list[str]:
    """Remove the containers matching `filters` (`docker` is the CLI with its --host), and go on until
    none has appeared for `settle` seconds: a `docker run` whose client was interrupted is still served
    by the daemon (measured: Ctrl-C during `kind create cluster` left three "Created" node containers
    whose creation time followed the clean-up's first removal). Returns what could not be removed."""
    deadline = clock() + timeout
    quiet_since: float | None = None
    while True:
        listing = run([*docker, "ps", "--all", "--quiet", *(f"--filter={f}" for f in filters)], timeout=60)
        if listing.returncode != 0:
            return [f"docker ps: {(listing.stderr or '').strip()[-300:]}"]
        ids = listing.stdout.split()
        if ids:
            out = run([*docker, "rm", "--force", "--volumes", *ids], timeout=300)
            if out.returncode != 0:
                return [f"docker rm {' '.join(ids)}: {(out.stderr or '').strip()[-300:]}"]
            quiet_since = None
        else:
            quiet_since = clock() if quiet_since is None else quiet_since
            if clock() - quiet_since >= settle:
                return []
        if clock() >= deadline:
            return [f"containers kept appearing for {timeout:.0f}s ({' '.join(filters) or 'all'}); last: "
                    f"{' '.join(ids) or 'none'}"]
        sleep(1.0)


def _remove_containers(layout: Layout, cli: str | None) -> list[str]:
    """Remove every container of our dockerd once its last user has left: none may outlive the users."""
    # settle=0: the users' own clean-ups waited for interrupted `docker run`s; this pass is a backstop
    return remove_containers([cli, f"--host={layout.host}"], settle=0) if cli else []


def _remove_networks(layout: Layout, cli: str | None) -> list[str]:
    """Remove the networks made in our dockerd (kind's): their bridges outlive dockerd otherwise."""
    if not cli:
        return []
    listing = _run([cli, f"--host={layout.host}", "network", "ls", "--format", "{{.Name}} {{.Driver}}"], timeout=30)
    problems = []
    for line in listing.stdout.splitlines() if listing.returncode == 0 else []:
        name, _, driver = line.partition(" ")
        if driver == "bridge" and name not in ("bridge", "host", "none"):
            out = _run([cli, f"--host={layout.host}", "network", "rm", name], timeout=60)
            if out.returncode != 0:
                problems.append(f"docker network {name}: {(out.stderr or '').strip()}")
    return problems


def stop(layout: Layout, record: dict) -> list[str]:
    pid = record.get("pid")
    if not isinstance(pid, int):
        return [f"{layout.record}: no dockerd pid recorded; nothing to stop"]
    problems = _remove_containers(layout, record.get("cli")) if alive(pid) else []
    problems += _remove_networks(layout, record.get("cli")) if alive(pid) else []
    if alive(pid):
        os.kill(pid, signal.SIGTERM)  # dockerd stops its containers and its containerd
        deadline = time.monotonic() + STOP_TIMEOUT
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)
            while alive(pid):
                time.sleep(0.1)
    baseline = record.get("hostBaseline", {})
    # The FORWARD policies (dockerd's own doing); the sysctls are the machine-wide record's, restored
    # when its last owner leaves (now, unless real nodes of the local backend still run).
    problems += hostnet.restore(baseline, sysctls=())
    layout.pid_record.unlink(missing_ok=True)
    problems += clear_stale(layout)  # a dockerd that had to be killed left its mounts (a clean stop leaves none)
    problems += machine_settings.release(layout.root)
    existed = set(baseline.get("runtimeDirs", [str(d) for d in RUNTIME_DIRS]))
    for directory in RUNTIME_DIRS:  # innermost first; only empty ones that were not there before
        if str(directory) not in existed and directory.is_dir():
            try:
                directory.rmdir()
            except OSError:
                problems.append(f"{directory} is not empty")
    for leftover in (layout.socket, layout.pidfile):
        leftover.unlink(missing_ok=True)
    return problems
