"""The one state record every backend keeps per cluster (harness.backends.state_file)."""

from __future__ import annotations

import pytest
import yaml

from harness.backends import state_file
from harness.backends.local import state as local_state
from harness.core.errors import ClusterNotFound


def test_a_record_is_saved_at_once_and_read_back_with_its_common_fields(tmp_path):
    made = state_file.create(tmp_path / "c1", "c1", {"backend": "kind", "phase": "starting", "nodes": ["a"]})
    on_disk = yaml.safe_load((tmp_path / "c1" / state_file.STATE_FILE).read_text())
    assert on_disk["name"] == "c1" and on_disk["backend"] == "kind" and on_disk["nodes"] == ["a"]
    assert "created" in on_disk
    made.phase = "running"
    made.save()
    loaded = state_file.load(tmp_path / "c1", lambda: AssertionError("it is there"))
    assert (loaded.name, loaded.backend, loaded.phase) == ("c1", "kind", "running")
    assert loaded.kubeconfig == tmp_path / "c1" / "kubeconfig"  # the backend's own, in the directory


def test_a_users_kubeconfig_named_by_the_record_is_the_clusters(tmp_path):
    record = state_file.ClusterState(tmp_path / "e", {"name": "e", "kubeconfig": "/home/me/.kube/config"})
    assert str(record.kubeconfig) == "/home/me/.kube/config"


def test_a_second_create_of_the_same_name_is_refused(tmp_path):
    state_file.create(tmp_path / "twice", "twice", {"backend": "local"})
    with pytest.raises(FileExistsError):
        state_file.create(tmp_path / "twice", "twice", {"backend": "local"})


def test_a_missing_record_raises_the_backends_own_error(tmp_path):
    with pytest.raises(ClusterNotFound, match="no kind cluster named 'gone'"):
        state_file.load(tmp_path / "gone", lambda: ClusterNotFound("no kind cluster named 'gone'"))


def test_only_directories_with_a_record_are_clusters(tmp_path):
    state_file.create(tmp_path / "b", "b", {"backend": "existing"})
    state_file.create(tmp_path / "a", "a", {"backend": "existing"})
    (tmp_path / "half-made").mkdir()  # a killed `up` before it wrote anything
    (tmp_path / "stray-file").write_text("")
    assert state_file.names(tmp_path) == ["a", "b"]
    assert state_file.names(tmp_path / "none") == []


def test_the_local_backends_record_is_the_shared_one_with_its_ports(tmp_path, monkeypatch):
    monkeypatch.setenv("DRA_HARNESS_STATE_DIR", str(tmp_path))
    made = local_state.create("loc", {"backend": "local", "phase": "starting", "ports": {"apiserver": 6443}})
    assert isinstance(made, state_file.ClusterState)
    loaded = local_state.load("loc")
    assert loaded.ports == {"apiserver": 6443} and loaded.backend == "local"
    assert loaded.kubeconfig == made.directory / "kubeconfig"
    (tmp_path / "clusters" / "killed").mkdir(parents=True)  # `up` killed before its record: still listed, incomplete
    assert local_state.load("killed").phase == "incomplete"
    with pytest.raises(ClusterNotFound):
        local_state.load("never")
