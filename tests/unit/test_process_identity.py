"""Which processes belong to a local cluster (process.py): by recorded identity (pid and start
time) or, started like a component, by its directory named as a whole path in an argument, never by
a substring. Uses real child processes: `rel-g` must never claim what `rel-gx` started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harness.backends.local import process

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


@pytest.fixture
def spawned():
    """Start sleepers outside process.start (like a component a killed `up` never recorded); all are
    killed at the end."""
    procs: list[subprocess.Popen] = []

    def spawn(*args: str, cwd: Path | None = None, session: bool = True) -> subprocess.Popen:
        proc = subprocess.Popen([*SLEEPER, *args], start_new_session=session, cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.fixture
def clusters(tmp_path):
    """Two cluster directories whose names share a prefix, as `rel-g` and `rel-gx` do."""
    root = tmp_path / "clusters"
    dirs = {name: root / name for name in ("rel-g", "rel-gx", "load-3f2a-12", "load-3f2a-123")}
    for directory in dirs.values():
        directory.mkdir(parents=True)
    yield dirs
    for directory in dirs.values():
        process.stop_all(directory, grace_seconds=2)


def _pids(procs) -> set[int]:
    return {p.pid for p in procs}


@pytest.mark.parametrize("mine, theirs", [("rel-g", "rel-gx"), ("load-3f2a-12", "load-3f2a-123")])
def test_a_sibling_whose_name_extends_mine_is_not_mine(clusters, spawned, mine, theirs):
    other = spawned(f"--data-dir={clusters[theirs]}/etcd", cwd=clusters[theirs])
    own = spawned(f"--data-dir={clusters[mine]}/etcd", cwd=clusters[mine])
    assert _pids(process.processes_of(clusters[mine])) == {own.pid}
    assert _pids(process.processes_of(clusters[theirs])) == {other.pid}


def test_stopping_one_cluster_leaves_the_sibling_running(clusters, spawned):
    # Recorded components of both (the normal case) plus an unrecorded one of rel-gx.
    theirs = process.start("kube-apiserver", [*SLEEPER, f"--cert-dir={clusters['rel-gx']}/pki"], clusters["rel-gx"])
    stray = spawned(f"--kubeconfig={clusters['rel-gx']}/kubeconfig", cwd=clusters["rel-gx"])
    mine = process.start("kube-apiserver", [*SLEEPER, f"--cert-dir={clusters['rel-g']}/pki"], clusters["rel-g"])

    assert process.stop_all(clusters["rel-g"], grace_seconds=2) == []

    assert not process.alive(mine)
    assert process.alive(theirs)
    assert stray.poll() is None
    assert _pids(process.processes_of(clusters["rel-gx"])) == {theirs.pid, stray.pid}


def test_an_unrecorded_process_naming_my_directory_is_mine(clusters):
    """What a killed `up` started but never recorded (its pid file is missing) is found by its flags."""
    running = process.start("etcd", [*SLEEPER, f"--data-dir={clusters['rel-g']}/etcd"], clusters["rel-g"])
    (clusters["rel-g"] / "pids" / "etcd.json").unlink()
    assert process.recorded(clusters["rel-g"]) == {}
    assert _pids(process.processes_of(clusters["rel-g"])) == {running.pid}
    assert process.processes_of(clusters["rel-gx"]) == []


@pytest.mark.parametrize("elsewhere, session", [(True, True), (False, False)], ids=["other-cwd", "no-session"])
def test_a_users_process_reading_the_cluster_directory_is_not_mine(clusters, spawned, tmp_path, elsewhere, session):
    """`tail -f <cluster>/logs/etcd.log` or `kubectl --kubeconfig <cluster>/kubeconfig` in another
    terminal names the directory too, but was not started as a component: `down` leaves it alone."""
    spawned(f"{clusters['rel-g']}/logs/etcd.log", cwd=tmp_path if elsewhere else clusters["rel-g"], session=session)
    assert process.processes_of(clusters["rel-g"]) == []


def test_recorded_pid_reused_by_another_process_is_not_mine(clusters, spawned):
    other = spawned()
    (clusters["rel-g"] / "pids").mkdir()
    created = psutil.Process(other.pid).create_time()
    (clusters["rel-g"] / "pids" / "etcd.json").write_text(f'{{"pid": {other.pid}, "createTime": {created - 100}}}')
    assert process.processes_of(clusters["rel-g"]) == []


@pytest.mark.parametrize("arg, expected", [
    ("/s/clusters/rel-g", True),
    ("/s/clusters/rel-g/", True),
    ("/s/clusters/rel-g/etcd", True),
    ("--data-dir=/s/clusters/rel-g/etcd", True),
    ("--client-ca-file=/s/clusters/rel-g/pki/ca.crt", True),
    ("--config=a.yaml,/s/clusters/rel-g/kwok.yaml", True),
    ("unix:/s/clusters/rel-g/x.sock", True),
    ("/s/clusters/rel-gx", False),
    ("/s/clusters/rel-gx/etcd", False),
    ("--data-dir=/s/clusters/rel-g-2/etcd", False),
    ("/s/clusters/rel-g.old/etcd", False),
    ("/other/s/clusters/rel-g/etcd", False),
    ("", False),
])
def test_mentions_needs_the_whole_directory(arg, expected):
    assert process.mentions(arg, Path("/s/clusters/rel-g")) is expected


# --- stopping: a process is gone only when every thread is (issue 16, item 12) ---------------------

# The main thread exits first (as a Go binary's may when it is killed) while another thread keeps
# the process, and its listening socket, alive. SIGTERM is ignored, so only SIGKILL ends it.
MAIN_THREAD_EXITS_FIRST = """
import ctypes, signal, socket, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
threading.Thread(target=time.sleep, args=(120,)).start()
print(sock.getsockname()[1], flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


@pytest.fixture
def half_exited():
    """A child whose main thread has exited (it shows as a zombie) while a thread holds a port."""
    from harness.k8s import wait

    proc = subprocess.Popen([sys.executable, "-c", MAIN_THREAD_EXITS_FIRST], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    port = int(proc.stdout.readline())
    wait.until("the child's main thread to exit",
               lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE, 10, interval=0.05)
    yield psutil.Process(proc.pid), port
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_a_zombie_main_thread_with_live_threads_is_not_gone(half_exited):
    from harness.backends.local import ports

    proc, port = half_exited
    assert ports.listening([port]) == [port]
    assert not process._gone(proc)


def test_terminate_waits_for_every_thread_and_frees_the_port(half_exited):
    from harness.backends.local import ports

    proc, port = half_exited
    assert process.terminate([proc], grace_seconds=0.5) == []
    assert ports.listening([port]) == []


# --- identity survives a step of the wall clock -----------------------------------------------------
# psutil's create_time() is "boot time read now" plus the start offset, so an NTP or VM clock step
# moves it. CI saw two live apiservers judged to have "exited during start" at one instant that way.

@pytest.fixture
def clock_stepped(monkeypatch):
    """The wall clock as psutil sees it, stepped 30 s forward (the machine's own clock is not touched)."""
    import psutil._pslinux as pslinux
    real = pslinux.boot_time
    monkeypatch.setattr(pslinux, "boot_time", lambda: real() + 30.0)


def test_a_recorded_component_stays_alive_across_a_clock_step(clusters, request):
    running = process.start("etcd", [*SLEEPER, f"--data-dir={clusters['rel-g']}/etcd"], clusters["rel-g"])
    request.getfixturevalue("clock_stepped")  # stepped after the start was recorded
    assert abs(psutil.Process(running.pid).create_time() - running.create_time) > 29  # the step is seen
    record = process.recorded(clusters["rel-g"])["etcd"]
    assert record.popen is None and record.started_after_boot is not None
    assert process.alive(record)
    assert _pids(process.processes_of(clusters["rel-g"])) == {running.pid}


def test_an_identity_written_before_a_clock_step_still_names_its_process(clock_stepped):
    other = subprocess.Popen(SLEEPER)
    try:
        fields = process.identity_fields(process.identity(other.pid))
        assert process.alive(process.Running("owner", **fields))
        reused = {**fields, "started_after_boot": fields["started_after_boot"] - 5}  # same pid, another start
        assert not process.alive(process.Running("owner", **reused))
    finally:
        other.kill()
        other.wait(timeout=10)


def test_an_old_record_without_a_start_offset_is_judged_by_wall_clock(clusters, spawned):
    other = spawned()
    created = psutil.Process(other.pid).create_time()
    assert process.alive(process.Running("old", **process.identity_fields({"pid": other.pid, "createTime": created})))
    assert not process.alive(process.Running("old", **process.identity_fields({"pid": other.pid,
                                                                               "createTime": created - 100})))


def test_an_identity_record_names_its_process_while_it_runs_and_no_later_one(spawned):
    """harness.core.proctime: what the pytest session's shared directory and a cluster's owner record
    hold; a record of a process that has exited, or a malformed one, names no running process."""
    from harness.core import proctime

    child = spawned()
    record = proctime.identity(child.pid)
    assert proctime.identity_running(record)
    assert proctime.identity_running(proctime.identity())  # this process
    assert not proctime.identity_running({**record, "startedAfterBoot": record["startedAfterBoot"] + 5})  # a later one
    child.kill()
    child.wait()
    assert not proctime.identity_running(record)
    assert not proctime.identity_running({"pid": "x"}) and not proctime.identity_running({})
