"""The machine-wide settings of real nodes (realnode/host.py, realnode/inotify.py): ONE record per
machine whatever the state directory, owners by cluster directory and process identity, the
baseline restored by the last live owner only, and the inotify limits raised where real nodes would
not fit.

The kernel is replaced (snapshot/restore are recorded calls); owners, their processes and the
inotify descriptors counted are real.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from harness.backends.kind.host import docker
from harness.backends.local import process
from harness.backends.local.realnode import host, inotify
from harness.core import paths

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """The machine record under tmp_path; snapshot() counts, restore() records what it is given."""
    monkeypatch.setattr(host, "RECORD_DIR", tmp_path / "machine")
    monkeypatch.setattr(inotify, "shortfalls", lambda nodes, **kwargs: [])
    fake = SimpleNamespace(snapshots=0, restored=[], record_file=tmp_path / "machine" / "host-settings.json")

    def snapshot():
        fake.snapshots += 1
        return {"sysctls": {"kernel.panic": str(fake.snapshots)}}

    def restore(baseline):
        fake.restored.append(baseline)
        return []

    monkeypatch.setattr(host, "snapshot", snapshot)
    monkeypatch.setattr(host, "restore", restore)
    fake.record = lambda: json.loads(fake.record_file.read_text())
    return fake


def _cluster(tmp_path: Path, state: str, name: str) -> Path:
    """A cluster directory under its own state directory, as `cluster up` makes it."""
    directory = tmp_path / state / "clusters" / name
    directory.mkdir(parents=True)
    return directory


def _dead_owner(cluster_dir: Path) -> dict:
    """An owner entry written by a run that was killed: its process is gone."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(proc.pid).create_time()
    proc.wait()
    return {"cluster": str(cluster_dir), "pid": proc.pid, "createTime": created}


def _write_record(machine, record: dict) -> None:
    machine.record_file.parent.mkdir(parents=True, exist_ok=True)
    machine.record_file.write_text(json.dumps(record))


def test_two_state_directories_share_one_machine_record(machine, tmp_path, monkeypatch):
    """Issue 16 item 15: each state directory used to keep its own record, so the second run took
    the first one's changed values as its baseline and restored those."""
    first = _cluster(tmp_path, "state-a", "c")
    second = _cluster(tmp_path, "state-b", "c")  # same name, another state directory
    monkeypatch.setenv(paths.STATE_ENV, str(tmp_path / "state-a"))
    host.acquire(first)
    monkeypatch.setenv(paths.STATE_ENV, str(tmp_path / "state-b"))
    host.acquire(second)

    assert machine.snapshots == 1  # the second run did not take the machine as it found it
    assert [o["cluster"] for o in machine.record()["owners"]] == [str(first), str(second)]
    assert not list((tmp_path / "state-a").glob("*.json")) and not list((tmp_path / "state-b").glob("*.json"))

    assert host.release(first) == []
    assert machine.restored == []  # the other state directory's cluster still runs
    assert host.owners() == [str(second)]
    assert host.release(second) == []
    assert machine.restored == [{"sysctls": {"kernel.panic": "1"}}]
    assert not machine.record_file.exists()


def test_acquire_twice_by_one_cluster_is_one_owner(machine, tmp_path):
    cluster = _cluster(tmp_path, "state", "a")
    host.acquire(cluster)
    host.acquire(cluster)
    assert [o["cluster"] for o in machine.record()["owners"]] == [str(cluster)]
    host.release(cluster)
    assert len(machine.restored) == 1


def test_an_owner_that_was_killed_does_not_count(machine, tmp_path):
    """Its registering process is gone and its cluster has no live process: the remaining cluster is
    the last owner and restores."""
    ghost, live = _cluster(tmp_path, "state-a", "ghost"), _cluster(tmp_path, "state-b", "live")
    baseline = {"sysctls": {"kernel.panic": "0"}}
    _write_record(machine, {"baseline": baseline, "owners": [_dead_owner(ghost)]})
    assert host.owners() == []
    host.acquire(live)
    assert host.release(live) == []
    assert machine.restored == [baseline]


