"""The local cluster's supervisor (supervisor.py, issue 30 item 1): a supervised component that dies
is started again from its pid file, at most the limit, then given up on; what it does not supervise
stays dead. Real processes started the way the backend starts components; the supervisor runs in a
thread with a short backoff."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import yaml

from harness.backends.local import health, liveness, process, state, supervisor
from harness.backends.local.realnode import sharing
from harness.core.files import write_atomic
from harness.core.nodelayout import RealNodeRecord
from harness.k8s import wait

SLEEPER = [sys.executable, "-c", "import os, sys, time; print(os.environ.get('MARK'), flush=True); time.sleep(120)"]


@pytest.fixture
def supervising(cluster_dir, monkeypatch):
    """A supervisor for `cluster_dir` in a thread (limit 2, backoff 0.05 s), recorded as this process."""
    monkeypatch.setattr(supervisor, "BACKOFF", (0.05,))
    monkeypatch.setattr(supervisor, "LOOK_EVERY", 0.05)
    (cluster_dir / "pids").mkdir(exist_ok=True)
    (cluster_dir / "pids" / "supervisor.json").write_text(json.dumps(process.identity(os.getpid())))
    running = supervisor.Supervisor(cluster_dir, limit=2)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    yield running
    running.stopping.set()
    thread.join(timeout=10)
    (cluster_dir / "pids" / "supervisor.json").unlink(missing_ok=True)


def _kill(cluster_dir, name: str) -> int:
    record = process.recorded(cluster_dir)[name]
    os.kill(record.pid, 9)
    return record.pid


def _restarted(cluster_dir, name: str, old_pid: int):
    def check():
        record = process.recorded(cluster_dir).get(name)
        return record if record and record.pid != old_pid and process.alive(record) else None
    return wait.until(f"{name} to be restarted", check, 30)


def test_a_killed_scheduler_is_started_again_with_its_argv_and_env(cluster_dir, supervising):
    process.start("kube-scheduler", SLEEPER, cluster_dir, env={"MARK": "from-the-pid-file"})
    old = _kill(cluster_dir, "kube-scheduler")
    new = _restarted(cluster_dir, "kube-scheduler", old)
    wait.until("the restarted scheduler to print its environment",
               lambda: "from-the-pid-file" in new.log.read_text().partition("--- dra-harness supervisor: restart 1 at")[2],
               30)
    status = supervisor.read_status(cluster_dir)["kube-scheduler"]
    assert status["restarts"] == 1 and status["state"] == supervisor.RUNNING


def test_after_the_limit_it_gives_up_and_the_watch_names_the_component(cluster_dir, supervising):
    process.start("etcd", SLEEPER, cluster_dir)
    watch = liveness.ComponentWatch("sv", cluster_dir)
    pid = _kill(cluster_dir, "etcd")
    for _ in range(2):  # the limit: each death but the last is restarted
        pid = _restarted(cluster_dir, "etcd", pid).pid
        pid = _kill(cluster_dir, "etcd")
    wait.until("the supervisor to give up on etcd",
               lambda: supervisor.read_status(cluster_dir).get("etcd", {}).get("state") == supervisor.GAVE_UP, 30)
    assert supervisor.read_status(cluster_dir)["etcd"]["restarts"] == 2
    with pytest.raises(liveness.ComponentDied, match="etcd"):
        watch.check(look_now=True)


def test_a_component_being_restarted_is_not_dead_to_the_watch(cluster_dir, supervising, monkeypatch):
    monkeypatch.setattr(supervisor, "BACKOFF", (3.0,))
    process.start("kube-apiserver", SLEEPER, cluster_dir)
    watch = liveness.ComponentWatch("sv", cluster_dir)
    before = watch.restarts()
    old = _kill(cluster_dir, "kube-apiserver")
    wait.until("the supervisor to notice", lambda: supervisor.read_status(cluster_dir).get("kube-apiserver", {})
               .get("state") == supervisor.RESTARTING, 30)
    watch.check(look_now=True)  # dead for now, but coming back: no death
    assert "kube-apiserver died and was restarted" in watch.restarted_since(before)
    _restarted(cluster_dir, "kube-apiserver", old)
    assert "restart 1" in watch.restarted_since(before)
    assert watch.restarted_since(watch.restarts()) == ""


# Prints "ready" once the file GATE exists: the test decides when a (re)started component is ready.
GATED = [sys.executable, "-c", "import os, time\nwhile not os.path.exists(os.environ['GATE']): time.sleep(0.02)\n"
         "print('ready', flush=True)\ntime.sleep(120)"]


def test_a_restart_counts_once_the_component_is_ready_again(cluster_dir, supervising, tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    first = process.start("fake-devices", GATED, cluster_dir, env={"GATE": str(gate)},
                          ready=health.Readiness(line="ready"))
    wait.until("the first run to be ready", lambda: "ready" in process.tail(first.log), 30)
    gate.unlink()
    old = _kill(cluster_dir, "fake-devices")
    _restarted(cluster_dir, "fake-devices", old)
    # Started, but its "ready" is not printed yet (the first run's line in the same log does not count).
    wait.until("the restart to be counted", lambda: supervisor.read_status(cluster_dir)
               .get("fake-devices", {}).get("restarts") == 1, 30)
    entry = supervisor.read_status(cluster_dir)["fake-devices"]
    assert entry["state"] == supervisor.RESTARTING and "readyAt" not in entry, entry
    watch = liveness.ComponentWatch("sv", cluster_dir)
    assert watch.restarting() == ["fake-devices"]  # a test's setup waits for it
    gate.touch()
    entry = wait.until("the restarted component to be ready", lambda: (e := supervisor.read_status(cluster_dir)
                       .get("fake-devices", {})).get("state") == supervisor.RUNNING and e, 30)
    assert entry["readyAt"] <= time.time()
    assert watch.restarting() == []


def test_a_test_that_began_soon_after_a_restart_is_told_of_it(cluster_dir, supervising):
    process.start("kube-apiserver", SLEEPER, cluster_dir)
    watch = liveness.ComponentWatch("sv", cluster_dir)
    old = _kill(cluster_dir, "kube-apiserver")
    _restarted(cluster_dir, "kube-apiserver", old)
    entry = wait.until("the restart to be ready", lambda: (e := supervisor.read_status(cluster_dir)
                       .get("kube-apiserver", {})).get("readyAt") and e, 30)
    after = watch.restarts()  # the test began after the restart: its count is the baseline
    soon = watch.restarted_since(after, began=entry["readyAt"] + 5)
    assert "kube-apiserver died and was restarted by the supervisor 5 s before this test began" in soon, soon
    assert watch.restarted_since(after, began=entry["readyAt"] + liveness.SETTLE_SECONDS + 1) == ""
    assert watch.restarted_since(after) == ""  # no start time given: only restarts during the test


def test_what_it_does_not_supervise_stays_dead(cluster_dir, supervising):
    plugin = "kubelet-plugin-real-node-0-gpu.example.com"  # tests crash and restart plugins on purpose
    process.start(plugin, SLEEPER, cluster_dir)
    process.start("kube-controller-manager", SLEEPER, cluster_dir)
    killed = _kill(cluster_dir, plugin)
    manager = _kill(cluster_dir, "kube-controller-manager")
    _restarted(cluster_dir, "kube-controller-manager", manager)  # the same looks passed the plugin by
    assert process.recorded(cluster_dir)[plugin].pid == killed
    assert not process.alive(process.recorded(cluster_dir)[plugin])
    assert plugin not in supervisor.read_status(cluster_dir)


# --- a real node's containerd and kubelet ----------------------------------------------------------------

@pytest.fixture
def real_node(cluster_dir) -> RealNodeRecord:
    """A real node in the cluster's state (only its record and lock directory: the processes are sleepers)."""
    (cluster_dir / "node").mkdir()
    record = RealNodeRecord(name="real-node-0", id="0123abcd", directory=str(cluster_dir / "node"),
                            bridge="drh-0123abcd", subnet="10.202.41.0/24", address="10.202.41.1",
                            kubelet_port=20001, healthz_port=20002)
    (cluster_dir / state.STATE_FILE).write_text(yaml.safe_dump({"name": "unit", "realNodes": [record.to_dict()]}))
    return record


