"""A load run says which event failed and why (issue 16, item 14): each failed event is a locust
failure whose message names the event, what it acted on and what the watch, the API server and the
scheduler showed; the summary lists the same reasons, and locust's final failures CSV holds them.

On a real cluster, a zero event timeout makes every event time out deterministically (no binding can
be seen before the deadline), which exercises the timeout path end to end."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from harness.jobs import load_runner
from load import scenarios

pytestmark = pytest.mark.integration


def test_timed_out_events_are_failures_with_reasons(tmp_path, dra_run_id):
    params = dataclasses.replace(scenarios.LoadParams("device-freed", nodes=2, pending=3, events=2,
                                                      devices_per_node=1, time_limit=120), event_timeout=0.0)
    summary = load_runner.run(params, report_dir=tmp_path, name=f"ld-fail-{dra_run_id[:5]}")
    reasons = summary["failure_reasons"]
    assert summary["failures"] >= 1, summary
    assert len(reasons) == summary["failures"], reasons  # every unmeasured event has its reason
    for reason in reasons:
        assert reason.startswith("event "), reason
        assert "(delete running pod fill-" in reason, reason
        assert "no waiting pod bound within 0s" in reason, reason
        assert "watch: " in reason and "pod events" in reason, reason  # what the watch saw
    with open(tmp_path / "locust_failures_final.csv") as handle:
        errors = [row["Error"] for row in csv.DictReader(handle)]
    assert len(errors) == len(reasons)
    assert all("no waiting pod bound within 0s" in error for error in errors), errors


def test_a_failed_set_up_ends_the_run_at_once_with_its_reason(tmp_path, dra_run_id):
    """A set-up that cannot finish (here: a zero bound for filling the devices) ends the run with the
    step and how far it got, fires no event and does not wait for --time-limit (found at 10,000 nodes,
    where filling every device took longer than the set-up's bound: the events then ran against a
    half-made set-up, each failing with a traceback, and the run waited out its time limit)."""
    params = dataclasses.replace(scenarios.LoadParams("device-freed", nodes=2, pending=3, events=2,
                                                      devices_per_node=1, time_limit=900), setup_timeout=0.0)
    summary = load_runner.run(params, report_dir=tmp_path, name=f"ld-setup-{dra_run_id[:5]}")
    assert summary["events"] == 0, summary  # nothing fired
    assert summary["failures"] == 2, summary
    [reason] = summary["failure_reasons"]
    assert reason.startswith("the set-up failed, no event was fired: TimeoutError: timed out after 0s waiting for "
                             "every device to be allocated ("), reason
    assert " of 2 bound)" in reason, reason
    assert summary["generator"]["wall_seconds"] < params.time_limit / 2, summary["generator"]  # ended by itself
    assert "Traceback" not in (tmp_path / "locust.log").read_text()
