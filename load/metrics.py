"""The scheduler's own view of a load run, from its /metrics before and after: which events requeued
pods, how the queueing hints decided, and whether any pod was only rescued by the periodic flush
(a missed requeue)."""

from __future__ import annotations

import re
from collections import defaultdict

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
WATCHED = ("scheduler_queue_incoming_pods_total", "scheduler_pod_scheduled_after_flush_total",
           "scheduler_queueing_hint_execution_duration_seconds_count", "scheduler_pending_pods",
           "scheduler_schedule_attempts_total", "scheduler_queueing_hint_execution_duration_seconds_sum",
           "process_cpu_seconds_total", "scheduler_pre_queueing_hint_evaluations_total")


def parse(text: str, names: tuple[str, ...] = WATCHED) -> dict[str, dict[tuple, float]]:
    """metric name -> {sorted label pairs: value}, for the metrics we care about."""
    result: dict[str, dict[tuple, float]] = defaultdict(dict)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match or match[1] not in names:
            continue
        labels = tuple(sorted(_LABEL.findall(match[2] or "")))
        try:
            result[match[1]][labels] = float(match[3])
        except ValueError:
            continue
    return dict(result)


def delta(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Per metric and label set, after - before (gauges: the value after), with readable label keys."""
    out: dict[str, dict[str, float]] = {}
    for name, samples in after.items():
        gauge = name == "scheduler_pending_pods"
        rows = {}
        for labels, value in samples.items():
            change = value if gauge else value - before.get(name, {}).get(labels, 0.0)
            if change:
                rows[",".join(f"{k}={v}" for k, v in labels) or "total"] = round(change, 6)
        out[name] = rows
    return out


# Both hint metrics reach Prometheus through kube-scheduler's asynchronous recorder, which buffers 1000
# observations and flushes them once a second, dropping what does not fit (pkg/scheduler/metrics/
# metric_recorder.go, `select ... default`). A second with more hint evaluations than that loses the rest,
# so these counts are lower bounds; the incoming-pods counter is incremented directly and is exact.
HINT_COUNTS = "lower bounds: the scheduler drops hint observations beyond 1000 per second"


def summary(change: dict[str, dict[str, float]]) -> dict:
    """The numbers a report shows: requeues by event, hint decisions, flush rescues (must be 0)."""
    incoming: dict[str, float] = defaultdict(float)
    for key, value in change.get("scheduler_queue_incoming_pods_total", {}).items():
        labels = dict(part.split("=", 1) for part in key.split(",") if "=" in part)
        incoming[labels.get("event", "?")] += value
    hints: dict[str, float] = defaultdict(float)
    for key, value in change.get("scheduler_queueing_hint_execution_duration_seconds_count", {}).items():
        labels = dict(part.split("=", 1) for part in key.split(",") if "=" in part)
        hints[f"{labels.get('plugin', '?')}/{labels.get('event', '?')}/{labels.get('hint', '?')}"] += value
    # SchedulerPreQueueingHints (alpha in 1.37): per plugin, how often an event's pod set was narrowed to
    # the pods it concerns, or left at every waiting pod (all_pods)
    pre_hints: dict[str, float] = defaultdict(float)
    for key, value in change.get("scheduler_pre_queueing_hint_evaluations_total", {}).items():
        labels = dict(part.split("=", 1) for part in key.split(",") if "=" in part)
        pre_hints[f"{labels.get('plugin', '?')}/{labels.get('result', '?')}"] += value
    flushed = sum(change.get("scheduler_pod_scheduled_after_flush_total", {}).values())
    cpu = sum(change.get("process_cpu_seconds_total", {}).values())
    return {"incomingByEvent": dict(sorted(incoming.items())), "hints": dict(sorted(hints.items())),
            "preQueueingHints": dict(sorted(pre_hints.items())), "hintCounts": HINT_COUNTS,
            "scheduledAfterFlush": flushed, "missedRequeues": flushed,
            "pendingAfter": change.get("scheduler_pending_pods", {}),
            "cpuSeconds": round(cpu, 3)}  # the scheduler process's own CPU (its process_cpu_seconds_total)
