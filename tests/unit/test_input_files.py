"""What the input-file readers accept and what they do with it (the refusals are in
test_malformed_inputs.py): limits are exact, nodeLabels reach the nodes, the shared YAML reader
keeps what YAML allows (anchors, merge keys) within its bounds, a refused slice is reported with
its field and the server's message."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from fake_devices import yamlfile
from fake_devices.errors import InvalidInput
from harness.backends.kwok import nodes
from harness.cli import main as cli
from harness.config import cluster

PROFILE = """apiVersion: dra-harness.x-k8s.io/v1alpha1
kind: NodeProfile
metadata: {name: labelled}
spec:
  nodeLabels: {example.com/accelerator: t4, tier: from-profile}
  numaNodes:
  - {id: 0, cpus: "0-3,8-11", memory: 16Gi, pcieRoots: [pci0000:10]}
  gpus:
  - {model: T4, count: 1, attach: [{pcieRoot: pci0000:10}]}
"""


def _definition(tmp_path, pools) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": cluster.API_VERSION, "kind": "Cluster", "metadata": {"name": "t"},
                                    "spec": {"nodePools": pools}}))
    return str(path)


def test_profile_node_labels_are_applied_to_the_pools_nodes_and_pool_labels_win(tmp_path):
    (tmp_path / "labelled.yaml").write_text(PROFILE)
    definition = cluster.load(_definition(tmp_path, [
        {"name": "gpu", "count": 2, "profile": str(tmp_path / "labelled.yaml"), "labels": {"tier": "from-pool"}}]))
    specs = nodes.from_definition(definition)
    assert [s.name for s in specs] == ["gpu-0", "gpu-1"]
    for spec in specs:
        labels = spec.manifest()["metadata"]["labels"]
        assert labels["example.com/accelerator"] == "t4" and labels["tier"] == "from-pool"
        assert spec.cpu == "8"  # 0-3,8-11


@pytest.mark.parametrize("count, longest_ok", [(1, 61), (10, 61), (11, 60), (100, 60), (101, 59)])
def test_pool_name_limit_is_exact(tmp_path, count, longest_ok):
    """Node names <pool>-<count-1> are kubernetes.io/hostname label values: at most 63 characters."""
    cluster.load(_definition(tmp_path, [{"name": "p" * longest_ok, "count": count}]))
    with pytest.raises(InvalidInput) as info:
        cluster.load(_definition(tmp_path, [{"name": "p" * (longest_ok + 1), "count": count}]))
    (problem,) = info.value.problems
    assert problem.field == "spec.nodePools[0].name" and f"at most {longest_ok} characters" in problem.allowed


def test_one_profile_file_in_two_pools_is_fine(tmp_path):
    (tmp_path / "labelled.yaml").write_text(PROFILE)
    profile_path = str(tmp_path / "labelled.yaml")
    definition = cluster.load(_definition(tmp_path, [{"name": "a", "count": 1, "profile": profile_path},
                                                     {"name": "b", "count": 1, "profile": profile_path}]))
    assert list(definition.profiles) == ["labelled"]


def test_two_files_with_one_profile_name_name_both_places(tmp_path):
    (tmp_path / "tiny.yaml").write_text(PROFILE.replace("name: labelled", "name: tiny"))
    path = _definition(tmp_path, [{"name": "a", "count": 1, "profile": "tiny"},
                                  {"name": "b", "count": 1, "profile": str(tmp_path / "tiny.yaml")}])
    with pytest.raises(InvalidInput) as info:
        cluster.load(path)
    (problem,) = info.value.problems
    assert problem.source == path and problem.field == "spec.nodePools[1].profile"
    assert f"profile name 'tiny' from {tmp_path / 'tiny.yaml'} is also the name of" in problem.problem
    assert "tiny.yaml (spec.nodePools[0].profile)" in problem.problem


def test_yaml_reader_keeps_anchors_merge_keys_and_depth_within_bounds():
    text = "base: &b {a: 1, b: [x, y]}\nuse: {<<: *b, a: 2}\nagain: *b\n"
    assert yamlfile.parse(text, "t") == {"base": {"a": 1, "b": ["x", "y"]}, "use": {"a": 2, "b": ["x", "y"]},
                                         "again": {"a": 1, "b": ["x", "y"]}}
    deepest = "[" * (yamlfile.MAX_DEPTH - 1) + "]" * (yamlfile.MAX_DEPTH - 1)  # + the document's own level
    yamlfile.parse(f"x: {deepest}", "t")
    with pytest.raises(InvalidInput, match="nested deeper than"):
        yamlfile.parse(f"x: [{deepest}]", "t")


def test_yaml_reader_counts_nodes_that_aliases_repeat():
    # 10 x 10 x 1000 = 100000 scalars through aliases from a 30-line document
    level0 = "l0: &l0 [" + ", ".join(["x"] * 1000) + "]\n"
    level1 = "l1: &l1 [" + ", ".join(["*l0"] * 10) + "]\n"
    level2 = "l2: [" + ", ".join(["*l1"] * 10) + "]\n"
    with pytest.raises(InvalidInput, match="more than 100000 YAML nodes"):
        yamlfile.parse(level0 + level1 + level2, "t")
    yamlfile.parse(level0 + level1, "t")  # 11000: fine


def test_cluster_up_config_refuses_a_locked_gate_in_the_definition_before_starting(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DRA_HARNESS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DRA_HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": cluster.API_VERSION, "kind": "Cluster", "metadata": {"name": "t"},
                                    "spec": {"featureGates": {"DynamicResourceAllocation": False},
                                             "nodePools": [{"name": "cpu", "count": 1}]}}))
    assert cli.run(["cluster", "up", "--config", str(path), "--name", "never-started"], out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert f"{path}: spec.featureGates.DynamicResourceAllocation: is locked to true" in err
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").rglob("state.yaml"))
    assert not (tmp_path / "cache" / "binaries").exists()


def test_shipped_definitions_validate():
    out = io.StringIO()
    assert cli.run(["cluster", "validate", "mixed", "real-node", "dgx-1000"], out=out) == 0
    assert out.getvalue().count(": ok") == 3


def test_a_refused_slice_names_slice_field_and_message():
    from kubernetes.client.rest import ApiException

    from fake_devices.controller import SliceRejected, _refusal

    err = ApiException(status=422, reason="Unprocessable Entity")
    err.body = json.dumps({"kind": "Status", "message": 'ResourceSlice.resource.k8s.io "n-gpu-1" is invalid: '
                                                        'spec.devices[0].name: Invalid value: "GPU_0"',
                           "details": {"causes": [{"field": "spec.devices[0].name", "message": "Invalid value"}]}})
    body = {"metadata": {"name": "n-gpu-1"}, "spec": {"driver": "gpu.example.com"}}
    with pytest.raises(SliceRejected) as info:
        with _refusal("n", body):
            raise err
    assert str(info.value) == ('ResourceSlice n-gpu-1 (node n, driver gpu.example.com) refused by the API server '
                               '(422 Unprocessable Entity) at spec.devices[0].name: ResourceSlice.resource.k8s.io '
                               '"n-gpu-1" is invalid: spec.devices[0].name: Invalid value: "GPU_0"')
    for passing in (409, 429, 500, 503):  # conflicts, throttling and server trouble are retried, not refusals
        with pytest.raises(ApiException):
            with _refusal("n", body):
                raise ApiException(status=passing, reason="x")


def test_real_node_socket_limit_on_the_domain_is_exact(tmp_path, monkeypatch):
    """<root>/<id>/kubelet/plugins_registry/storage.<domain>-reg.sock must fit in 107 bytes."""
    monkeypatch.setenv("DRA_HARNESS_NODE_ROOT", "/var/lib/dra-harness")
    room = 107 - len("/var/lib/dra-harness/01234567/kubelet/plugins_registry/storage.-reg.sock")

    def definition(domain: str, kubelet: str = "real") -> str:
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"apiVersion": cluster.API_VERSION, "kind": "Cluster", "metadata": {"name": "t"},
                                        "spec": {"driver": {"domain": domain}, "nodePools": [
                                            {"name": "r", "count": 1, "kubelet": kubelet, "profile": "tiny"}]}}))
        return str(path)

    fits = "d" * (room - len(".example")) + ".example"
    assert len(fits) == room
    cluster.load(definition(fits))
    cluster.load(definition("d" + fits, kubelet="simulated"))  # no real node: no kubelet plugin sockets
    with pytest.raises(InvalidInput) as info:
        cluster.load(definition("d" + fits))
    (problem,) = info.value.problems
    assert problem.field == "spec.driver.domain" and f"a domain of at most {room} characters" in problem.allowed


def test_a_definition_names_a_profile_file_relative_to_itself(tmp_path, monkeypatch):
    """clusters/shapes/*.yaml name their profiles as profiles/<name>.yaml: found beside the definition,
    from any working directory; the driver is given the absolute path."""
    from harness.config import cluster as cluster_definitions
    monkeypatch.chdir(tmp_path)
    shapes = Path(__file__).resolve().parents[2] / "clusters" / "shapes"
    loaded = cluster_definitions.load(str(shapes / "bare.yaml"))
    (pool,) = loaded.pools
    assert pool.profile is not None and pool.profile.name == "bare-4"
    assert pool.profile.source == str(shapes / "profiles" / "bare-4.yaml")
