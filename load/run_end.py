"""The end of a load run: the measured events counted until this process's share is done, a worker's share
reported to the master and merged there (distributed mode), the throughput burst waited for, then the
measured window closed and locust stopped."""

from __future__ import annotations

import time

import gevent
from locust.runners import MasterRunner, WorkerRunner

from harness.core import conditions
from load import requeue_kinds, scenarios
from load.cluster_view import _wait_queue_settled
from load.processstate import STATE
from load.run_setup import _worker_count

SHARE_DONE = "dra-share-done"  # a worker's message to the master: its share is done, with what it measured


# locust's init listener (registered by load/locustfile.py)
def _on_init(environment, **_) -> None:
    if isinstance(environment.runner, MasterRunner):  # workers report their share when it is done
        environment.runner.register_message(SHARE_DONE, _share_reported, concurrent=True)


# the request names of measured events: the latency scenarios', and requeue-correctness's, one per kind
EVENT_REQUEST_NAMES = frozenset({"unblocked -> bound", *requeue_kinds.BY_NAME})


# locust's request listener (registered by load/locustfile.py)
def _on_request(name, **_) -> None:
    if name in EVENT_REQUEST_NAMES:  # one event measured (bound or failed)
        STATE.measured = STATE.measured + 1
        # checked once locust's own listener has counted this request too (it was registered after
        # ours), so a worker's last stats report includes it
        gevent.spawn(_check_share_done)


def _check_share_done() -> None:
    """Called after every measured event (throughput: every create call): once this process's share is
    done, a local run ends (after the burst is bound: _finish_run); a worker tells the master."""
    environment = STATE.environment
    if STATE.environment.parsed_options.scenario in scenarios.BURST_SCENARIOS:
        done = len(STATE.created) + len(STATE.create_failed) >= STATE.budget
    else:
        done = STATE.measured >= STATE.budget
    if not done or STATE.share_done:
        return
    STATE.share_done = True
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        runner._send_stats()  # locust's aggregate on the master then has every request before the run ends
        runner.send_message(SHARE_DONE, {"fired": STATE.fired, "latencies": STATE.latencies,
                                         "failures": STATE.failures, "pods_created": STATE.pods_created,
                                         "created": STATE.created, "create_failed": STATE.create_failed,
                                         "requeue": STATE.requeue})
    else:
        gevent.spawn(_finish_run, environment)


def _share_reported(environment, msg) -> None:
    """On the master: a worker's share is done; when all are, the run ends."""
    STATE.shares.append(msg.data)
    if len(STATE.shares) == _worker_count(environment.parsed_options):
        _finish_run(environment)


def _merge_shares() -> None:
    """On the master: the workers' measurements join its own (it measured nothing itself)."""
    shares, STATE.shares = STATE.shares, []
    for share in shares:
        STATE.fired += share["fired"]
        STATE.latencies.extend(share["latencies"])
        STATE.failures.extend(share["failures"])
        STATE.pods_created += share["pods_created"]
        STATE.created.update({name: tuple(times) for name, times in share["created"].items()})
        STATE.create_failed.update(share["create_failed"])
        STATE.requeue.extend(share.get("requeue", []))


def _finish_run(environment) -> None:
    """Every share is done. throughput: wait until every created pod is bound, or until no pod got
    bound for --event-timeout seconds; then end the measured window and the run."""
    options = environment.parsed_options
    if options.scenario in scenarios.BURST_SCENARIOS:
        _merge_shares()
        missing = STATE.watch.wait_all_bound(set(STATE.created), options.event_timeout)
        for name, (issued, _) in sorted(STATE.created.items(), key=lambda item: item[1]):
            bound = STATE.watch.bound_at.get(name)
            environment.events.request.fire(
                request_type="throughput", name="created -> bound", context={}, response_length=0,
                response_time=((bound if bound is not None else time.monotonic()) - issued) * 1000,
                exception=None if name not in missing else PodNotBound(
                    f"pod {name} not bound; no pod got bound for {options.event_timeout:.0f}s"))
    elif STATE.queue_settle is not None:
        STATE.queue_settle["after"] = _wait_queue_settled(options)
    STATE.window_end = conditions.snapshot(options.conditions_root_pid or None)
    environment.runner.quit()


class PodNotBound(Exception):
    """A pod of the throughput burst that the scheduler did not bind."""
