"""A Docker engine for the kind backend: the machine's own, or one the harness starts where there is none.

Each condition is detected separately and turned into one decision (enginechoice.py: `detect()`, with
every input injectable so the tests need no Docker, and `decide()`); this module carries it out:

- **use the machine's engine** as it is, changing nothing (the ordinary case, e.g. GitHub runners);
- **start our own dockerd** (`--iptables=false --ip-forward=false`, so the FORWARD policy and
  ip_forward stay as they are, and no `docker0` bridge), with its own pidfile, data root, exec root,
  config file and socket under `<state>/kind-docker/`; our commands reach it through DOCKER_HOST in
  their environment only;
- first **install Debian's `docker.io`** with apt-get when dockerd is missing and we are root on a
  machine with apt-get (no service is started by the package: see `install_docker`);
- **register the runc wrapper** as dockerd's default runtime when the capability bounding set lacks
  capabilities `--privileged` asks for (runc_wrapper.py drops exactly those);
- or say why none of that is possible.

Clusters register as users of our dockerd (`acquire`/`release`); the last one to leave stops it and
restores the host settings recorded before it started (hostnet.py). An engine the harness did not
start is never stopped. A user whose registering process is gone and that is no longer in use (the
caller says how to tell: for kind, no cluster state) was left by a killed run and is forgotten.
"""

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
from harness.backends.kind.host.enginechoice import Decision, Facts, decide, detect
from harness.backends.local import process
from harness.backends.local.realnode import host as machine_settings
from harness.backends.local.realnode import inotify, teardown
from harness.core import paths
from harness.core.errors import HarnessError
from harness.core.files import write_atomic
from harness.core.locking import file_lock
from harness.core.progress import Reporter

DEBIAN_PACKAGE = "docker.io"
RUNTIME_NAME = "dra-harness-runc"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
SETTLE_SECONDS = 5.0  # no new container for this long: the daemon has served its last interrupted `docker run`
SETTLE_TIMEOUT = 120.0
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its terminating NUL
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
RUNTIME_DIRS = (Path("/run/containerd/s"), Path("/run/containerd"))
ENGINE_PROCESSES = ("dockerd", "containerd", "docker-proxy")

Run = Callable[..., subprocess.CompletedProcess]


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


# --- the engine the backend uses ---------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    """How our commands reach the engine: the docker CLI and the environment to run it with."""

    docker: str
    env: dict[str, str]  # {} for the machine's engine; {"DOCKER_HOST": ...} for ours
    owned: bool  # started by the harness (stopped by the last `release`)

    def environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}


def dockerd_argv(dockerd: str, layout: Layout, wrapper: Path | None) -> list[str]:
    argv = [dockerd, f"--host={layout.host}", f"--pidfile={layout.pidfile}", f"--data-root={layout.data_root}",
            f"--exec-root={layout.exec_root}", f"--config-file={layout.config_file}",
            # Leave the host's firewall and forwarding alone; kind's node containers share one
            # bridge network and the API server is published by docker-proxy, neither needs them.
            "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--bridge=none"]
    if wrapper is not None:
        argv += [f"--add-runtime={RUNTIME_NAME}={wrapper}", f"--default-runtime={RUNTIME_NAME}"]
    return argv


def _load(layout: Layout) -> dict:
    try:
        return json.loads(layout.record.read_text())
    except (OSError, ValueError):
        return {}


def _save(layout: Layout, record: dict) -> None:
    write_atomic(layout.record, json.dumps(record, indent=1, sort_keys=True))


def _alive(pid: int | None) -> bool:
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


def _ours_running(layout: Layout, record: dict, cli: str, run: Run) -> bool:
    if not _alive(record.get("pid")):
        return False
    out = run([cli, f"--host={layout.host}", "info", "--format", "{{.ServerVersion}}"], timeout=30)
    return out.returncode == 0


def running(layout: Layout | None = None) -> Engine | None:
    """Our dockerd when it runs (for a look, e.g. `cluster status`; registers no user)."""
    layout = layout or Layout.default()
    record = _load(layout)
    cli = record.get("cli") or shutil.which("docker")
    if record and cli and _ours_running(layout, record, cli, _run):
        return Engine(cli, {"DOCKER_HOST": layout.host}, owned=True)
    return None


