"""The results of a load run (locust's test_stop, written by the master or the local runner): the results
file (JSON), locust's final CSV, then the run's objects cleaned up."""

from __future__ import annotations

import collections
import csv
import json
import time

import psutil
from locust.runners import WorkerRunner
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from harness.core import conditions
from load import cluster_ops as ops
from load import metrics, requeue_kinds, scenarios, throughput
from load.cluster_view import _clients, _scrape
from load.processstate import STATE
from load.run_end import _merge_shares


# locust's test_stop listener (registered by load/locustfile.py)
def _teardown(environment, **_) -> None:
    options = environment.parsed_options
    if STATE.watch is not None:
        STATE.watch.stop()
    if isinstance(environment.runner, WorkerRunner) or not options.results_file:
        return
    window_end = STATE.window_end or conditions.snapshot(options.conditions_root_pid or None)
    after = _scrape(options)
    cpu = psutil.Process().cpu_times()
    wall = time.monotonic() - STATE.wall_start
    used = (cpu.user + cpu.system) - (STATE.cpu_start.user + STATE.cpu_start.system)
    _merge_shares()
    result = {"scenario": options.scenario, "nodes": options.nodes, "pending": options.pending,
              "events": STATE.fired, "latencies_ms": [round(x * 1000, 2) for x in STATE.latencies],
              "failed_events": STATE.failures, "setup_seconds": STATE.setup_seconds, "setup_error": STATE.setup_error,
              "scheduler": metrics.summary(metrics.delta(STATE.metrics_before, after)) if after else {},
              "generator": {"wall_seconds": round(wall, 2), "cpu_seconds": round(used, 2),
                            "cpu_percent": round(100 * used / wall, 1) if wall else 0.0,
                            "events_per_second": round(STATE.fired / wall, 2) if wall else 0.0,
                            "pods_created": STATE.pods_created,
                            "pods_created_per_second": round(STATE.pods_created / wall, 1) if wall else 0.0}}
    if STATE.window_start is not None:
        result["conditions"] = conditions.summarize(STATE.window_start, window_end, psutil.cpu_count() or 1)
    if STATE.queue_settle is not None:
        result["queue_settle"] = STATE.queue_settle
    if after and STATE.metrics_window_start:  # the scheduler's CPU over the measured window only
        result["scheduler_window"] = metrics.summary(metrics.delta(STATE.metrics_window_start, after))
    if STATE.setup_error is not None:
        pass  # nothing was measured: the scenario's own figures would describe a half-made set-up
    elif options.scenario == "steady-state" and options.in_flight:
        # closed loop: how fast the scheduler went with K pods always waiting (every pod created counts,
        # including the last ones, created before --duration ran out and bound after)
        result["steady_state"] = {"mode": "closed loop", "in_flight": options.in_flight, "duration": options.duration,
                                  "arrivals": STATE.fired,
                                  "throughput": throughput.figures(STATE.created, STATE.watch.bound_at),
                                  "most_waiting_at_once": throughput.most_in_flight(STATE.created,
                                                                                    STATE.watch.bound_at)}
    elif options.scenario == "steady-state":
        result["steady_state"] = {"mode": "open loop", "rate": options.rate, "arrivals": STATE.fired,
                                  "late_arrivals": STATE.late_arrivals,
                                  "max_lag_seconds": round(STATE.max_lag, 3)}
    if options.scenario == "requeue-correctness" and STATE.setup_error is None:
        result["requeueCorrectness"] = requeue_kinds.rows(STATE.requeue, options.event_timeout)
        if STATE.requeue_left_out:
            result["requeueCorrectnessLeftOut"] = [{"kind": kind, "reason": why}
                                                   for kind, why in STATE.requeue_left_out.items()]
    if options.scenario in scenarios.BURST_SCENARIOS and STATE.setup_error is None:
        result["throughput"] = _throughput(STATE.core, STATE.namespace, options.pending - options.pending // 2)
    # locust's own aggregate (on a master it includes every worker's requests; percentiles are locust's
    # approximations, so the raw latencies above are preferred when this process measured them itself)
    total = environment.runner.stats.total
    result["locust"] = {"requests": total.num_requests, "failures": total.num_failures,
                        "p50_ms": total.get_response_time_percentile(0.5) if total.num_requests else None,
                        "p99_ms": total.get_response_time_percentile(0.99) if total.num_requests else None}
    with open(options.results_file, "w") as handle:
        json.dump(result, handle, indent=2)
    if options.csv_prefix:
        # locust rewrites its CSV every few seconds, so a short run's CSV can miss the last requests:
        # write the final numbers once more, with locust's own CSV code.
        stats_csv = StatsCSV(environment, PERCENTILES_TO_REPORT)
        with open(f"{options.csv_prefix}_stats_final.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(stats_csv.requests_csv_columns)
            stats_csv._requests_data_rows(writer)
        with open(f"{options.csv_prefix}_failures_final.csv", "w", newline="") as handle:  # the same for failures
            writer = csv.writer(handle)
            writer.writerow(stats_csv.failures_columns)
            stats_csv._failures_data_rows(writer)
    core, resource = _clients(options)
    ops.cleanup(core, resource, STATE.namespace, options.run_label)


def _throughput(core, namespace: str, burst: int) -> dict:
    """The burst's figures (load/throughput.py); complete only if every pod was created and bound,
    otherwise how many were not and why, from the pods themselves."""
    created, failed = STATE.created, STATE.create_failed
    result = throughput.figures(created, STATE.watch.bound_at)
    unbound = {name for name in created if name not in STATE.watch.bound_at}
    reasons = dict(collections.Counter(failed.values()))
    if unbound:
        pods = core.list_namespaced_pod(namespace, label_selector=ops.LOAD_LABEL).items
        reasons.update(throughput.unbound_reasons(pods, unbound))
    never_created = burst - len(created) - len(failed)  # the run ended (--time-limit) before creating them
    if never_created:
        reasons["never created: the run ended first (--time-limit)"] = never_created
    result.update(burst=burst, not_created=burst - len(created), unbound=len(unbound),
                  complete=len(created) == burst and not unbound, reasons=reasons)
    return result
