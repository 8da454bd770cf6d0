"""Notice a control-plane component of a local cluster that died while tests use the cluster.

Issue 30 measured what happens otherwise: SIGKILL the kube-scheduler 20 s into a suite and every
later test times out one by one (30-120 s each), none of them naming the scheduler. With a
`ComponentWatch` registered, a test fails within about a second of the death, or at its setup when the
component was already gone, with the component, its pid, when it was noticed and its log tail.

Watched: what the cluster's supervisor restarts (supervisor.py: the control plane, the cluster's own
fake driver, and each real node's containerd and kubelet). A component the supervisor is about to
restart is not dead; one it gave up on is, and so is any when no supervisor runs. A real node's
containerd and kubelet count only for a test that uses the node (`nodes_needed`), and not while a test
restarts or reboots it (realnode/sharing.py). Not watched: kubelet plugins, which tests stop and
restart on purpose (each such test checks them itself).

`restarts()` and `restarted_since()` tell a test that failed while a component was restarted, or soon
after it (its clients were still coming back).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness.backends.local import process, supervisor
from harness.backends.local.realnode import sharing
from harness.core import diskspace
from harness.core.errors import ComponentDied

WATCHED = supervisor.SUPERVISED
CHECK_EVERY = 1.0  # seconds between looks: a few small files and /proc entries each time
# A restarted component is ready again, but its clients (scheduler, controller-manager, KWOK, drivers) come
# back to it on their own: client-go's reflector retries a broken list/watch with a backoff from 0.8 s up to
# 30 s (defaultBackoffMax, client-go v0.37.2 tools/cache/reflector.go). A test that fails this soon after a
# restart is told of it.
SETTLE_SECONDS = 30.0


@dataclass(frozen=True)
class Death:
    component: str
    pid: int
    noticed_at: str  # wall-clock time, for reading against component logs
    log: Path


class ComponentWatch:
    """`check()` raises ComponentDied once any watched component of the cluster is gone."""

    def __init__(self, cluster: str, cluster_dir: Path):
        self.cluster = cluster
        self.cluster_dir = cluster_dir
        self._deaths: dict[str, Death] = {}
        self._node_parts: set[str] = set()  # the real nodes' containerd and kubelet among the deaths' names
        self._last_look = 0.0
        self._lock = threading.Lock()
        # Whether the test now running uses a real node (the pytest plugin sets it per test): only then
        # does a dead containerd or kubelet there keep it from passing.
        self.nodes_needed = False

    def deaths(self, look_now: bool = False, nodes: bool | None = None) -> list[Death]:
        """Every watched component found dead so far (looked up at most once per CHECK_EVERY, unless
        `look_now`); the real nodes' containerd and kubelet among them if `nodes` (default:
        `nodes_needed`)."""
        with self._lock:
            now = time.monotonic()
            if look_now or now - self._last_look >= CHECK_EVERY:
                self._last_look = now
                self._look()
            nodes = self.nodes_needed if nodes is None else nodes
            return sorted((d for d in self._deaths.values() if nodes or d.component not in self._node_parts),
                          key=lambda d: d.component)

    def _look(self) -> None:
        if not self.cluster_dir.is_dir():  # gone: the cluster is being torn down, not a death
            return
        said = supervisor.read_status(self.cluster_dir)
        on_nodes = supervisor.node_components(self.cluster_dir)
        self._node_parts |= set(on_nodes)
        for name, running in process.recorded(self.cluster_dir).items():
            if (name not in WATCHED and name not in on_nodes) or name in self._deaths or process.alive(running):
                continue
            if said.get(name, {}).get("state") != supervisor.GAVE_UP and supervisor.running(self.cluster_dir):
                continue  # about to be restarted
            if name in on_nodes and sharing.restarting(on_nodes[name]):
                continue  # a test restarts or reboots the node on purpose
            # A restart by the harness (a new pid file) is not a death: read it again.
            again = process.recorded(self.cluster_dir).get(name)
            if again is None or not process.alive(again):
                self._deaths[name] = Death(name, running.pid, time.strftime("%H:%M:%S"), running.log)

    def check(self, look_now: bool = False) -> None:
        found = self.deaths(look_now)
        if not found:
            return
        first = found[0]
        others = "".join(f"; {d.component} (pid {d.pid}) too" for d in found[1:])
        full = diskspace.explain_no_space(process.tail(first.log, lines=400), self.cluster_dir)
        raise ComponentDied(first.component,
                            f"of cluster {self.cluster!r} (pid {first.pid}) is no longer running, noticed at "
                            f"{first.noticed_at}{full}{others}: tests need it, so this one cannot pass",
                            log_file=first.log, log_tail=process.tail(first.log))

    def restarts(self) -> dict[str, int]:
        """Restarts so far per component (what the supervisor recorded)."""
        return {name: int(entry.get("restarts", 0)) for name, entry in supervisor.read_status(self.cluster_dir).items()}

    def restarting(self) -> list[str]:
        """The components the supervisor is restarting now (dead or started, not serving yet)."""
        return sorted(name for name, entry in supervisor.read_status(self.cluster_dir).items()
                      if entry.get("state") == supervisor.RESTARTING and (self.nodes_needed or name not in
                                                                          supervisor.node_components(self.cluster_dir)))

    def restarted_since(self, before: dict[str, int], began: float | None = None) -> str:
        """'kube-scheduler died and was restarted by the supervisor during this test (...)' for each
        component restarted since `before` or being restarted now, and (with `began`, the test's start as
        time.time()) each one that became ready again less than SETTLE_SECONDS before it; '' if none."""
        said = supervisor.read_status(self.cluster_dir)
        if not self.nodes_needed:  # a real node's restart does not concern a test that does not use the node
            said = {name: entry for name, entry in said.items()
                    if name not in supervisor.node_components(self.cluster_dir)}
        where = self.cluster_dir / "logs" / "supervisor.log"
        parts = []
        for name, entry in sorted(said.items()):
            if int(entry.get("restarts", 0)) > before.get(name, 0) or entry.get("state") == supervisor.RESTARTING:
                parts.append(f"{name} died and was restarted by the supervisor during this test (exited at "
                             f"{entry.get('lastExit', '?')}, restart {entry.get('restarts')}; {where})")
            elif began is not None and _recent(entry.get("readyAt"), began):
                parts.append(f"{name} died and was restarted by the supervisor {began - entry['readyAt']:.0f} s "
                             f"before this test began (exited at {entry.get('lastExit', '?')}, restart "
                             f"{entry.get('restarts')}): its clients' watches come back within "
                             f"{SETTLE_SECONDS:.0f} s of it; {where})")
        return "; ".join(parts)


def _recent(ready_at: object, began: float) -> bool:
    return isinstance(ready_at, (int, float)) and began - SETTLE_SECONDS < ready_at