def test_the_real_nodes_components_are_read_again_once_the_state_changes(cluster_dir, real_node):
    first = supervisor.node_components(cluster_dir)
    assert set(first) == {real_node.containerd_process, real_node.kubelet_process}
    assert supervisor.node_components(cluster_dir) == first  # unchanged: the parsed state is reused
    second = dataclasses.replace(real_node, name="real-node-1", id="4567cdef")
    write_atomic(cluster_dir / state.STATE_FILE, yaml.safe_dump(
        {"name": "unit", "realNodes": [real_node.to_dict(), second.to_dict()]}))
    assert set(supervisor.node_components(cluster_dir)) == set(first) | {second.containerd_process,
                                                                         second.kubelet_process}


def test_a_real_nodes_dead_containerd_and_kubelet_are_started_again(cluster_dir, real_node, supervising):
    pids = {}
    for name in (real_node.containerd_process, real_node.kubelet_process):
        process.start(name, SLEEPER, cluster_dir)
        pids[name] = _kill(cluster_dir, name)
    for name, old in pids.items():
        _restarted(cluster_dir, name, old)
        assert supervisor.read_status(cluster_dir)[name]["restarts"] == 1
    assert not sharing.restarting(real_node)  # the share it held for the restart is given back


def test_a_kubelet_a_test_restarts_is_left_to_the_test(cluster_dir, real_node, supervising):
    """While a test has the node alone (a kubelet restart, a reboot) the kubelet is down on purpose: the
    supervisor must not start a second one beside the test's, and the watch must not call it dead."""
    process.start(real_node.kubelet_process, SLEEPER, cluster_dir)
    process.start("kube-controller-manager", SLEEPER, cluster_dir)
    watch = liveness.ComponentWatch("sv", cluster_dir)
    watch.nodes_needed = True
    test = sharing.NodeUse(real_node)
    with test.alone(wait=5):
        kubelet = _kill(cluster_dir, real_node.kubelet_process)
        manager = _kill(cluster_dir, "kube-controller-manager")
        _restarted(cluster_dir, "kube-controller-manager", manager)  # the same looks passed the kubelet by
        assert process.recorded(cluster_dir)[real_node.kubelet_process].pid == kubelet
        watch.check(look_now=True)
    test.release()
    # the test gave the node back without starting its kubelet: now it is the supervisor's to restart
    _restarted(cluster_dir, real_node.kubelet_process, kubelet)


