"""Restart a local cluster's control plane when a component dies, as a kubelet restarts static pods.

    python -m harness.backends.local.supervisor --cluster-dir DIR

`cluster up` starts one per cluster, last, as a component of its own (`pids/supervisor.json`); `down`
stops it first, so nothing it restarts races a teardown. Every half second it looks at the
supervised components' pid files. One that is gone is restarted from what its pid file recorded
(argv, environment overrides, the cluster directory as working directory) after a backoff of 1, 2, 4,
8, 16 s, and counts as restarted once it serves again (`readyAt` in the status; health.py), at most
MAX_RESTARTS times per component; then it gives up and the component stays dead,
which the suite's watch (liveness.py) reports by name. Each death and restart goes to
`logs/supervisor.log` with the component's log tail, and the counts to `supervisor.json`, which
`cluster status` shows and the watch reads: a component the supervisor is about to restart is not
dead yet.

A cluster with an owner (ClusterSpec.owner: the `dra-harness run` or pytest session it was made for)
ends with it: once the owner is gone without taking the cluster down (SIGKILL, the OOM killer, a CI
timeout), the supervisor runs `cluster down` for it within a few seconds, so nothing is left running
for the next run to trip over.

Supervised: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, KWOK, the cluster's own
fake driver, and each real node's containerd and kubelet. Tests restart and reboot a real node on
purpose: while one has the node alone (realnode/sharing.py) its containerd and kubelet are left to it,
and the supervisor holds a share of the node while it restarts one, so no test restarts the node
meanwhile. Not the kubelet plugins: tests stop, crash and restart those and judge what follows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from harness.backends.local import components, health, process, state
from harness.backends.local.realnode import sharing
from harness.core import paths
from harness.core.errors import ComponentError
from harness.core.files import write_atomic
from harness.core.nodelayout import RealNodeRecord, records

NAME = "supervisor"
STATUS_FILE = "supervisor.json"
# What `down` stops in order (the control plane and the cluster's fake driver), less the supervisor.
SUPERVISED = frozenset(name for group in components.STOP_ORDER for name in group) - {NAME}
MAX_RESTARTS_ENV = "DRA_HARNESS_MAX_RESTARTS"
MAX_RESTARTS = 5
BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0)
LOOK_EVERY = 0.5
OWNER_EVERY = 4  # looks between checks of the owner (2 s)
RESTARTING, RUNNING, GAVE_UP = "restarting", "running", "gave up"
# After a restart the component is "restarting" until it serves again (its /readyz, /healthz or ready line,
# as `cluster up` waits for), at most this long.
READY_TIMEOUT = 120.0
READY_POLL = 0.2

log = logging.getLogger("harness.supervisor")


def argv(cluster_dir: Path) -> list[str]:
    return [sys.executable, "-m", "harness.backends.local.supervisor", f"--cluster-dir={os.path.abspath(cluster_dir)}"]


def max_restarts() -> int:
    try:
        return max(0, int(os.environ.get(MAX_RESTARTS_ENV, MAX_RESTARTS)))
    except ValueError:
        return MAX_RESTARTS


def read_status(cluster_dir: Path) -> dict[str, dict]:
    """What the supervisor said per component: restarts, state, lastExit (empty without one)."""
    try:
        data = json.loads((cluster_dir / STATUS_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


# state.yaml read again only when it changed: parsing it took about 4 ms of CPU, twice a second, for the
# supervisor and the suite's watch alike (a load run's window counted the supervisor at 0.3 ms per pod).
_NODES_SEEN: dict[Path, tuple[tuple[int, int, int], dict[str, RealNodeRecord]]] = {}


def node_components(cluster_dir: Path) -> dict[str, RealNodeRecord]:
    """The supervised processes of the cluster's real nodes (containerd and kubelet), by name."""
    path = cluster_dir / state.STATE_FILE
    try:
        info = path.stat()
        version = (info.st_ino, info.st_mtime_ns, info.st_size)  # write_atomic replaces the file: a new inode
        seen = _NODES_SEEN.get(path)
        if seen is not None and seen[0] == version:
            return dict(seen[1])
        data = yaml.safe_load(path.read_text()) or {}
        nodes = records(data) if isinstance(data, dict) else []
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return {}
    found = {name: node for node in nodes for name in (node.containerd_process, node.kubelet_process)}
    _NODES_SEEN[path] = (version, found)
    return dict(found)


def running(cluster_dir: Path) -> bool:
    """Whether this cluster's supervisor lives (so a dead component may still come back)."""
    record = process.recorded(cluster_dir).get(NAME)
    return record is not None and process.alive(record)


