"""Loopback port allocation (ports.py) and cluster state directories (state.py) of the local backend."""

from __future__ import annotations

import random
import socket

import pytest
import yaml

from harness.backends.local import ports, state
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


def test_reserved_ports_survives_broken_state(state_dir):
    state.create("good", {"ports": {"etcd": 20010}})
    broken = state_dir / "clusters" / "broken"
    broken.mkdir()
    (broken / state.STATE_FILE).write_text("ports: [unclosed\n")
    assert state.reserved_ports() == {20010}
