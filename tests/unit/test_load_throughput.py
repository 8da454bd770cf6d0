"""The throughput scenario's figures (load/throughput.py) on recorded times, the upstream
scheduler_perf formula, the reasons for unbound pods, and how --workers splits the events."""

from __future__ import annotations

import pytest
from kubernetes.client import V1ObjectMeta, V1Pod, V1PodCondition, V1PodSchedulingGate, V1PodSpec, V1PodStatus

from load import scenarios, throughput


def test_samples_follow_scheduler_perf():
    # ticks at 1, 2, 3, 4, 5 s after the start; bindings: 2 by tick 1 (baseline), 10 more by tick 2,
    # none by tick 3 (skipped), 6 more by tick 4 -> 6 pods over 2 s recorded twice.
    bound = [0.5, 0.9] + [1.1 + i * 0.05 for i in range(10)] + [3.2, 3.3, 3.4, 3.5, 3.6, 3.9]
    samples = throughput.scheduler_perf_samples(bound, start=0.0)
    assert samples == pytest.approx([10.0, 3.0, 3.0])


def test_last_partial_interval_is_sampled_and_nothing_after():
    samples = throughput.scheduler_perf_samples([0.2, 1.5, 1.6, 2.1], start=0.0)
    # tick 1: baseline (1 pod); tick 2: +2; tick 3: +1 (the last binding at 2.1); stop
    assert samples == pytest.approx([2.0, 1.0])


def test_too_short_a_burst_has_no_samples():
    assert throughput.scheduler_perf_samples([0.1, 0.2, 0.3], start=0.0) == []
    assert throughput.summarize_samples([]) is None


def test_percentiles_use_upstreams_index():
    summary = throughput.summarize_samples([float(x) for x in range(1, 11)])  # 1..10
    # sorted[ceil(n * p / 100) - 1]: 50 -> 5th, 90 -> 9th, 95 -> 10th, 99 -> 10th
    assert summary == {"samples": 10, "Average": 5.5, "Perc50": 5.0, "Perc90": 9.0, "Perc95": 10.0, "Perc99": 10.0}


def test_figures_separate_creation_from_end_to_end():
    created = {f"p{i}": (10.0 + i * 0.1, 10.05 + i * 0.1) for i in range(20)}  # issued 10.0 .. 11.9
    bound = {f"p{i}": 11.0 + i * 0.25 for i in range(20)}  # last binding at 15.75
    result = throughput.figures(created, bound)
    assert result["pods"] == result["bound"] == 20
    assert result["creation"] == {"seconds": 1.95, "pods_per_second": round(20 / 1.95, 1)}
    assert result["end_to_end"]["seconds"] == 5.75
    assert result["pods_per_second"] == result["end_to_end"]["pods_per_second"] == round(20 / 5.75, 1)
    assert result["end_to_end"]["drain_after_creation_seconds"] == round(15.75 - 11.95, 2)
    upstream = result["scheduler_perf"]
    assert upstream["samples"] >= 3 and upstream["Perc50"] <= upstream["Perc90"] <= upstream["Perc99"]


def test_figures_count_only_created_pods_and_report_unbound():
    created = {"a": (0.0, 0.1), "b": (0.0, 0.1)}
    result = throughput.figures(created, {"a": 2.0, "init-0": 0.5})
    assert (result["pods"], result["bound"]) == (2, 1)


def _pod(name, node=None, condition=None, gates=()):
    conditions = [V1PodCondition(type="PodScheduled", status="False", reason=condition[0], message=condition[1])] \
        if condition else None
    return V1Pod(metadata=V1ObjectMeta(name=name),
                 spec=V1PodSpec(containers=[], node_name=node,
                                scheduling_gates=[V1PodSchedulingGate(name=g) for g in gates] or None),
                 status=V1PodStatus(conditions=conditions))


def test_unbound_reasons_are_grouped():
    full = ("Unschedulable", '0/20 nodes are available: 20 cannot allocate all claims. still not schedulable')
    pods = [_pod("b-0", condition=full), _pod("b-1", condition=full), _pod("b-2"),
            _pod("b-3", gates=["example.com/hold"]), _pod("b-4", node="dev-1"),
            _pod("b-5", condition=("Unschedulable", 'pod "b-5": claim "b-5-gpu-x1" not found')),
            _pod("b-6", condition=("Unschedulable", 'pod "b-6": claim "b-6-gpu-y2" not found')),
            _pod("other", condition=full)]
    reasons = throughput.unbound_reasons(pods, {"b-0", "b-1", "b-2", "b-3", "b-4", "b-5", "b-6", "b-gone"})
    assert reasons == {
        "Unschedulable: 0/20 nodes are available: 20 cannot allocate all claims. still not schedulable": 2,
        'Unschedulable: pod "…": claim "…" not found': 2,
        "not tried by the scheduler yet (no PodScheduled condition)": 1,
        "gated by example.com/hold": 1,
        "bound on the API server, but the harness's watch did not see it": 1,
        "pod does not exist any more": 1,
    }


@pytest.mark.parametrize("total, workers", [(10, 2), (10, 3), (2, 4), (1, 1), (7, 7), (0, 2)])
def test_worker_shares_add_up_to_the_total(total, workers):
    shares = [scenarios.share(total, workers, i) for i in range(workers)]
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1


def test_two_workers_take_half_the_events_each():
    assert [scenarios.share(10, 2, i) for i in range(2)] == [5, 5]
    assert [scenarios.share(5, 2, i) for i in range(2)] == [3, 2]


def test_most_in_flight_counts_pods_created_and_not_yet_bound():
    created = {"a": (0.0, 0.1), "b": (0.0, 0.1), "c": (1.0, 1.1), "d": (2.0, 2.1)}
    bound = {"a": 0.5, "b": 1.0, "c": 1.5}  # b bound at the instant c is created: not both at once
    assert throughput.most_in_flight(created, bound) == 2
    # d was never bound: it stays in flight, beside a second pod created later
    assert throughput.most_in_flight({**created, "e": (3.0, 3.1)}, bound) == 2
    assert throughput.most_in_flight({}, {}) == 0
