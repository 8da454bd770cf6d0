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
])
def test_impossible_parameters_are_refused(overrides, flag, fragment):
    assert any(source == flag and fragment in problem for source, problem in _problems(**overrides))


def test_cli_refuses_before_starting_anything(tmp_path):
    env = {"DRA_HARNESS_STATE_DIR": str(tmp_path / "state"), "DRA_HARNESS_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "harness.cli", "load", "run", "--scenario", "nope", "--nodes", "0"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 1
    assert "--scenario: nope: unknown scenario" in result.stderr and "--nodes" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()


def test_metrics_delta_and_missed_requeues():
    before = metrics.parse('scheduler_queue_incoming_pods_total{event="X",queue="active"} 2\n'
                           'scheduler_pod_scheduled_after_flush_total 0\n')
    after = metrics.parse('scheduler_queue_incoming_pods_total{event="X",queue="active"} 7\n'
                          'scheduler_pod_scheduled_after_flush_total 1\n'
                          'scheduler_pending_pods{queue="unschedulable"} 3\n'
                          'scheduler_queueing_hint_execution_duration_seconds_count{event="E",hint="Queue",plugin="P"} 4\n')
    summary = metrics.summary(metrics.delta(before, after))
    assert summary["incomingByEvent"] == {"X": 5.0}
    assert summary["missedRequeues"] == 1.0
    assert summary["hints"] == {"P/E/Queue": 4.0}
    assert summary["pendingAfter"] == {"queue=unschedulable": 3.0}
