"""The requeue-correctness scenario's pure parts (load/requeue_kinds.py): which event acts where, the
objects that hold a pod back, and the per-kind rows of load-report.json. What the scheduler does with
them is measured by `load run --scenario requeue-correctness` (tests/integration/test_load_smoke.py)."""

from __future__ import annotations

import dataclasses

import pytest

from fake_devices.errors import InvalidInput
from harness.k8s import errors
from load import requeue_kinds, scenarios
from load.requeue_kinds import KINDS, Context

CTX = Context(core=None, resource=None, namespace="ns", label="run-1", instance="load", domain="load.example.com")


def test_at_least_ten_kinds_each_event_on_a_node_of_its_own():
    assert len(KINDS) >= 10 and len({k.name for k in KINDS}) == len(KINDS)
    nodes = [f"dev-{i}" for i in range(25)]
    plan = requeue_kinds.assignment(25, nodes)
    assert [node for _, _, node in plan] == nodes  # one node per event
    assert [kind.name for _, kind, _ in plan[:len(KINDS)]] == [k.name for k in KINDS]  # the kinds in turn
    assert plan[len(KINDS)][1] is KINDS[0]


def test_a_waiting_pod_is_pinned_to_its_node_and_decoys_ask_for_a_class_that_never_exists():
    body = requeue_kinds.pod(CTX, "rq-3", "dev-3")
    assert body["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "dev-3"}
    assert body["spec"]["resourceClaims"] == [{"name": "dev", "resourceClaimTemplateName": requeue_kinds.TEMPLATE}]
    assert body["metadata"]["labels"] == {scenarios.LOAD_LABEL: "run-1"}
    decoy = requeue_kinds.pod(CTX, "rq-decoy-0", None, template_name=requeue_kinds.NEVER_TEMPLATE)
    assert "nodeSelector" not in decoy["spec"]
    held = requeue_kinds.pod(CTX, "rq-fill-1", "dev-1", claim="rq-hold-1")
    assert held["spec"]["resourceClaims"] == [{"name": "dev", "resourceClaimName": "rq-hold-1"}]


def test_a_slot_pool_is_on_its_node_or_network_attached_by_the_slot_label():
    local = requeue_kinds.resource_slice(CTX, "dev-2", [requeue_kinds.device("dev-2", tainted=True)])
    assert local["spec"]["nodeName"] == "dev-2" and local["spec"]["driver"] == "rq.load.example.com"
    assert local["spec"]["pool"] == {"name": "dev-2", "generation": 1, "resourceSliceCount": 1}
    assert local["spec"]["devices"][0]["taints"][0]["effect"] == "NoSchedule"
    attached = requeue_kinds.resource_slice(CTX, "dev-2", [requeue_kinds.device("dev-2")], selected_by_label=True)
    assert "nodeName" not in attached["spec"]
    (term,) = attached["spec"]["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": requeue_kinds.SLOT_LABEL, "operator": "In", "values": ["dev-2"]}]
    # a class selects exactly the slot's device by the attribute the device carries
    assert CTX.selector("dev-2") == ('device.driver == "rq.load.example.com" && '
                                     'device.attributes["rq.load.example.com"].slot == "dev-2"')
    assert requeue_kinds.device("dev-2")["attributes"] == {"slot": {"string": "dev-2"}}


def test_rows_count_requeued_and_missed_per_kind_with_the_bound():
    records = [["pod-deleted", 0.2, "rq-0"], ["slice-added", None, "rq-2"], ["pod-deleted", 0.4, "rq-11"],
               ["slice-added", 1.0, "rq-13"], ["pod-deleted", None, "rq-22"]]
    rows = {r["kind"]: r for r in requeue_kinds.rows(records, 60)}
    assert list(rows) == ["pod-deleted", "slice-added"]  # in KINDS order, kinds without events left out
    assert rows["pod-deleted"] == {"kind": "pod-deleted", "events": 3, "requeued": 2, "missed": 1,
                                   "missedPods": ["rq-22"], "p50_ms": 200.0, "p99_ms": 400.0, "boundMs": 60000}
    assert rows["slice-added"]["p50_ms"] == 1000.0 and rows["slice-added"]["missedPods"] == ["rq-2"]
    assert requeue_kinds.rows([["rule-deleted", None, "rq-5"]], 30)[0]["p50_ms"] is None


