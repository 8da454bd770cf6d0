"""Loopback port allocation (ports.py), machine-wide reservations (reservations.py) and cluster state
directories (state.py) of the local backend."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

import psutil
import pytest
import yaml

from harness.backends.local import ports, reservations, state
from harness.core import paths
from harness.core.errors import ClusterNotFound, ConfigError


class ScriptedRandom(random.Random):
    """A Random whose randrange returns the given ports first, then falls back to a seeded sequence."""

    def __init__(self, first: list[int]):
        super().__init__(1234)
        self.script = list(first)
        self.calls = 0

    def randrange(self, *args, **kwargs):  # noqa: D102
        self.calls += 1
        if self.script:
            return self.script.pop(0)
        return super().randrange(*args, **kwargs)


@pytest.fixture
def listener():
    """A socket listening on a loopback port inside the allocation range."""
    rng = random.Random(42)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for _ in range(100):
        port = rng.randrange(ports.LOW, ports.HIGH)
        try:
            sock.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    else:
        pytest.fail("could not bind any loopback port for the test")
    sock.listen(1)
    yield port
    sock.close()


# --- ports ------------------------------------------------------------------------------------


def test_allocate_distinct_ports_in_range():
    names = ["etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
    chosen = ports.allocate(names)
    assert list(chosen) == names
    assert len(set(chosen.values())) == len(names)
    for port in chosen.values():
        assert ports.LOW <= port < ports.HIGH
        assert port < 32768  # below Linux's ephemeral range


def test_allocate_skips_reserved(monkeypatch):
    monkeypatch.setattr(ports, "is_free", lambda port, host="127.0.0.1": True)
    preview = random.Random(7)
    first, second = preview.randrange(ports.LOW, ports.HIGH), preview.randrange(ports.LOW, ports.HIGH)
    assert first != second
    assert ports.allocate(["a"], rng=random.Random(7)) == {"a": first}  # what the seed gives unreserved
    assert ports.allocate(["a"], reserved={first}, rng=random.Random(7)) == {"a": second}


def test_allocate_does_not_reuse_its_own_choice(monkeypatch):
    monkeypatch.setattr(ports, "is_free", lambda port, host="127.0.0.1": True)
    rng = ScriptedRandom([20500, 20500, 20501])
    assert ports.allocate(["a", "b"], rng=rng) == {"a": 20500, "b": 20501}
    assert rng.calls == 3


def test_allocate_skips_busy_port(listener):
    assert not ports.is_free(listener)
    rng = ScriptedRandom([listener])
    chosen = ports.allocate(["a"], rng=rng)
    assert chosen["a"] != listener
    assert ports.LOW <= chosen["a"] < ports.HIGH
    assert rng.calls >= 2  # the busy port was drawn and rejected


def test_allocate_gives_up_when_everything_is_reserved():
    rng = ScriptedRandom([20000] * 1000)  # always the same, reserved port
    with pytest.raises(RuntimeError, match="no free loopback port found for a"):
        ports.allocate(["a"], reserved={20000}, rng=rng)


def _listen_on(address: str) -> socket.socket:
    """A socket listening on `address` at a port of the allocation range that is free everywhere."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    for port in random.Random(address).sample(range(ports.LOW, ports.HIGH), 100):
        if ports.is_free(port):
            try:
                sock.bind((address, port))
            except OSError:
                continue
            sock.listen(1)
            return sock
    pytest.fail(f"could not bind any port on {address} for the test")


def test_a_port_held_on_another_address_is_not_free():
    """Regression (CI, stop 23): another cluster's real-node kubelet listened on its bridge address;
    binding loopback still worked, so kwok got the same port number and `down` then failed on it."""
    with _listen_on("127.0.0.2") as elsewhere:
        port = elsewhere.getsockname()[1]
        assert not ports.is_free(port)
        assert ports.is_free(port, host="127.0.0.1")  # what the old loopback-only check saw
        rng = ScriptedRandom([port])
        assert ports.allocate(["kwok"], rng=rng)["kwok"] != port
        assert rng.calls >= 2