def _found(path: str | None, what: str) -> str:
    """A tool's path, or a clear error when it is missing (e.g. a package install that did not bring it)."""
    if not path:
        raise HarnessError(f"the kind backend needs {what}, and it is not on this machine",
                           hint=f"install Docker Engine (Debian: apt-get install {DEBIAN_PACKAGE})")
    return path


InUse = Callable[[str], bool]  # whether a user still needs the engine, whatever process registered it


def _always_in_use(user: str) -> bool:
    return True


def _forget_stale(record: dict, acting: str, in_use: InUse, reporter: Reporter) -> None:
    """Drop the users a killed run left: registering process gone and not `in_use` (e.g. a SIGKILL
    while the node image was built, before the cluster had state: no `cluster down` could release it,
    and our dockerd would run for good)."""
    registered = record.get("registeredBy", {})
    kept = []
    for user in record.get("users", []):
        owner = process.Running(name=user, **process.identity_fields(registered.get(user, {})))
        if user == acting or process.alive(owner) or in_use(user):
            kept.append(user)
        else:
            reporter.info(f"forgetting {user!r} as a user of the harness's dockerd: the run that registered it "
                          "is gone and left nothing in use")
            registered.pop(user, None)
    record["users"], record["registeredBy"] = kept, registered


def acquire(user: str, reporter: Reporter | None = None, *, layout: Layout | None = None,
            facts: Facts | None = None, in_use: InUse = _always_in_use) -> Engine:
    """An engine for `user` (a kind cluster name, or "node-image"); ours is started if needed."""
    reporter = reporter or Reporter(quiet=True)
    layout = layout or Layout.default()
    facts = facts or detect()
    decision = decide(facts)
    if decision.use_existing:
        return Engine(_found(facts.cli, "the docker CLI"), {}, owned=False)
    if decision.problems:
        raise HarnessError("the kind backend has no Docker engine: " + "; ".join(decision.problems),
                           hint="install and start Docker Engine, or run as root on Debian/Ubuntu so the harness "
                                "can install docker.io and start its own dockerd")
    if len(str(layout.socket)) > SOCKET_PATH_MAX:
        raise HarnessError(f"{layout.socket}: the socket path is {len(str(layout.socket))} bytes, longer than a "
                           f"unix socket allows ({SOCKET_PATH_MAX})", hint="set DRA_HARNESS_STATE_DIR to a shorter path")
    layout.root.mkdir(parents=True, exist_ok=True)
    with file_lock(layout.lock):
        record = _load(layout)
        if decision.install:
            with reporter.step(f"installing {DEBIAN_PACKAGE} with apt-get (no engine on this machine)"):
                install_docker()
            facts = detect()
        cli = _found(facts.cli or shutil.which("docker"), "the docker CLI")
        if not (record and _ours_running(layout, record, cli, _run)):
            with reporter.step(Decision(start_own=True, wrapper_drops=decision.wrapper_drops).describe()):
                try:
                    record = _start(layout, facts, decision)
                except BaseException:
                    layout.record.unlink(missing_ok=True)  # _start stopped it: nothing left to release
                    raise
        _forget_stale(record, user, in_use, reporter)
        record["users"] = sorted(set(record["users"]) | {user})
        record["registeredBy"][user] = process.identity()
        _save(layout, record)
    return Engine(cli, {"DOCKER_HOST": layout.host}, owned=True)


def room_for_nodes(nodes: int, *, own: bool, layout: Layout | None = None) -> tuple[list[str], list[str]]:
    """inotify room for `nodes` kind node containers, whose kubelets, containerds and systemds run as root
    whoever runs the harness. With our own dockerd the limits are raised under the machine-wide record it
    holds, and restored with the other host settings when it stops: returns (what was raised, []). An
    engine the harness did not start keeps its host as it is: returns ([], what is short and how to
    raise it), for a warning."""
    if own:
        layout = layout or Layout.default()
        return machine_settings.acquire(layout.root, nodes, footprint=inotify.KIND_NODE, uid=0), []
    return [], [short.describe(f"{nodes} kind nodes") for short in
                inotify.shortfalls(nodes, footprint=inotify.KIND_NODE, uid=0)]


