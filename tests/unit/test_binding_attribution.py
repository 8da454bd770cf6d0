"""Which binding answers a load event (load/cluster_ops.BindingWatch.next_binding_after): pure logic
over recorded binding times, no cluster. CI on a loaded machine once saw the scheduler bind a pod
before the client had read the response of the call that created it: the event was counted as
missed ("no waiting pod bound within 60s") though its pod was bound at once."""

from __future__ import annotations

import time

from load.cluster_ops import BindingWatch


def _watch(**bound_at: float) -> BindingWatch:
    watch = BindingWatch(core=None, namespace="n")  # never started: only the bookkeeping is used
    watch.bound_at.update(bound_at)
    return watch


def test_a_binding_seen_while_the_call_was_returning_counts_as_zero():
    now = time.monotonic()
    watch = _watch(**{"arrival-4": now - 0.2})
    assert watch.next_binding_after(now, timeout=0.1, among={"arrival-4"}, issued=now - 0.5) == 0.0
    assert "arrival-4" in watch.claimed


def test_a_binding_before_the_call_was_issued_is_not_this_events():
    now = time.monotonic()
    watch = _watch(**{"wait-0": now - 2.0})
    assert watch.next_binding_after(now, timeout=0.1, issued=now - 0.5) is None
    assert watch.claimed == set()


def test_latency_counts_from_the_call_returning_and_each_binding_answers_one_event():
    now = time.monotonic()
    watch = _watch(**{"wait-0": now + 0.3, "wait-1": now + 0.7})
    assert abs(watch.next_binding_after(now, timeout=0.1, issued=now - 0.1) - 0.3) < 1e-9
    assert abs(watch.next_binding_after(now, timeout=0.1, issued=now - 0.1) - 0.7) < 1e-9
    assert watch.next_binding_after(now, timeout=0.1, issued=now - 0.1) is None


def test_without_issued_the_window_starts_when_the_call_returned():
    now = time.monotonic()
    watch = _watch(**{"arrival-1": now - 0.2})
    assert watch.next_binding_after(now, timeout=0.1, among={"arrival-1"}) is None