def test_each_event_needs_a_node_of_its_own():
    with pytest.raises(InvalidInput) as info:
        scenarios.validate(scenarios.LoadParams("requeue-correctness", nodes=5, pending=20, events=11))
    (problem,) = info.value.problems
    assert problem.source == "--events" and "a node of its own" in problem.problem
    assert scenarios.validate(scenarios.LoadParams("requeue-correctness", nodes=11, pending=20, events=11))
    assert scenarios.USER_CLASSES["requeue-correctness"] == "RequeueUser"


def test_the_console_names_each_kind_and_the_pods_a_kind_missed():
    from harness.jobs import load_runner

    rows = requeue_kinds.rows([["pod-deleted", 0.2, "rq-0"], ["rule-changed", None, "rq-6"]], 60)
    lines = load_runner.requeue_lines(rows)
    assert lines == ["  pod-deleted: 1 of 1 requeued within 60s, none missed; p50 200.0 ms, p99 200.0 ms",
                     "  rule-changed: 0 of 1 requeued within 60s, MISSED 1 (rq-6); p50 None ms, p99 None ms"]


class _Scheduling:
    def __init__(self, served: bool):
        self.served, self.calls = served, 0

    def list_namespaced_pod_group(self, namespace, limit):
        self.calls += 1
        if not self.served:
            raise errors.NotFound(status=404, reason="Not Found")
        return []


def test_a_cluster_without_pod_groups_fires_every_other_kind_and_says_why_not_that_one():
    everything, none_left = requeue_kinds.served(dataclasses.replace(CTX, scheduling=_Scheduling(True)))
    assert everything == KINDS and none_left == {}
    kinds, left_out = requeue_kinds.served(dataclasses.replace(CTX, scheduling=_Scheduling(False)))
    assert [k.name for k in kinds] == [k.name for k in KINDS if k.name != "group-claim-released"]
    assert left_out == {"group-claim-released": requeue_kinds.NO_POD_GROUPS}
    assert "DRAWorkloadResourceClaims" in left_out["group-claim-released"]
    plan = requeue_kinds.assignment(len(kinds), [f"dev-{i}" for i in range(len(kinds))], kinds)
    assert "group-claim-released" not in {kind.name for _, kind, _ in plan}


def test_the_group_kind_holds_the_device_with_the_groups_claim_not_the_pods():
    created = {}
    ctx = dataclasses.replace(CTX, resource=type("R", (), {"create_resource_slice": lambda self, body: None})(),
                              scheduling=type("S", (), {"create_namespaced_pod_group": lambda self, ns, body:
                                                        created.setdefault("group", body)})())
    [member] = requeue_kinds.BY_NAME["group-claim-released"].arrange(ctx, 4, "dev-4")
    group = created["group"]
    assert member["spec"]["schedulingGroup"] == {"podGroupName": group["metadata"]["name"]}
    # the member's entry equals the group's: it uses the group's shared claim, reserved for the group
    assert member["spec"]["resourceClaims"] == group["spec"]["resourceClaims"]
    assert member["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "dev-4"}


def test_the_console_says_where_a_bursts_cpu_went_per_process_and_per_pod():
    from harness.jobs import load_runner

    summary = {"throughput": {"bound": 2500},
               "conditions": {"own_cpu_by_role": {"kube-apiserver": 60.0, "kube-scheduler": 50.0, "locust": 12.5}}}
    assert load_runner.cpu_by_role_lines(summary) == [
        "own CPU by process: kube-apiserver 60 s (24.0 ms/pod), kube-scheduler 50 s (20.0 ms/pod), "
        "locust 12.5 s (5.0 ms/pod)"]
    assert load_runner.cpu_by_role_lines({"conditions": {}}) == []