def test_an_owner_whose_cluster_still_runs_counts_after_its_up_exited(machine, tmp_path):
    """`cluster up` exits once the cluster is up; its recorded processes keep it an owner."""
    running_cluster, other = _cluster(tmp_path, "state-a", "kept"), _cluster(tmp_path, "state-b", "other")
    process.start("kubelet-real-node-0", list(SLEEPER), running_cluster)
    try:
        _write_record(machine, {"baseline": {"sysctls": {}}, "owners": [_dead_owner(running_cluster)]})
        assert host.owners() == [str(running_cluster)]
        host.acquire(other)
        assert host.release(other) == []
        assert machine.restored == []  # the kubelet of `kept` still relies on the settings
    finally:
        assert process.stop_all(running_cluster, grace_seconds=2) == []
    assert host.owners() == []


def test_baseline_left_by_killed_owners_is_kept(machine, tmp_path):
    """The machine still carries the dead owners' changes: a new snapshot would record them as the truth."""
    old = {"sysctls": {"kernel.panic": "0"}}
    _write_record(machine, {"baseline": old, "owners": [_dead_owner(tmp_path / "gone")]})
    cluster = _cluster(tmp_path, "state", "b")
    host.acquire(cluster)
    assert machine.snapshots == 0
    assert machine.record()["baseline"] == old
    assert [o["cluster"] for o in machine.record()["owners"]] == [str(cluster)]


def test_release_without_a_record_restores_nothing(machine, tmp_path):
    assert host.release(tmp_path / "a") == []
    assert machine.restored == []


def test_release_is_repeatable(machine, tmp_path):
    """An interrupted `down` that already released is repeated: nothing happens twice."""
    cluster = _cluster(tmp_path, "state", "a")
    host.acquire(cluster)
    assert host.release(cluster) == []
    assert host.release(cluster) == []
    assert len(machine.restored) == 1


def test_release_returns_what_restore_could_not_do(machine, tmp_path, monkeypatch):
    cluster = _cluster(tmp_path, "state", "a")
    host.acquire(cluster)
    monkeypatch.setattr(host, "restore", lambda baseline: ["sysctl kernel.panic=1: Permission denied"])
    assert host.release(cluster) == ["sysctl kernel.panic=1: Permission denied"]
    assert not machine.record_file.exists()


def test_acquire_raises_inotify_limits_after_recording_them(machine, tmp_path, monkeypatch):
    short = inotify.Shortfall(inotify.INSTANCES, limit=128, used=120, needed=32)
    monkeypatch.setattr(inotify, "shortfalls", lambda nodes, **kwargs: [short] if nodes == 2 else [])
    written = []

    def write_sysctls(values):
        written.append((values, machine.record_file.exists()))
        return []

    monkeypatch.setattr(host, "write_sysctls", write_sysctls)
    assert host.acquire(_cluster(tmp_path, "state", "a"), nodes=2) == [
        f"{inotify.INSTANCES}: 128 -> {120 + 32 + inotify.MARGIN[inotify.INSTANCES]}"]
    # Written only once the baseline (with the old limit) was on disk, so it is always restored.
    assert written == [({inotify.INSTANCES: str(short.raise_to)}, True)]


def test_inotify_limits_are_part_of_the_baseline():
    assert {inotify.INSTANCES, inotify.WATCHES} <= set(host.SYSCTLS)


# --- inotify: counting what is in use -------------------------------------------------------------


@pytest.fixture
def inotify_fds(tmp_path):
    """Real inotify instances of this process, with watches; closed at the end."""
    libc = ctypes.CDLL(None, use_errno=True)
    fds = []

    def make(watches: int) -> int:
        fd = libc.inotify_init1(os.O_CLOEXEC)
        if fd < 0:
            pytest.skip(f"inotify_init1 failed here: {os.strerror(ctypes.get_errno())}")
        fds.append(fd)
        for i in range(watches):
            directory = tmp_path / f"{fd}-{i}"
            directory.mkdir()
            assert libc.inotify_add_watch(fd, str(directory).encode(), 0x100) >= 0  # IN_CREATE
        return fd

    yield make
    for fd in fds:
        os.close(fd)


def test_usage_counts_instances_and_watches(inotify_fds, tmp_path, monkeypatch):
    # Only this process in the /proc it reads: other processes of this user open and close watches
    # meanwhile (a CI run once saw 15 fewer user-wide while this test added 3).
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / str(os.getpid())).symlink_to(f"/proc/{os.getpid()}")
    monkeypatch.setattr(inotify, "PROC", proc)
    before = inotify.usage(os.geteuid())
    inotify_fds(3)
    inotify_fds(0)
    after = inotify.usage(os.geteuid())
    assert (after.instances - before.instances, after.watches - before.watches) == (2, 3)
    monkeypatch.undo()
    assert inotify.usage(os.geteuid() + 12345) == inotify.Usage(0, 0)  # a user with no processes


