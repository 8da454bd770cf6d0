"""A load run on a given cluster (`load run --backend existing`): every name it uses is its own, its
nodes keep other pods away and its pods tolerate them; a run on its own cluster is unchanged."""

from __future__ import annotations

import re

import pytest

from harness.jobs import load_guest, load_runner
from load import cluster_ops, scenarios
from load.scenarios import LOAD_LABEL, Placement

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def test_own_cluster_placement_keeps_the_names_of_a_local_run():
    placement = Placement.own("device-freed")
    assert placement == Placement(namespace="load-device-freed")
    assert (placement.node_names(2), placement.run_label, placement.node_taint) == (["dev-0", "dev-1"], "true", "")
    assert (placement.driver_instance, placement.driver_domain, placement.profile) == \
        ("load", "load.example.com", "load-gpu")
    assert placement.extended_resource == scenarios.EXTENDED_RESOURCE


@pytest.mark.parametrize("scenario", sorted(scenarios.SCENARIOS))
def test_guest_placement_names_everything_after_the_run(scenario):
    placement = Placement.guest(scenario, "0a1b2c")
    names = [placement.namespace, placement.run_label, placement.driver_instance, placement.profile,
             *placement.node_names(scenarios.MAX_NODES)[-1:], f"load-hold-{placement.node_names(1)[0]}"]
    assert all("0a1b2c" in name and DNS_LABEL.match(name) and len(name) <= 63 for name in names), names
    assert len(placement.driver_instance) <= 40  # the fake driver's limit
    assert placement.node_taint == LOAD_LABEL
    # the run's driver and extended resources cannot be confused with a cluster's own
    assert placement.driver_domain == "load-0a1b2c.example.com"
    assert placement.extended_resource == "load-0a1b2c.example.com/gpu"
    other = Placement.guest(scenario, "ffffff")
    assert not {placement.namespace, placement.node_prefix, placement.driver_instance, placement.profile} & \
        {other.namespace, other.node_prefix, other.driver_instance, other.profile}


def test_locust_args_carry_every_field_of_the_placement():
    placement = Placement.guest("slice-added", "abc123")
    args = placement.locust_args()
    given = dict(zip(args[::2], args[1::2]))
    assert given == {"--namespace": "load-slice-added-abc123", "--node-prefix": "load-abc123-dev-",
                     "--run-label": "load-abc123", "--node-taint": LOAD_LABEL, "--driver-instance": "load-abc123",
                     "--driver-domain": "load-abc123.example.com", "--device-profile": "load-gpu-abc123",
                     "--extended-resource": "load-abc123.example.com/gpu"}


def test_pods_of_a_guest_run_tolerate_its_nodes_and_carry_its_label():
    own = cluster_ops.pod("p", template="one-gpu")
    assert "tolerations" not in own["spec"] and own["metadata"]["labels"] == {LOAD_LABEL: "true"}
    guest = cluster_ops.pod("p", template="one-gpu", label="load-abc123", node_taint=LOAD_LABEL)
    assert guest["metadata"]["labels"] == {LOAD_LABEL: "load-abc123"}
    assert {t["key"] for t in guest["spec"]["tolerations"]} == \
        {LOAD_LABEL, "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert all(t["operator"] == "Exists" for t in guest["spec"]["tolerations"])
    member = cluster_ops.group_member("g-a", "g", "one-gpu", label="load-abc123", node_taint=LOAD_LABEL)
    assert member["spec"]["tolerations"] == guest["spec"]["tolerations"]
    rule = cluster_ops.taint_rule("r", "gpu.x", "n", label="load-abc123")
    assert rule["metadata"]["labels"] == {LOAD_LABEL: "load-abc123"}


@pytest.mark.parametrize("with_devices", [True, False])
def test_guest_nodes_are_tainted_labelled_and_published_only_with_devices(with_devices):
    placement = Placement.guest("slice-added", "abc123")
    node = load_guest.node_manifest("load-abc123-dev-0", placement, with_devices)
    labels = node["metadata"]["labels"]
    assert labels[LOAD_LABEL] == "load-abc123"
    assert (labels.get("dra-harness.x-k8s.io/profile") == "load-gpu-abc123") is with_devices
    assert node["spec"]["taints"] == [{"key": LOAD_LABEL, "value": "load-abc123", "effect": "NoSchedule"}]
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert int(node["status"]["allocatable"]["pods"]) >= 64 + 1  # every device filled plus a waiting pod


def test_a_guest_run_needs_its_own_node_taint(tmp_path):
    with pytest.raises(ValueError, match="own node taint"):
        load_guest.GuestRun(tmp_path / "kubeconfig", Placement.own("device-freed"), nodes=1, with_devices=True,
                            profile_file=tmp_path / "p.yaml", reporter=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend, kwargs, expected", [
    ("local", {}, []),
    ("local", {"hints": False, "keep_cluster": True, "workers": 2}, []),
    ("existing", {}, []),
    ("existing", {"workers": 2}, []),
    ("existing", {"hints": True}, [("--hints", "on")]),
    ("existing", {"hints": False}, [("--hints", "off")]),
    ("existing", {"keep_cluster": True}, [("--keep-cluster", "(set)")]),
    ("kind", {}, [("--backend", "kind")]),
    ("local", {"workers": -1}, [("--workers", "-1")]),
    ("local", {"workers": 4, "in_flight": 4}, []),
    ("local", {"workers": 5, "in_flight": 4}, [("--workers", "5")]),  # a fifth user would keep a fifth pod waiting
])
def test_load_run_flags_per_backend(backend, kwargs, expected):
    problems = load_runner.check_run_flags(backend, **kwargs)
    assert [(p.source, p.field) for p in problems] == expected
    if backend == "kind":
        assert problems[0].allowed == "local, existing"
