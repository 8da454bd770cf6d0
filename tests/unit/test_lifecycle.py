"""Lifecycle rules of the local backend that need no cluster: `--nodes` is bounded and refused before
anything starts, node creation stops promptly when interrupted, `cluster down` can be repeated, and
a start whose `cluster up` was killed is recognised as abandoned."""

from __future__ import annotations

import contextlib
import io
import socket
import subprocess
import sys
import threading

import pytest

from harness import binaries
from harness.backends.kwok import nodes
from harness.backends.local import backend as local_backend
from harness.backends.local import ports, process, state
from harness.backends.local.backend import LocalBackend, UpOptions
from harness.cli import main as cli
from harness.config.cluster import MAX_NODES
from harness.core import paths
from harness.core.errors import ClusterNotFound, ConfigError, HarnessError


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.STATE_ENV, str(tmp_path / "state"))
    return tmp_path / "state"


# --- --nodes bound ------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [-1, MAX_NODES + 1, 100_000])
def test_nodes_out_of_range_is_refused_before_anything_starts(state_dir, monkeypatch, count):
    def must_not_run(*args, **kwargs):
        raise AssertionError("binaries were looked at before the input was checked")

    monkeypatch.setattr(binaries, "ensure", must_not_run)
    with pytest.raises(ConfigError) as refused:
        LocalBackend().up(UpOptions(name="bounded", nodes=count))
    assert f"--nodes: {count}: out of range (allowed: 0 to {MAX_NODES})" in str(refused.value)
    assert not state.cluster_dir("bounded").exists()