def test_a_real_nodes_kubelet_given_up_on_fails_only_the_tests_that_use_the_node(cluster_dir, real_node,
                                                                                  supervising):
    process.start(real_node.kubelet_process, SLEEPER, cluster_dir)
    watch = liveness.ComponentWatch("sv", cluster_dir)
    pid = _kill(cluster_dir, real_node.kubelet_process)
    for _ in range(2):  # the limit
        pid = _restarted(cluster_dir, real_node.kubelet_process, pid).pid
        pid = _kill(cluster_dir, real_node.kubelet_process)
    wait.until("the supervisor to give up on the kubelet", lambda: supervisor.read_status(cluster_dir)
               .get(real_node.kubelet_process, {}).get("state") == supervisor.GAVE_UP, 30)
    watch.check(look_now=True)  # a test on simulated nodes only
    assert watch.deaths(nodes=False) == []
    watch.nodes_needed = True
    with pytest.raises(liveness.ComponentDied, match=f"{real_node.kubelet_process}: of cluster 'sv'"):
        watch.check(look_now=True)


def test_without_a_supervisor_a_dead_component_is_dead_at_once(cluster_dir):
    process.start("kwok", SLEEPER, cluster_dir)
    _kill(cluster_dir, "kwok")
    wait.until("kwok to be gone", lambda: not process.alive(process.recorded(cluster_dir)["kwok"]), 10)
    with pytest.raises(liveness.ComponentDied, match="kwok"):
        liveness.ComponentWatch("sv", cluster_dir).check(look_now=True)


# --- a cluster ends with its owner -------------------------------------------------------------------

def _dead_identity() -> dict:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process.identity(child.pid)
    child.wait(timeout=10)
    return identity


@pytest.mark.parametrize("owner, phase, gone", [("dead", "running", True), ("alive", "running", False),
                                                 (None, "running", False), ("dead", "starting", False)])
def test_the_owner_decides_when_the_cluster_ends(cluster_dir, owner, phase, gone):
    identity = {"dead": _dead_identity, "alive": lambda: process.identity(os.getpid()), None: lambda: None}[owner]()
    (cluster_dir / state.STATE_FILE).write_text(yaml.safe_dump({"phase": phase, "ownedBy": identity}))
    found = supervisor.Supervisor(cluster_dir, limit=1).owner_gone()
    assert (found == identity["pid"]) if gone else found is None


def test_a_supervisor_whose_owner_died_runs_cluster_down_and_stops(cluster_dir, monkeypatch):
    monkeypatch.setattr(supervisor, "LOOK_EVERY", 0.05)
    identity = _dead_identity()
    (cluster_dir / state.STATE_FILE).write_text(yaml.safe_dump({"phase": "running", "ownedBy": identity}))
    running = supervisor.Supervisor(cluster_dir, limit=1)
    called = []
    monkeypatch.setattr(running, "tear_down", called.append)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive() and called == [identity["pid"]]