def release(user: str, reporter: Reporter | None = None, *, layout: Layout | None = None,
            in_use: InUse = _always_in_use) -> list[str]:
    """Unregister `user`; the last user stops our dockerd and restores the host. Returns what could not
    be restored. Does nothing for an engine the harness did not start."""
    reporter = reporter or Reporter(quiet=True)
    layout = layout or Layout.default()
    if not layout.record.is_file():
        return []
    with file_lock(layout.lock):
        record = _load(layout)
        _forget_stale(record, user, in_use, reporter)
        record["users"] = [u for u in record["users"] if u != user]
        record["registeredBy"].pop(user, None)
        if record["users"]:
            _save(layout, record)
            return []
        with reporter.step("stopping the harness's dockerd and restoring the host settings it changed"):
            problems = _stop(layout, record)
        layout.record.unlink(missing_ok=True)
        return problems


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


def _start(layout: Layout, facts: Facts, decision: Decision) -> dict:
    stale = clear_stale(layout)
    if stale:
        raise HarnessError(f"a dockerd of an earlier run left state under {layout.root} that could not be removed: "
                           + "; ".join(stale), hint="stop that process or unmount those paths, then run again")
    for directory in (layout.data_root, layout.exec_root):
        directory.mkdir(parents=True, exist_ok=True)
    layout.config_file.write_text("{}\n")  # never the machine's /etc/docker/daemon.json
    wrapper = None
    if decision.wrapper_drops:
        wrapper = wrapper_file.write(layout.wrapper, sys.executable, _found(facts.runc, "runc"), decision.wrapper_drops,
                                     clamp_oom=False)
    baseline = hostnet.snapshot()
    # containerd shims put their sockets under /run/containerd/s whatever their configuration says.
    baseline["runtimeDirs"] = [str(d) for d in RUNTIME_DIRS if d.exists()]
    argv = dockerd_argv(_found(facts.dockerd or shutil.which("dockerd"), "dockerd"), layout, wrapper)
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
    _save(layout, record)  # before waiting: an interrupted start is still stopped by release()
    deadline = time.monotonic() + START_TIMEOUT
    cli = _found(facts.cli or shutil.which("docker"), "the docker CLI")
    while True:
        if proc.poll() is not None:
            problems = _stop(layout, record)
            raise HarnessError(f"dockerd exited with {proc.returncode} while starting" +
                               (f" (and: {'; '.join(problems)})" if problems else ""), log_file=layout.log)
        if _run([cli, f"--host={layout.host}", "info", "--format", "{{.ServerVersion}}"], timeout=10).returncode == 0:
            break
        if time.monotonic() > deadline:
            _stop(layout, record)
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


def _stop(layout: Layout, record: dict) -> list[str]:
    pid = record.get("pid")
    if not isinstance(pid, int):
        return [f"{layout.record}: no dockerd pid recorded; nothing to stop"]
    problems = _remove_containers(layout, record.get("cli")) if _alive(pid) else []
    problems += _remove_networks(layout, record.get("cli")) if _alive(pid) else []
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)  # dockerd stops its containers and its containerd
        deadline = time.monotonic() + STOP_TIMEOUT
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
            while _alive(pid):
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


def install_docker(run: Run = _run, policy_rc_d: Path = POLICY_RC_D) -> None:
    """apt-get install docker.io, without letting the package start docker or containerd services
    (we start our own dockerd; a system one would change the host and keep running): a policy-rc.d
    that refuses every start is in place during the install, unless the machine already has one."""
    ours = not policy_rc_d.exists()
    if ours:
        policy_rc_d.write_text("#!/bin/sh\n# dra-harness: no service starts while docker.io installs\nexit 101\n")
        policy_rc_d.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", DEBIAN_PACKAGE]
        out = run(argv, timeout=900, env=env)
        if out.returncode != 0:
            run(["apt-get", "update", "-q"], timeout=600, env=env)
            out = run(argv, timeout=900, env=env)
        if out.returncode != 0:
            raise HarnessError(f"`apt-get install {DEBIAN_PACKAGE}` exited with {out.returncode}: "
                               + "\n".join((out.stderr or out.stdout).strip().splitlines()[-10:]))
    finally:
        if ours:
            policy_rc_d.unlink(missing_ok=True)