class Supervisor:
    def __init__(self, cluster_dir: Path, limit: int):
        self.cluster_dir = cluster_dir
        self.limit = limit
        self.status: dict[str, dict] = read_status(cluster_dir)  # a restarted supervisor keeps the counts
        self.stopping = threading.Event()

    def _save(self) -> None:
        write_atomic(self.cluster_dir / STATUS_FILE, json.dumps(self.status, indent=2, sort_keys=True))

    def look(self) -> None:
        nodes = node_components(self.cluster_dir)  # small; read each look, as the pid files are
        # by name: containerd-<node> comes before kubelet-<node>, which needs it
        for name, record in process.recorded(self.cluster_dir).items():
            node = nodes.get(name)
            if (name not in SUPERVISED and node is None) or process.alive(record):
                continue
            if node is not None and sharing.restarting(node):
                continue  # a test restarts or reboots the node: it starts them again itself
            entry = self.status.setdefault(name, {"restarts": 0, "state": RUNNING})
            if entry["state"] == GAVE_UP:
                continue
            tail = process.tail(record.log, lines=10)
            entry["lastExit"] = time.strftime("%H:%M:%S")
            if entry["restarts"] >= self.limit:
                entry["state"] = GAVE_UP
                self._save()
                log.error("%s (pid %s) exited; %d restarts already: giving up\n%s", name, record.pid,
                          entry["restarts"], tail)
                continue
            delay = BACKOFF[min(entry["restarts"], len(BACKOFF) - 1)]
            entry["state"] = RESTARTING
            self._save()
            log.warning("%s (pid %s) exited; restart %d of %d in %.0f s; last lines of its log:\n%s", name,
                        record.pid, entry["restarts"] + 1, self.limit, delay, tail)
            if self.stopping.wait(delay):
                return
            if node is None:
                self._restart(name, entry)
                continue
            use = sharing.NodeUse(node)
            try:
                use.share(wait=0)  # no test may restart the node while this restarts one of its processes
            except ComponentError:
                entry["state"] = RUNNING  # a test began to restart the node meanwhile: it starts them itself
                self._save()
                log.warning("%s: a test restarts %s now; leaving its processes to it", name, node.name)
                continue
            try:
                self._restart(name, entry)
            finally:
                use.release()

    def _restart(self, name: str, entry: dict) -> None:
        path = self.cluster_dir / "pids" / f"{name}.json"
        try:
            data = json.loads(path.read_text())
            command, env = list(data["argv"]), dict(data.get("env") or {})
        except (OSError, ValueError, KeyError, TypeError) as err:
            entry["state"] = GAVE_UP
            self._save()
            log.error("%s: cannot restart, its pid file %s does not say how it was started (%s)", name, path, err)
            return
        again = process.recorded(self.cluster_dir).get(name)
        if again is not None and process.alive(again):  # somebody started it meanwhile
            entry["state"] = RUNNING
            self._save()
            return
        log_path = self.cluster_dir / "logs" / f"{name}.log"
        with open(log_path, "a") as handle:
            handle.write(f"--- dra-harness supervisor: restart {entry['restarts'] + 1} at {time.strftime('%H:%M:%S')} ---\n")
        log_from = log_path.stat().st_size  # this run's output begins here
        readiness = health.Readiness.from_record(data.get("ready"))
        started = process.start(name, command, self.cluster_dir, env=env, ready=readiness)
        entry["restarts"] += 1
        self._save()  # still "restarting": a test failing now is told so
        began = time.monotonic()
        outcome = self._wait_ready(started, readiness, log_from)
        if outcome in ("died", "stopped"):
            return  # died: the next look restarts it again (or gives up), with the backoff
        entry["state"] = RUNNING
        entry["readyAt"] = time.time()  # the watch names a restart this recent for a test that fails (liveness.py)
        self._save()
        if outcome == "ready":
            log.warning("%s restarted (pid %s); ready after %.1f s", name, started.pid, time.monotonic() - began)
        else:
            log.error("%s restarted (pid %s) but not ready after %.0f s (%s); last lines of its log:\n%s", name,
                      started.pid, READY_TIMEOUT, readiness.url or readiness.line, process.tail(log_path, lines=10))

    def _wait_ready(self, started: process.Running, readiness: health.Readiness, log_from: int) -> str:
        """'ready', 'died', 'stopped' (the supervisor is) or 'timeout': a restart counts once the component serves
        again, as at `cluster up`."""
        tls = health.cluster_tls(self.cluster_dir) if (readiness.url or "").startswith("https") else None
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if not process.alive(started):
                return "died"
            if health.is_ready(readiness, started.log, tls, log_from):
                return "ready"
            if self.stopping.wait(READY_POLL):
                return "stopped"
        return "timeout"

    def owner_gone(self) -> int | None:
        """The pid of the cluster's owner (ClusterSpec.owner) once it is gone, else None."""
        try:
            data = yaml.safe_load((self.cluster_dir / state.STATE_FILE).read_text()) or {}
        except (OSError, yaml.YAMLError):
            return None
        owner = data.get("ownedBy") if isinstance(data, dict) else None
        if not isinstance(owner, dict) or data.get("phase") == "starting":
            return None
        record = process.Running("owner", **process.identity_fields(owner))
        return None if process.alive(record) else record.pid

    def tear_down(self, owner: int) -> None:
        """The owner was killed before its clean-up: `cluster down` in a process of its own (it stops
        this supervisor first, so it must not be our child in our session)."""
        log.warning("the owner of this cluster (pid %s) is gone without taking it down: running `cluster down`", owner)
        subprocess.Popen([sys.executable, "-m", "harness.cli", "-q", "cluster", "down", "--name", self.cluster_dir.name],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         cwd="/", start_new_session=True,
                         env={**os.environ, paths.STATE_ENV: str(self.cluster_dir.parent.parent)})

    def run(self) -> None:
        looks = 0
        while not self.stopping.wait(LOOK_EVERY):
            if not self.cluster_dir.is_dir():
                return  # the cluster is gone
            looks += 1
            if looks % OWNER_EVERY == 0:
                owner = self.owner_gone()
                if owner is not None:
                    self.tear_down(owner)
                    return
            self.look()


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.backends.local.supervisor")
    parser.add_argument("--cluster-dir", required=True, type=Path)
    options = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    supervisor = Supervisor(options.cluster_dir, max_restarts())
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: supervisor.stopping.set())
    log.info("supervising %s in %s (at most %d restarts each)", ", ".join(sorted(SUPERVISED)),
             options.cluster_dir, supervisor.limit)
    supervisor.run()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
