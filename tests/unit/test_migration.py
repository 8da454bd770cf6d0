"""The migration rehearsal's pure parts: the command's checks (refused before anything starts), the
legacy form of a definition, the workload manifest and path of a pod, and the per-phase report."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.core.errors import ConfigError
from harness.migration import command, workload
from harness.migration.rehearsal import MigrationNode, Phase, PodRecord, Rehearsal, Result


def _args(tmp_path: Path, **overrides) -> argparse.Namespace:
    values = dict(config="migration", name=None, pods_per_phase=4, in_flight=None, pod_timeout=90.0,
                  report_dir=tmp_path / "reports", keep_cluster=False)
    values.update(overrides)
    return argparse.Namespace(**values)


def test_the_shipped_definition_plans_three_nodes_with_the_real_one_first(tmp_path):
    plan = command.plan(_args(tmp_path))
    assert plan.resource == "example.com/gpu"
    assert plan.nodes == [MigrationNode("real-0", "tiny", 2, real=True), MigrationNode("gpu-0", "tiny", 2),
                          MigrationNode("gpu-1", "tiny", 2)]
    assert plan.in_flight == 4  # 6 GPUs, 2 of them away while one node migrates
    # the legacy cluster: the same pools, no profile, so no DRA driver starts with it
    legacy = command.legacy_definition(plan.definition)
    assert [(p.name, p.count, p.kubelet, p.profile) for p in legacy.pools] == [("real", 1, "real", None),
                                                                               ("gpu", 2, "simulated", None)]
    assert not legacy.profiles and plan.definition.profiles


def _definition(tmp_path: Path, pools: str, driver: str = "extendedResources: {gpu: example.com/gpu}") -> str:
    path = tmp_path / "c.yaml"
    path.write_text(f"apiVersion: dra-harness.x-k8s.io/v1alpha1\nkind: Cluster\nmetadata: {{name: c}}\n"
                    f"spec:\n  driver: {{{driver}}}\n  nodePools:\n{pools}")
    return str(path)


@pytest.mark.parametrize(("pools", "driver", "overrides", "expected"), [
    ("  - {name: a, count: 2, profile: tiny}\n", "instance: fake", {},
     "spec.driver.extendedResources.gpu: not set"),
    ("  - {name: a, count: 1, profile: tiny}\n  - {name: cpu, count: 3}\n", None, {},
     "spec.nodePools: 1 node(s) with GPUs"),
    ("  - {name: a, count: 2, profile: tiny}\n", None, {"pods_per_phase": 0}, "--pods-per-phase: 0: out of range"),
    ("  - {name: a, count: 2, profile: tiny}\n", None, {"in_flight": 3},
     "--in-flight: 3: out of range (allowed: 1 to 2"),
    ("  - {name: a, count: 2, profile: tiny}\n", None, {"pod_timeout": 1.0}, "--pod-timeout: 1.0: out of range"),
])
def test_bad_input_is_refused_with_its_field(tmp_path, pools, driver, overrides, expected):
    config = _definition(tmp_path, pools, driver or "extendedResources: {gpu: example.com/gpu}")
    with pytest.raises(ConfigError) as info:
        command.plan(_args(tmp_path, config=config, **overrides))
    assert expected in str(info.value)


def test_a_report_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="--report-dir: .*exists and is not a directory"):
        command.plan(_args(tmp_path, report_dir=tmp_path / "file"))


def test_the_cli_refuses_before_starting_anything(tmp_path, capsys):
    from harness.cli import main as cli

    code = cli.run(["migration", "rehearse", "--pods-per-phase", "0", "--report-dir", str(tmp_path / "r")])
    assert code == 2
    assert "--pods-per-phase: 0: out of range (allowed: 1 to 50)" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_the_manifest_is_one_and_the_same_but_for_its_name():
    first, second = workload.manifest("a", "example.com/gpu", "img"), workload.manifest("b", "example.com/gpu", "img")
    assert first["metadata"] == {"name": "a"} and second["metadata"] == {"name": "b"}
    assert first["spec"] == second["spec"]
    (container,) = first["spec"]["containers"]
    assert container["resources"] == {"limits": {"example.com/gpu": "1"}}
    assert "resourceClaims" not in first["spec"]  # the workload never names a claim


def _pod(node=None, claim=None):
    status = SimpleNamespace(resource_claim_name=claim) if claim else None
    return SimpleNamespace(spec=SimpleNamespace(node_name=node), status=SimpleNamespace(extended_resource_claim_status=status))


def test_the_path_of_a_pod_is_read_from_its_binding_and_claim_status():
    assert workload.path_of(_pod()) is None
    assert workload.path_of(_pod("n")) == workload.DEVICE_PLUGIN
    assert workload.path_of(_pod("n", "p-extended-resources-x")) == workload.DRA
    assert workload.parse_env("FAKE_DEVICE_PLUGIN_DEVICES=gpu-0\nPATH=/bin\n") is None  # not finished printing
    assert workload.parse_env(f"FAKE_DEVICE_PLUGIN_DEVICES=gpu-0\nDRA_X_POOL=n\nPATH=/bin\n{workload.ENV_DONE}\n") == {
        "FAKE_DEVICE_PLUGIN_DEVICES": "gpu-0", "DRA_X_POOL": "n"}


def test_the_report_counts_each_phase_by_path():
    nodes = [MigrationNode("a", "tiny", 2), MigrationNode("b", "tiny", 2)]
    phases = [Phase("device plugin everywhere", []), Phase("migrate a", ["a"]), Phase("migrate b", ["a", "b"]),
              Phase("DRA everywhere", ["a", "b"])]
    pods = [PodRecord("w0", 0, "a", workload.DEVICE_PLUGIN, 0.5, evicted_in=1),
            PodRecord("w1", 0, "b", workload.DEVICE_PLUGIN, 0.25),
            PodRecord("w2", 1, "a", workload.DRA, 1.5, devices=[("gpu.x", "a", "gpu-0")]),
            PodRecord("w3", 1, "b", workload.DEVICE_PLUGIN, 0.1),
            PodRecord("w4", 2, None, None, 0.0, problem="Unschedulable: 0/2 nodes"),
            PodRecord("w5", 3, "b", workload.DRA, 0.3)]
    result = Result("example.com/gpu", nodes, phases, pods, [])
    rows = result.summary()
    assert [(r["pods"], r["devicePlugin"], r["dra"], r["notScheduled"], r["evicted"]) for r in rows] == [
        (2, 2, 0, 0, 0), (2, 1, 1, 0, 1), (1, 0, 0, 1, 0), (1, 0, 1, 0, 0)]
    assert rows[1]["byNode"] == {"a": {"device-plugin": 0, "dra": 1}, "b": {"device-plugin": 1, "dra": 0}}
    assert not result.ok  # a pod that never ran fails the rehearsal
    assert "| migrate a | 2 | 1 | 1 | 0 | 1 | 1.5 | a 0/1, b 1/0 |" in result.markdown()
    assert result.to_dict()["pods"][0]["evictedIn"] == "migrate a"


def test_the_stream_must_fit_beside_the_node_being_migrated():
    nodes = [MigrationNode("a", "tiny", 2), MigrationNode("b", "tiny", 2)]
    with pytest.raises(ValueError, match="1 to 2 for these nodes"):
        Rehearsal(None, "ns", "example.com/gpu", "img", nodes, None, None, in_flight=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1 to 0"):
        Rehearsal(None, "ns", "example.com/gpu", "img", nodes[:1], None, None, in_flight=1)  # type: ignore[arg-type]


def test_a_pod_a_drain_deleted_before_it_ran_is_counted_as_evicted_not_a_failure():
    """Seen under load: the drain deletes a device-plugin pod bound to the node just before it ran;
    the stream's wait then read 404 and ended the whole rehearsal with an API error."""
    from harness.k8s import errors

    nodes = [MigrationNode("a", "tiny", 2), MigrationNode("b", "tiny", 2)]
    bound = SimpleNamespace(metadata=SimpleNamespace(name="workload-004"),
                            spec=SimpleNamespace(node_name="a"), status=SimpleNamespace(
                                phase="Pending", extended_resource_claim_status=None))
    run = None

    class Core:
        def create_namespaced_pod(self, namespace, manifest):
            pass

        def read_namespaced_pod(self, name, namespace):
            if not run.pods[0].evicted_in:
                run._mark_evicted(bound, 1)  # the drain of phase 1 took it
                return bound
            raise errors.from_status(404, "Not Found")

    run = Rehearsal(SimpleNamespace(core=Core()), "ns", "example.com/gpu", "img", nodes, None, None,  # type: ignore[arg-type]
                    in_flight=1, pod_timeout=5)
    run._phase = 1
    run._one_pod("workload-004")  # returns instead of raising the 404
    record = run.pods[0]
    assert (record.evicted_in, record.node, record.path) == (1, "a", workload.DEVICE_PLUGIN)
    assert not run.problems and "workload-004" not in run._live
