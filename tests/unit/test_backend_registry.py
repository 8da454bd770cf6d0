"""The backend registry and the typed records that cross between jobs (pure; no cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import backends
from harness.backends.base import Backend, ClusterSpec
from harness.core.errors import ConfigError
from harness.core.records import (
    ClusterInfo,
    RealNode,
    TestResult,
    read_cluster,
    read_results,
    write_cluster,
    write_results,
)
from harness.core.schedulerprofiles import SchedulerProfile


@pytest.mark.parametrize("name", backends.BACKENDS)
def test_every_registered_backend_is_a_backend_under_its_own_name(name):
    backend = backends.get(name)
    assert isinstance(backend, Backend) and backend.name == name
    spec_fields = set(ClusterSpec.__dataclass_fields__)
    assert set(backend.spec_flags.values()) <= spec_fields  # every flag sets a field of the one spec


def test_a_flag_the_chosen_backend_does_not_use_is_refused_naming_the_backends_that_do():
    problems = backends.unused_flags("existing", {"--nodes": 0, "--real-nodes": None, "--preset": "",
                                                  "--no-deploy": False, "--kubeconfig": "k"})
    # 0 is a value the user gave; None, "" and False mean the flag was not given
    assert [str(p) for p in problems] == ["--nodes: 0: not used by --backend existing (allowed: --backend local or kind)"]
    assert backends.unused_flags("local", {"--nodes": 5, "--real-nodes": 1}) == []


@pytest.mark.parametrize("name", backends.BACKENDS)
def test_each_backend_checks_a_request_before_anything_exists(name, tmp_path, monkeypatch):
    """Backend.check refuses a bad request with a located error and makes nothing (no state directory)."""
    monkeypatch.setenv("DRA_HARNESS_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(ConfigError) as refused:
        backends.get(name).check(ClusterSpec(name="Not A Name", kubeconfig=str(tmp_path / "missing")))
    assert "--name: Not A Name: not a valid cluster name" in str(refused.value)
    assert not (tmp_path / "state").exists()


def test_backends_declare_whether_they_attach_to_a_given_cluster():
    """Declared, not guessed from their flags: only `existing` works on a cluster the user gives, and it
    needs that cluster's kubeconfig; the others start a cluster, named and defined."""
    attaching = {name for name in backends.BACKENDS if backends.backend_class(name).attaches}
    assert attaching == {"existing"}
    assert all("--kubeconfig" in backends.backend_class(name).spec_flags for name in attaching)


def test_an_unknown_backend_is_refused_naming_the_flag():
    with pytest.raises(ConfigError) as err:
        backends.get("nope", flag="--dra-backend")
    assert "--dra-backend: nope" in str(err.value) and "local, kind, existing" in str(err.value)


def test_the_spec_is_frozen():
    spec = ClusterSpec(name="x")
    with pytest.raises(AttributeError):
        spec.name = "y"  # type: ignore[misc]


def test_the_cluster_record_round_trips(tmp_path):
    info = ClusterInfo(name="c", backend="local", kubeconfig=Path("/k/kubeconfig"), server="https://127.0.0.1:1",
                       directory=Path("/d"), metrics={"kube-scheduler": "https://127.0.0.1:2/metrics"},
                       real_nodes=(RealNode("real-0", Path("/n/cdi"), (Path("/d/logs/kubelet-real-0.log"),),
                                            ("/c/ctr", "--address=/n/containerd.sock")),),
                       real_nodes_reason="", log_dir=Path("/d/logs"),
                       scheduler_profiles=(SchedulerProfile("short", 1, None),))
    assert read_cluster(write_cluster(info, tmp_path / "cluster.json")) == info
    assert info.scheduler_profile("short") == SchedulerProfile("short", 1, None) and info.scheduler_profile("x") is None


@pytest.mark.parametrize("content, located", [
    ("{", "not JSON"),
    ('{"version": 99}', "version: is 99"),
    ('{"version": 1, "name": "c", "backend": "local", "server": "s"}', "kubeconfig: missing or not a string"),
])
def test_a_bad_cluster_record_is_refused_with_the_field(tmp_path, content, located):
    path = tmp_path / "cluster.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        read_cluster(path)
    assert "--dra-cluster-record" in str(err.value) and located in str(err.value)


def test_results_round_trip_sorted_and_a_cut_short_file_reads_as_none(tmp_path):
    results = [TestResult("b", "failed", 1.5, "boom", {"dra_feature": "X"}, phase="call"), TestResult("a")]
    write_results(results, tmp_path / "results.json")
    assert [r.id for r in read_results(tmp_path / "results.json")] == ["a", "b"]
    assert read_results(tmp_path / "results.json")[1] == results[0]
    assert json.loads((tmp_path / "results.json").read_text())[0] == {
        "id": "a", "outcome": "passed", "seconds": 0.0, "message": "", "properties": {}}
    (tmp_path / "results.json").write_text('[{"id": "x", "outco')
    assert read_results(tmp_path / "results.json") == []