def test_shortfalls(monkeypatch):
    limits = {inotify.INSTANCES: 128, inotify.WATCHES: 8192}
    monkeypatch.setattr(inotify, "limit", lambda name: limits[name])
    monkeypatch.setattr(inotify, "usage", lambda uid: inotify.Usage(instances=100, watches=1000))
    per_node = inotify.PER_NODE[inotify.INSTANCES]
    fitting = (128 - 100) // per_node
    assert inotify.shortfalls(fitting) == []
    assert inotify.shortfalls(0) == []
    assert inotify.shortfalls(fitting + 1) == [
        inotify.Shortfall(inotify.INSTANCES, limit=128, used=100, needed=(fitting + 1) * per_node)]
    # Before the cluster's control plane started, its share counts too.
    assert inotify.shortfalls(fitting, control_plane=True) == [inotify.Shortfall(
        inotify.INSTANCES, limit=128, used=100, needed=fitting * per_node + inotify.CONTROL_PLANE[inotify.INSTANCES])]
    limits[inotify.INSTANCES] = None  # a kernel without it: nothing to check
    assert inotify.shortfalls(50) == [inotify.Shortfall(inotify.WATCHES, 8192, 1000,
                                                        50 * inotify.PER_NODE[inotify.WATCHES])]


def test_shortfall_says_what_to_raise():
    short = inotify.Shortfall(inotify.INSTANCES, limit=128, used=120, needed=16)
    assert str(short) == ("fs.inotify.max_user_instances is 128 and 120 are in use by this user: the real nodes "
                          "need 16 more; raise it, e.g. `sysctl -w fs.inotify.max_user_instances=264`")


# preflight naming an inotify limit it cannot raise: test_realnode.py (decided from HostFacts)


def test_kind_nodes_count_with_their_own_footprint_and_as_root(monkeypatch):
    """A kind node container runs a kubelet, containerd, systemd, kube-proxy and dbus as root: a 10-node
    cluster does not fit root's default 128 instances (measured: its last two workers never got Ready)."""
    seen = []
    monkeypatch.setattr(inotify, "limit", lambda name: {inotify.INSTANCES: 128, inotify.WATCHES: 192530}[name])
    monkeypatch.setattr(inotify, "usage", lambda uid: seen.append(uid) or inotify.Usage(instances=0, watches=0))
    assert inotify.shortfalls(3, footprint=inotify.KIND_NODE, uid=0) == []  # kind-small fits
    short = inotify.shortfalls(10, footprint=inotify.KIND_NODE, uid=0)
    assert [(s.sysctl, s.needed) for s in short] == [(inotify.INSTANCES, 10 * inotify.KIND_NODE[inotify.INSTANCES])]
    assert short[0].describe("10 kind nodes").startswith(
        "fs.inotify.max_user_instances is 128 and 0 are in use by this user: 10 kind nodes need 240 more")
    assert set(seen) == {0}


def test_room_for_kind_nodes_raises_only_under_our_own_engine(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(docker.machine_settings, "acquire",
                        lambda root, nodes, **kwargs: calls.append((root, nodes, kwargs)) or ["raised"])
    monkeypatch.setattr(docker.inotify, "shortfalls", lambda nodes, **kwargs: [
        inotify.Shortfall(inotify.INSTANCES, limit=128, used=0, needed=nodes * 24)])
    layout = docker.Layout(tmp_path)
    assert docker.room_for_nodes(10, own=True, layout=layout) == (["raised"], [])
    assert calls == [(layout.root, 10, {"footprint": inotify.KIND_NODE, "uid": 0})]
    raised, short = docker.room_for_nodes(10, own=False, layout=layout)
    assert raised == [] and len(calls) == 1  # an engine we did not start: its host is left as it is
    assert short == ["fs.inotify.max_user_instances is 128 and 0 are in use by this user: 10 kind nodes need 240 "
                     "more; raise it, e.g. `sysctl -w fs.inotify.max_user_instances=368`"]
