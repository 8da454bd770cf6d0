"""The figures of the throughput scenario, from the times the harness recorded (pure arithmetic):

- creation rate: pods created / the creation window (first create call issued -> last one returned);
- end-to-end rate: pods bound / (first create call issued -> last binding seen);
- scheduler_perf's SchedulingThroughput, computed the way its throughputCollector does
  (test/integration/scheduler_perf/util.go of k8s.io/kubernetes v1.37.2): a sample every second of
  (newly scheduled pods / seconds since the last sample); the first tick that sees a scheduled pod
  only sets the baseline; ticks without a new binding are skipped and the next rate is recorded once
  per skipped tick too; then the average and Perc50/90/95/99 as sorted[ceil(n * p / 100) - 1].

Upstream samples live with a ticker; here the ticks are replayed over the recorded binding times,
which is what a ticker with perfect timing would see. Ticks start at the first create call (upstream
starts its collector right before creating the pods) and end with the first tick at or after the last
binding (upstream stops when its 1 s poll sees every pod scheduled, so it may or may not take that
last tick; taking it puts every pod in a sample).

And when not every pod was bound: why, grouped from the pods' PodScheduled conditions. For the
steady-state closed loop: the most pods waiting at any one time.
"""

from __future__ import annotations

import math
import re
from typing import Any

SAMPLE_INTERVAL = 1.0  # scheduler_perf's throughputSampleInterval


def scheduler_perf_samples(bound_times: list[float], start: float, interval: float = SAMPLE_INTERVAL) -> list[float]:
    """Per-interval scheduling rates (pods/s), as scheduler_perf's throughputCollector records them."""
    if not bound_times:
        return []
    times = sorted(bound_times)
    last_binding = times[-1]
    samples: list[float] = []
    seen = 0  # bindings at or before the current tick
    started = False
    last_count, last_tick, skipped = 0, start, 0
    tick_number = 0
    while True:
        tick_number += 1
        tick = start + tick_number * interval
        while seen < len(times) and times[seen] <= tick:
            seen += 1
        if seen == 0:
            continue
        if not started:  # the first sample is the baseline, as upstream (likely an outlier)
            started, last_count, last_tick = True, seen, tick
        elif seen == last_count:
            skipped += 1
        else:
            rate = (seen - last_count) / (tick - last_tick)
            samples.extend([rate] * (skipped + 1))
            last_count, last_tick, skipped = seen, tick, 0
        if tick >= last_binding:
            return samples


def summarize_samples(samples: list[float]) -> dict | None:
    """scheduler_perf's DataItem for SchedulingThroughput: Average, Perc50/90/95/99 (pods/s)."""
    if not samples:
        return None  # upstream: "Failed to measure SchedulingThroughput ... Increase pods and/or nodes"
    ordered = sorted(samples)
    n = len(ordered)

    def perc(p: int) -> float:
        return round(ordered[math.ceil(n * p / 100) - 1], 2)

    return {"samples": n, "Average": round(sum(ordered) / n, 2), "Perc50": perc(50), "Perc90": perc(90),
            "Perc95": perc(95), "Perc99": perc(99)}


def figures(created: dict[str, tuple[float, float]], bound_at: dict[str, float],
            interval: float = SAMPLE_INTERVAL) -> dict:
    """created: pod -> (create call issued, returned); bound_at: pod -> binding seen (same clock).
    Only pods of `created` count."""
    if not created:
        return {"pods": 0, "bound": 0, "pods_per_second": 0.0, "creation": None, "end_to_end": None,
                "scheduler_perf": None}
    first_issued = min(issued for issued, _ in created.values())
    last_returned = max(returned for _, returned in created.values())
    bindings = [bound_at[name] for name in created if name in bound_at]
    creation_seconds = last_returned - first_issued
    result: dict[str, Any] = {"pods": len(created), "bound": len(bindings),
              "creation": {"seconds": round(creation_seconds, 2),
                           "pods_per_second": round(len(created) / creation_seconds, 1) if creation_seconds > 0 else None},
              "end_to_end": None, "scheduler_perf": None, "pods_per_second": 0.0}
    if bindings:
        seconds = max(bindings) - first_issued
        rate = round(len(bindings) / seconds, 1) if seconds > 0 else None
        result["end_to_end"] = {"seconds": round(seconds, 2), "pods_per_second": rate,
                                "drain_after_creation_seconds": round(max(bindings) - last_returned, 2)}
        result["pods_per_second"] = rate  # the headline figure: end to end, every pod counted
        result["scheduler_perf"] = summarize_samples(scheduler_perf_samples(bindings, first_issued, interval))
        creation_rate = result["creation"]["pods_per_second"]
        if creation_rate and rate:
            result["creation_to_binding_ratio"] = round(creation_rate / rate, 1)
    return result


def most_in_flight(created: dict[str, tuple[float, float]], bound_at: dict[str, float]) -> int:
    """The most pods created (from their create call's issue) and not yet bound at any one time: what a
    closed loop of K pods must keep at or below K. A pod never bound stays in flight to the end."""
    changes = [(issued, 1) for issued, _ in created.values()]
    changes += [(bound_at[name], -1) for name in created if name in bound_at]
    most = current = 0
    for _, change in sorted(changes, key=lambda item: (item[0], item[1])):  # a binding before a create at a tie
        current += change
        most = max(most, current)
    return most


_QUOTED = re.compile(r'"[^"]*"')


def unbound_reasons(pods: list, expected: set[str]) -> dict[str, int]:
    """Why each pod of `expected` (the pods the harness did not see bound) is not bound, grouped: the scheduler's PodScheduled
    condition (reason: message, with quoted object names blanked so that pods group), scheduling
    gates, or no attempt yet. `pods`: V1Pod objects as listed from the API."""
    reasons: dict[str, int] = {}
    found = set()
    for pod in pods:
        name = pod.metadata.name
        if name not in expected:
            continue
        found.add(name)
        reason = "bound on the API server, but the harness's watch did not see it" if pod.spec.node_name else _why(pod)
        reasons[reason] = reasons.get(reason, 0) + 1
    missing = len(expected - found)
    if missing:
        reasons["pod does not exist any more"] = missing
    return dict(sorted(reasons.items(), key=lambda item: -item[1]))


def _why(pod) -> str:
    if pod.metadata.deletion_timestamp:
        return "being deleted"
    gates = [g.name for g in (pod.spec.scheduling_gates or [])]
    if gates:
        return f"gated by {', '.join(gates)}"
    condition = next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None)
    if condition is None:
        return "not tried by the scheduler yet (no PodScheduled condition)"
    message = _QUOTED.sub('"…"', " ".join((condition.message or "").split()))
    return f"{condition.reason or condition.status}: {message}" if message else str(condition.reason or condition.status)
