"""A dead control-plane component ends waits and names itself (liveness.py, issue 30 item 1). Uses
real processes started the way the local backend starts components."""

from __future__ import annotations

import sys
import time

import pytest

from harness.backends.local import liveness, process
from harness.k8s import wait

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _kill(running: process.Running) -> None:
    assert running.popen is not None
    running.popen.kill()
    running.popen.wait(timeout=10)


def test_a_killed_scheduler_is_named_with_its_pid_and_log(cluster_dir):
    process.start("kube-apiserver", SLEEPER, cluster_dir)
    scheduler = process.start("kube-scheduler", [*SLEEPER, "scheduler-marker"], cluster_dir)
    scheduler.log.write_text("I1203 last words of the scheduler\n")
    watch = liveness.ComponentWatch("lv", cluster_dir)
    watch.check()  # all alive: nothing to say
    _kill(scheduler)
    with pytest.raises(liveness.ComponentDied) as caught:
        watch.check(look_now=True)
    message = str(caught.value)
    assert caught.value.component == "kube-scheduler"
    assert f"pid {scheduler.pid}" in message and "cluster 'lv'" in message
    assert "last words of the scheduler" in message


def test_a_wait_ends_within_seconds_of_the_death_not_at_its_deadline(cluster_dir):
    etcd = process.start("etcd", SLEEPER, cluster_dir)
    watch = liveness.ComponentWatch("lv", cluster_dir)
    undo = wait.abort_waits_when(watch.check)
    try:
        _kill(etcd)
        started = time.monotonic()
        with pytest.raises(liveness.ComponentDied, match="etcd"):
            wait.until("something that never comes", lambda: False, timeout=60)
        assert time.monotonic() - started < 30  # the deadline was 60 s; the check runs every second
    finally:
        undo()
    assert wait.until("a plain wait once the check is gone", lambda: True, timeout=1)


def test_components_tests_restart_on_purpose_are_not_watched(cluster_dir):
    plugin = process.start("kubelet-plugin-real-node-0-gpu.example.com", SLEEPER, cluster_dir)
    vendor = process.start("vendor-plugin-kwok-node-0", SLEEPER, cluster_dir)
    _kill(plugin)
    _kill(vendor)
    watch = liveness.ComponentWatch("lv", cluster_dir)
    watch.nodes_needed = True
    watch.check()


def test_a_component_restarted_under_the_same_name_is_not_dead(cluster_dir):
    first = process.start("fake-devices", SLEEPER, cluster_dir)
    _kill(first)
    process.start("fake-devices", SLEEPER, cluster_dir)  # a new pid file, as a restart writes
    liveness.ComponentWatch("lv", cluster_dir).check()


def test_a_cluster_being_torn_down_is_not_a_death(cluster_dir):
    running = process.start("kube-scheduler", SLEEPER, cluster_dir)
    watch = liveness.ComponentWatch("lv", cluster_dir)
    _kill(running)
    moved = cluster_dir.with_name("lv-gone")
    cluster_dir.rename(moved)  # `down` removed the directory
    try:
        watch.check()
    finally:
        moved.rename(cluster_dir)



def test_a_wait_looks_again_soon_at_first_then_every_interval(monkeypatch):
    slept = []
    monkeypatch.setattr(wait.time, "sleep", slept.append)
    answers = iter([False] * 7 + [True])
    assert wait.until("the seventh look", lambda: next(answers), timeout=60, interval=0.2)
    assert slept == [0.02, 0.04, 0.08, 0.16, 0.2, 0.2, 0.2]
