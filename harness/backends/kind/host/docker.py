"""A Docker engine for the kind backend: the machine's own, or one the harness starts where there is none.

Each condition is detected separately and turned into one decision (enginechoice.py: `detect()`, with
every input injectable so the tests need no Docker, and `decide()`); this module carries it out:

- **use the machine's engine** as it is, changing nothing (the ordinary case, e.g. GitHub runners);
- **start our own dockerd** (`--iptables=false --ip-forward=false`, so the FORWARD policy and
  ip_forward stay as they are, and no `docker0` bridge), with its own pidfile, data root, exec root,
  config file and socket under `<state>/kind-docker/`; our commands reach it through DOCKER_HOST in
  their environment only;
- first **install Debian's `docker.io`** with apt-get when dockerd is missing and we are root on a
  machine with apt-get (no service is started by the package: see `dockerinstall.install_docker`);
- **register the runc wrapper** as dockerd's default runtime when the capability bounding set lacks
  capabilities `--privileged` asks for (runc_wrapper.py drops exactly those);
- or say why none of that is possible.

Clusters register as users of our dockerd (`acquire`/`release`); the last one to leave stops it and
restores the host settings recorded before it started (hostnet.py). An engine the harness did not
start is never stopped. A user whose registering process is gone and that is no longer in use (the
caller says how to tell: for kind, no cluster state) was left by a killed run and is forgotten.

This module is the entry the backend uses (`acquire`, `release`, `running`, `room_for_nodes`); the
parts are dockerd.py (our dockerd's files, its start and stop), engineusers.py (its registered users)
and dockerinstall.py (installing docker.io).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from harness.backends.commands import run_quiet
from harness.backends.kind.host import dockerd, dockerinstall, engineusers
from harness.backends.kind.host.dockerd import Layout
from harness.backends.kind.host.enginechoice import Decision, Facts, decide, detect
from harness.backends.kind.host.engineusers import InUse
from harness.backends.local.realnode import host as machine_settings
from harness.backends.local.realnode import inotify
from harness.core.errors import HarnessError
from harness.core.locking import file_lock
from harness.core.progress import Reporter

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its terminating NUL


_run = run_quiet  # short queries: never raises; a missing program or a timeout is 127 / 124


# --- the engine the backend uses ---------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    """How our commands reach the engine: the docker CLI and the environment to run it with."""

    docker: str
    env: dict[str, str]  # {} for the machine's engine; {"DOCKER_HOST": ...} for ours
    owned: bool  # started by the harness (stopped by the last `release`)

    def environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}


def running(layout: Layout | None = None) -> Engine | None:
    """Our dockerd when it runs (for a look, e.g. `cluster status`; registers no user)."""
    layout = layout or Layout.default()
    record = dockerd.load_record(layout)
    cli = record.get("cli") or shutil.which("docker")
    if record and cli and dockerd.ours_running(layout, record, cli, _run):
        return Engine(cli, {"DOCKER_HOST": layout.host}, owned=True)
    return None


def acquire(user: str, reporter: Reporter | None = None, *, layout: Layout | None = None,
            facts: Facts | None = None, in_use: InUse = engineusers.always_in_use) -> Engine:
    """An engine for `user` (a kind cluster name, or "node-image"); ours is started if needed."""
    reporter = reporter or Reporter(quiet=True)
    layout = layout or Layout.default()
    facts = facts or detect()
    decision = decide(facts)
    if decision.use_existing:
        return Engine(dockerinstall.found(facts.cli, "the docker CLI"), {}, owned=False)
    if decision.problems:
        raise HarnessError("the kind backend has no Docker engine: " + "; ".join(decision.problems),
                           hint="install and start Docker Engine, or run as root on Debian/Ubuntu so the harness "
                                "can install docker.io and start its own dockerd")
    if len(str(layout.socket)) > SOCKET_PATH_MAX:
        raise HarnessError(f"{layout.socket}: the socket path is {len(str(layout.socket))} bytes, longer than a "
                           f"unix socket allows ({SOCKET_PATH_MAX})", hint="set DRA_HARNESS_STATE_DIR to a shorter path")
    layout.root.mkdir(parents=True, exist_ok=True)
    with file_lock(layout.lock):
        record = dockerd.load_record(layout)
        if decision.install:
            with reporter.step(f"installing {dockerinstall.DEBIAN_PACKAGE} with apt-get (no engine on this machine)"):
                dockerinstall.install_docker()
            facts = detect()
        cli = dockerinstall.found(facts.cli or shutil.which("docker"), "the docker CLI")
        if not (record and dockerd.ours_running(layout, record, cli, _run)):
            with reporter.step(Decision(start_own=True, wrapper_drops=decision.wrapper_drops).describe()):
                try:
                    record = dockerd.start(layout, facts, decision)
                except BaseException:
                    layout.record.unlink(missing_ok=True)  # dockerd.start stopped it: nothing left to release
                    raise
        engineusers.register(record, user, in_use, reporter)
        dockerd.save_record(layout, record)
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
            in_use: InUse = engineusers.always_in_use) -> list[str]:
    """Unregister `user`; the last user stops our dockerd and restores the host. Returns what could not
    be restored. Does nothing for an engine the harness did not start."""
    reporter = reporter or Reporter(quiet=True)
    layout = layout or Layout.default()
    if not layout.record.is_file():
        return []
    with file_lock(layout.lock):
        record = dockerd.load_record(layout)
        engineusers.unregister(record, user, in_use, reporter)
        if record["users"]:
            dockerd.save_record(layout, record)
            return []
        with reporter.step("stopping the harness's dockerd and restoring the host settings it changed"):
            problems = dockerd.stop(layout, record)
        layout.record.unlink(missing_ok=True)
        return problems