def test_wait_closed_counts_only_listeners_on_the_components_address():
    with _listen_on("127.0.0.2") as elsewhere:
        port = elsewhere.getsockname()[1]
        assert ports.wait_closed({"kwok": port}, timeout=0.2) == []
        assert ports.listening([port]) == [port]  # seen when every address is asked
    with _listen_on("127.0.0.1") as ours:
        port = ours.getsockname()[1]
        (line,) = ports.wait_closed({"kwok": port}, timeout=0.2)
        assert line.startswith(f"port {port} (kwok) still listening after 0s, held by pid {os.getpid()}")


# --- reservations across clusters -------------------------------------------------------------


@pytest.fixture
def book(tmp_path, monkeypatch):
    """The reservations directory (reservations.py) in tmp_path; every port free on the machine."""
    root = tmp_path / "reservations"
    monkeypatch.setattr(reservations, "directory", lambda: root)
    monkeypatch.setattr(ports, "is_free", lambda port, host="0.0.0.0": True)
    return root


def _dead_identity() -> dict:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = {"pid": child.pid, "createTime": psutil.Process(child.pid).create_time()}
    child.wait()
    return identity


def test_a_port_reserved_for_another_cluster_is_skipped(book, tmp_path):
    first, second = tmp_path / "clusters" / "a", tmp_path / "clusters" / "b"
    assert ports.allocate(["kwok"], rng=ScriptedRandom([20500]), holder=first) == {"kwok": 20500}
    # `a` has no directory yet (its `up` is between choosing ports and writing its state), but the
    # process that reserved the port lives: the port stays `a`'s.
    rng = ScriptedRandom([20500, 20501])
    assert ports.allocate(["kwok"], rng=rng, holder=second) == {"kwok": 20501}
    assert rng.calls == 2
    assert json.loads((book / "port-20500").read_text())["cluster"] == str(first)


def test_a_stale_reservation_is_taken_and_a_live_cluster_keeps_its_own(book, tmp_path):
    book.mkdir()
    gone, alive = tmp_path / "gone", tmp_path / "alive"
    alive.mkdir()
    (book / "port-20600").write_text(json.dumps({"cluster": str(gone), "madeBy": _dead_identity()}))
    (book / "port-20601").write_text(json.dumps({"cluster": str(alive), "madeBy": _dead_identity()}))
    (book / "port-20602").write_text('{"cluster": ')  # half-written by a killed process
    rng = ScriptedRandom([20601, 20600, 20602])
    assert ports.allocate(["x", "y"], rng=rng, holder=tmp_path / "new") == {"x": 20600, "y": 20602}


def test_release_drops_a_clusters_reservations_and_stale_ones(book, tmp_path):
    one, other = tmp_path / "one", tmp_path / "other"
    one.mkdir()
    other.mkdir()
    ports.allocate(["a", "b"], rng=ScriptedRandom([20700, 20701]), holder=one)
    ports.allocate(["c"], rng=ScriptedRandom([20702]), holder=other)
    (book / "port-20703").write_text(json.dumps({"cluster": str(tmp_path / "gone"), "madeBy": _dead_identity()}))
    (book / "port-20704.tmp").write_text("{")
    reservations.release(one)
    assert sorted(p.name for p in book.iterdir()) == [".lock", "port-20702"]


def test_state_remove_releases_the_clusters_ports(book, state_dir):
    cluster = state.create("c1", {"ports": {"etcd": 20800}})
    ports.allocate(["etcd"], rng=ScriptedRandom([20800]), holder=cluster.directory)
    assert (book / "port-20800").exists()
    state.remove(cluster)
    assert not (book / "port-20800").exists()