def test_the_bound_itself_is_accepted(state_dir, monkeypatch):
    class Reached(Exception):
        pass

    def stop_here(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(binaries, "ensure", stop_here)
    with pytest.raises(Reached):
        LocalBackend().up(UpOptions(name="bounded", nodes=MAX_NODES))


# --- node creation interrupted --------------------------------------------------------------------


class _InterruptingReporter:
    """Raises KeyboardInterrupt (what SIGTERM becomes in the CLI) at the first created node."""

    @contextlib.contextmanager
    def counter(self, title, total):
        class Counter:
            def advance(self, n=1):
                raise KeyboardInterrupt

        yield Counter()


def test_interrupted_node_creation_returns_without_creating_the_rest():
    created = []
    lock = threading.Lock()
    release = threading.Event()  # holds the requests in flight until the interrupt has been handled

    class Core:
        def create_node(self, manifest, _request_timeout=None):
            # every request is bounded: a hung one must not hold the process at exit
            assert _request_timeout == nodes.CREATE_TIMEOUT
            with lock:
                created.append(manifest["metadata"]["name"])
                first = len(created) == 1
            if not first:
                release.wait(30)

    outcome = []

    def create():
        try:
            nodes.create(Core(), nodes.default_nodes(2000), _InterruptingReporter(), workers=8)
        except BaseException as err:  # noqa: BLE001 (recorded for the assertion below)
            outcome.append(err)

    creator = threading.Thread(target=create)
    creator.start()
    creator.join(timeout=10)  # a deadline, not a pause: it returns as soon as create() does
    returned = not creator.is_alive()
    release.set()
    creator.join(timeout=30)
    # Before the fix, create() waited for all 2000 nodes (each request held) before it let the
    # interrupt through to the clean-up.
    assert returned, "nodes.create did not return after the interrupt"
    assert len(outcome) == 1 and isinstance(outcome[0], KeyboardInterrupt)
    assert len(created) <= 8 + 1  # only those in flight when the interrupt came


# --- cluster down: repeatable -------------------------------------------------------------------


def test_down_of_a_cluster_that_is_gone_says_so(state_dir):
    with pytest.raises(ClusterNotFound) as gone:
        LocalBackend().down("gone")
    assert str(gone.value).startswith(f"cluster 'gone' is already down: there is no state in "
                                      f"{state_dir / 'clusters' / 'gone'} and no process of it is running")


def test_repeated_down_on_the_command_line_is_a_no_op_with_exit_0(state_dir):
    out = io.StringIO()
    assert cli.run(["cluster", "down", "--name", "gone"], out=out) == 0
    assert out.getvalue() == (f"nothing to do: cluster 'gone' is already down: there is no state in "
                              f"{state_dir / 'clusters' / 'gone'} and no process of it is running\n")


REAL_NODE = {"name": "real-node-0", "id": "0000abcd", "directory": "/var/lib/dra-harness/0000abcd",
             "bridge": "drh-0000abcd", "subnet": "10.200.0.0/24", "address": "10.200.0.1", "kubelet_port": 20001,
             "healthz_port": 20002}


def test_down_keeps_the_state_while_a_real_node_is_left(state_dir, monkeypatch):
    """What could not be removed stays recorded, so a second `down` can finish the job."""
    cluster = state.create("half", {"backend": "local", "ports": {}, "realNodes": [REAL_NODE]})
    left = ["mount /var/lib/dra-harness/0000abcd/kubelet"]
    monkeypatch.setattr(local_backend.teardown, "teardown_all", lambda *args: list(left))
    monkeypatch.setattr(local_backend.teardown, "leftovers_of", lambda node: list(left))
    assert LocalBackend().down("half") == left
    assert cluster.directory.is_dir()

    left.clear()
    assert LocalBackend().down("half") == []
    assert not cluster.directory.exists()


def test_a_machine_setting_not_restored_is_reported_but_keeps_no_state(state_dir, monkeypatch):
    """/run/containerd still used by another containerd is no node's leftover: the state goes."""
    cluster = state.create("done", {"backend": "local", "ports": {}, "realNodes": [REAL_NODE]})
    monkeypatch.setattr(local_backend.teardown, "teardown_all", lambda *args: ["/run/containerd is not empty"])
    monkeypatch.setattr(local_backend.teardown, "leftovers_of", lambda node: [])
    assert LocalBackend().down("done") == ["/run/containerd is not empty"]
    assert not cluster.directory.exists()


# --- ports ---------------------------------------------------------------------------------------


def test_wait_closed_names_the_component_and_who_holds_the_port():
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        busy = ports.wait_closed({"kube-apiserver": port}, timeout=0.2)
    assert len(busy) == 1
    assert busy[0].startswith(f"port {port} (kube-apiserver) still listening after 0s, held by pid ")
    assert ports.wait_closed({"kube-apiserver": port}, timeout=5) == []


def test_a_bound_socket_that_does_not_listen_is_not_listening():
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        assert ports.listening([bound.getsockname()[1]]) == []


# --- a `cluster up` killed with SIGKILL -----------------------------------------------------------

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _dead_process_identity() -> dict:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process.identity(proc.pid)
    proc.wait()
    return identity


@pytest.fixture
def half_started(state_dir):
    """A cluster in phase `starting` with one live component, as a `cluster up` leaves it."""
    def make(started_by: dict) -> state.ClusterState:
        cluster = state.create("half", {"backend": "local", "phase": "starting", "ports": {},
                                        "startedBy": started_by})
        process.start("etcd", [*SLEEPER, f"--data-dir={cluster.directory}/etcd"], cluster.directory)
        return cluster

    yield make
    if state.cluster_dir("half").exists():
        process.stop_all(state.cluster_dir("half"), grace_seconds=1)


def test_a_start_whose_up_was_killed_is_broken_and_removed_by_the_next_up(half_started):
    cluster = half_started(_dead_process_identity())
    etcd = process.recorded(cluster.directory)["etcd"]
    backend = LocalBackend()
    assert backend.status("half").health == "broken"
    backend._clear_stale("half")
    assert not cluster.directory.exists()
    assert not process.alive(etcd)


def test_a_start_still_in_progress_is_not_taken_over(half_started):
    cluster = half_started(process.identity())  # this process is the `up` that is still starting it
    etcd = process.recorded(cluster.directory)["etcd"]
    backend = LocalBackend()
    assert backend.status("half").health == "starting"
    with pytest.raises(HarnessError) as refused:
        backend._clear_stale("half")
    assert f"cluster 'half' already exists and is running (pid {etcd.pid} (python" in str(refused.value)
    assert process.alive(etcd)


def test_the_wait_for_ready_nodes_grows_with_their_number():
    """A few nodes get the request's bound; 10,000 get 600 s (KWOK took up to 338 s for them here)."""
    from harness.backends.local.backend import ready_timeout

    spec = UpOptions(name="t")
    assert ready_timeout(spec, 3) == spec.node_timeout == 300.0
    assert ready_timeout(spec, 10_000) == 600.0
    assert ready_timeout(UpOptions(name="t", node_timeout=900.0), 10_000) == 900.0
