"""Load-test parameters that cannot work are refused before anything is created."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fake_devices.errors import InvalidInput
from load import metrics, scenarios


def _problems(**overrides):
    params = {"scenario": "device-freed", "nodes": 10, "pending": 10, "events": 5, **overrides}
    with pytest.raises(InvalidInput) as failure:
        scenarios.validate(scenarios.LoadParams(**params))
    return {(p.source, p.problem) for p in failure.value.problems}


def test_good_parameters_pass():
    for name in scenarios.SCENARIOS:
        scenarios.validate(scenarios.LoadParams(name, 10, 20, 5, devices_per_node=4))


@pytest.mark.parametrize("overrides, flag, fragment", [
    ({"scenario": "nope"}, "--scenario", "unknown scenario"),
    ({"nodes": 0}, "--nodes", "at least one node"),
    ({"pending": 0}, "--pending", "at least one waiting pod"),
    ({"events": 11}, "--events", "more events than waiting pods"),
    ({"scenario": "slice-added", "nodes": 3, "events": 5}, "--events", "one more node"),
    ({"scenario": "taint-removed", "nodes": 3, "events": 5}, "--events", "lifts one node's taint"),
    ({"scenario": "throughput", "pending": 1000}, "--pending", "more pods than devices"),
    ({"pending": 100000, "events": 1, "time_limit": 60}, "--pending", "more than --time-limit"),
    ({"devices_per_node": 0}, "--devices-per-node", "out of range"),
    ({"scenario": "taint-removed", "events": 5, "pending": 8, "devices_per_node": 2}, "--pending", "need at least"),
    ({"nodes": 100000}, "--nodes", "out of range"),
    ({"nodes": 3000, "time_limit": 60}, "--nodes", "fills every device"),
    ({"users": 0}, "--users", "out of range"),
    ({"time_limit": float("nan")}, "--time-limit", "not a usable number"),
    ({"scenario": "steady-state", "pending": 40}, "--pending", "room for 1 arriving pod"),
    ({"scenario": "steady-state", "pending": 35, "in_flight": 10, "duration": 5}, "--pending", "room for 10 arriving"),
    ({"scenario": "device-freed", "in_flight": 2}, "--in-flight", "only steady-state has a closed loop"),
    ({"scenario": "throughput", "duration": 5}, "--duration", "only steady-state has a closed loop"),
    ({"scenario": "steady-state", "duration": 5}, "--duration", "only the closed loop runs for a duration"),
    ({"scenario": "steady-state", "in_flight": 2}, "--duration", "runs for this many seconds"),
    ({"scenario": "steady-state", "in_flight": 2, "duration": 500, "time_limit": 300}, "--duration",
     "within --time-limit"),
    ({"scenario": "steady-state", "in_flight": 2, "duration": float("nan")}, "--duration", "runs for this many"),
    ({"scenario": "steady-state", "in_flight": -1, "duration": 5}, "--in-flight", "out of range"),
    ({"scenario": "steady-state", "in_flight": 2, "duration": 5, "users": 4}, "--users", "one locust user per"),
    ({"scenario": "steady-state", "rate": 0}, "--rate", "out of range"),
    ({"scenario": "steady-state", "rate": float("inf")}, "--rate", "out of range"),
    ({"scenario": "steady-state", "events": 5000, "rate": 1, "time_limit": 60}, "--events", "more than --time-limit"),
    ({"scenario": "steady-state", "pending": -1}, "--pending", "cannot be negative"),
    ({"scenario": "extended-throughput", "pending": 1000}, "--pending", "more pods than devices"),
    ({"time_limit": float("inf")}, "--time-limit", "not a usable number"),
    ({"time_limit": -5}, "--time-limit", "not a usable number"),
    ({"time_limit": 0.5}, "--time-limit", "not a usable number"),
])
def test_impossible_parameters_are_refused(overrides, flag, fragment):
    assert any(source == flag and fragment in problem for source, problem in _problems(**overrides))


def test_too_many_nodes_blames_nodes_not_pending():
    # issue 16 item 9: `--nodes 100000` was reported as a --pending problem
    problems = _problems(nodes=100000)
    assert {source for source, _ in problems} == {"--nodes"}
    with pytest.raises(InvalidInput) as failure:
        scenarios.validate(scenarios.LoadParams("device-freed", 3000, 10, 5, time_limit=60))
    (problem,) = failure.value.problems
    assert (problem.source, problem.field) == ("--nodes", "3000")
    assert problem.allowed.startswith("at most 1500 nodes at --devices-per-node 4")


def test_failure_reasons_name_each_failed_and_unfired_event(tmp_path):
    from harness.jobs.load_runner import failure_reasons

    params = scenarios.LoadParams("slice-added", 3, 6, 3, devices_per_node=1, time_limit=120)
    result = {"events": 2, "setup_seconds": 100.5,
              "failed_events": [{"event": 2, "reason": "event 2 (give node dev-1 its devices): no waiting pod bound "
                                                      "within 60s; node dev-1 has 0 ResourceSlices"}]}
    reasons = failure_reasons(params, result, failures=2, report_dir=tmp_path)
    assert reasons[0].startswith("event 2 (give node dev-1 its devices)")
    assert reasons[1].startswith("1 of 3 events never fired: the run ended after 2 (--time-limit 120s, set-up took "
                                 "100.5s of it")
    assert len(reasons) == 2
    assert failure_reasons(params, {"events": 3, "failed_events": []}, failures=1, report_dir=tmp_path) == [
        f"1 events fired but neither measured nor failed; see {tmp_path / 'locust.log'}"]
    assert failure_reasons(params, {"events": 3}, failures=0, report_dir=tmp_path) == []


def test_cli_refuses_before_starting_anything(tmp_path):
    env = {"DRA_HARNESS_STATE_DIR": str(tmp_path / "state"), "DRA_HARNESS_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "harness.cli", "load", "run", "--scenario", "nope", "--nodes", "0"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    assert "--scenario: nope: unknown scenario" in result.stderr and "--nodes" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()


def test_metrics_delta_and_missed_requeues():
    before = metrics.parse('scheduler_queue_incoming_pods_total{event="X",queue="active"} 2\n'
                           'scheduler_pod_scheduled_after_flush_total 0\n')
    after = metrics.parse('scheduler_queue_incoming_pods_total{event="X",queue="active"} 7\n'
                          'scheduler_pod_scheduled_after_flush_total 1\n'
                          'scheduler_pending_pods{queue="unschedulable"} 3\n'
                          'scheduler_queueing_hint_execution_duration_seconds_count{event="E",hint="Queue",plugin="P"} 4\n'
                          'scheduler_pre_queueing_hint_evaluations_total{plugin="DynamicResources",result="narrowed"} 9\n')
    summary = metrics.summary(metrics.delta(before, after))
    assert summary["preQueueingHints"] == {"DynamicResources/narrowed": 9.0}
    assert summary["incomingByEvent"] == {"X": 5.0}
    assert summary["missedRequeues"] == 1.0
    assert summary["hints"] == {"P/E/Queue": 4.0}
    assert summary["hintCounts"].startswith("lower bounds")  # the scheduler drops what its buffer cannot hold
    assert summary["pendingAfter"] == {"queue=unschedulable": 3.0}


def test_sweep_events_cap_only_latency_scenarios():
    assert scenarios.sweep_events("device-freed", 20, 10) == 10
    assert scenarios.sweep_events("throughput", 1, 5000) == 1
    assert scenarios.sweep_events("steady-state", 600, 0) == 600


def test_closed_loop_ignores_the_rate_and_bounds_arrivals_by_events():
    """--in-flight K --duration S: the open loop's --rate and its events/rate bound do not apply."""
    params = scenarios.validate(scenarios.LoadParams("steady-state", 10, 30, 100000, devices_per_node=4, rate=0,
                                                     in_flight=10, duration=10, time_limit=60))
    assert params.closed_loop
    assert not scenarios.LoadParams("steady-state", 10, 0, 10).closed_loop