def test_a_reservations_directory_of_another_user_is_not_used(book, tmp_path, monkeypatch):
    book.mkdir()
    someone_else = os.getuid() + 1
    monkeypatch.setattr(reservations.os, "getuid", lambda: someone_else)  # as if the directory were not ours
    assert ports.allocate(["a"], rng=ScriptedRandom([20900]), holder=tmp_path / "c") == {"a": 20900}
    reservations.release(tmp_path / "c")
    assert list(book.iterdir()) == []  # nothing written into it, no lock file made


def test_listening(listener):
    free = ports.allocate(["x"], reserved={listener})["x"]
    assert ports.listening([listener]) == [listener]
    assert ports.listening([free, listener]) == [listener]
    assert ports.listening([]) == []


# --- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "pytest-1a2b", "dra-harness", "0", "a" * 40])
def test_valid_names(name):
    assert state.validate_name(name) == name


@pytest.mark.parametrize("name", ["Bad_Name", "-x", "x-", "", "a" * 41, "a b", "a.b", None])
def test_invalid_names(name):
    with pytest.raises(ConfigError) as info:
        state.validate_name(name)
    (problem,) = info.value.problems
    assert problem.source == "--name"
    assert "--name" in str(info.value)
    assert "not a valid cluster name" in str(info.value)


# --- state directories ------------------------------------------------------------------------


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.STATE_ENV, str(tmp_path))
    return tmp_path


def test_state_roundtrip(state_dir):
    assert state.all_names() == []
    created = state.create("c1", {"backend": "local", "phase": "starting", "ports": {"etcd": 20001}})
    assert created.directory == state_dir / "clusters" / "c1"
    on_disk = yaml.safe_load((created.directory / state.STATE_FILE).read_text())
    assert on_disk["name"] == "c1" and on_disk["phase"] == "starting" and "created" in on_disk
    assert not (created.directory / (state.STATE_FILE + ".tmp")).exists()

    created.data["phase"] = "running"
    created.save()
    loaded = state.load("c1")
    assert loaded.name == "c1"
    assert loaded.data["phase"] == "running"
    assert loaded.ports == {"etcd": 20001}
    assert loaded.kubeconfig == created.directory / "kubeconfig"

    state.create("b2", {"ports": {"etcd": 20002, "kwok": 20003}})
    assert state.all_names() == ["b2", "c1"]
    assert state.reserved_ports() == {20001, 20002, 20003}
    assert state.reserved_ports(except_name="b2") == {20001}

    state.remove(loaded)
    assert not loaded.directory.exists()
    assert state.all_names() == ["b2"]


def test_create_existing_fails(state_dir):
    state.create("c1", {})
    with pytest.raises(FileExistsError):
        state.create("c1", {})


def test_load_missing_cluster(state_dir):
    with pytest.raises(ClusterNotFound) as info:
        state.load("nosuch")
    assert "nosuch" in info.value.message
    assert "cluster list" in info.value.hint


def test_load_incomplete_cluster(state_dir):
    (state_dir / "clusters" / "half").mkdir(parents=True)
    loaded = state.load("half")
    assert loaded.data["phase"] == "incomplete"
    assert loaded.name == "half"
    assert loaded.ports == {}
    assert state.all_names() == ["half"]
    assert state.reserved_ports() == set()


def test_reserved_ports_include_real_node_kubelets(state_dir):
    node = {"name": "real-node-0", "id": "0123abcd", "directory": "/x", "bridge": "drh0123abcd",
            "subnet": "10.250.1.0/24", "address": "10.250.1.1", "kubelet_port": 20020, "healthz_port": 20021}
    state.create("r1", {"ports": {"etcd": 20010}, "realNodes": [node]})
    assert state.reserved_ports() == {20010, 20020, 20021}


def test_reserved_ports_survives_broken_state(state_dir):
    state.create("good", {"ports": {"etcd": 20010}})
    broken = state_dir / "clusters" / "broken"
    broken.mkdir()
    (broken / state.STATE_FILE).write_text("ports: [unclosed\n")
    assert state.reserved_ports() == {20010}
