"""locust users for the DRA load scenarios (run through `dra-harness load run`, or locust directly:
`locust -f load/locustfile.py --headless --kubeconfig K --scenario device-freed ...`).

Set-up happens once, on the master (or the local runner): waiting pods are created and parked as
unschedulable before the first event. Each user task performs one unblocking event and reports the
time until a waiting pod is bound through locust's request event, so the UI, CSV and HTML reports show
percentiles per event kind. The run stops once --events events (in total; each worker process takes
its share) were measured, or at --run-time, whichever comes first. `throughput` ends only when every
pod of the burst is bound, or when no pod got bound for --event-timeout seconds (then the results say
how many were not bound and why).
"""

from __future__ import annotations

import collections
import csv
import itertools
import json
import logging
import os
import time

import gevent
import locust.runners
import psutil
from locust import User, events, task
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from fake_devices import keyfiles
from harness.core import conditions
from harness.k8s import api, errors
from harness.k8s.client import https_get, tls_context
from load import cluster_ops as ops
from load import metrics, requeue_kinds, scenarios, throughput
from load.processstate import ProcessState

STATE = ProcessState()  # per process: clients, watch, queues of event targets, counters

# Distributed mode: the master's set-up and a worker's start (locust rebuilds its argument parser for
# every option the master sends) hold the gevent loop for seconds on a loaded machine, longer than
# locust's 3 missed heartbeats, after which the master drops its workers and stops the run. The API
# classes are imported above (harness.k8s.api), before any worker connects, for the same reason (importing them takes
# seconds); and a worker may miss up to a minute of heartbeats.
locust.runners.HEARTBEAT_LIVENESS = 60


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    group = parser.add_argument_group("dra-harness")
    group.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="cluster under load")
    group.add_argument("--scenario", default="device-freed")
    group.add_argument("--nodes", type=int, default=10, help="nodes of the cluster (named <node prefix>0...)")
    group.add_argument("--node-prefix", default="dev-", help="the nodes are <prefix>0 .. <prefix>N-1")
    group.add_argument("--namespace", default="", help="where the run's pods live (default: load-<scenario>)")
    group.add_argument("--run-label", default="true",
                       help="value of the dra-harness.x-k8s.io/load label on every object the run creates; "
                            "clean-up removes only the objects with this value")
    group.add_argument("--node-taint", default="",
                       help="a taint key on the run's own nodes: the pods tolerate it and the node lifecycle "
                            "taints (nodes without a kubelet); default: none")
    group.add_argument("--extended-resource", default=scenarios.EXTENDED_RESOURCE,
                       help="extended-throughput: the extended resource the pods ask for")
    group.add_argument("--pending", type=int, default=10)
    group.add_argument("--events", type=int, default=10,
                       help="stop after this many events in total (split across worker processes)")
    group.add_argument("--devices-per-node", type=int, default=4)
    group.add_argument("--driver-instance", default="load")
    group.add_argument("--driver-domain", default="load.example.com")
    group.add_argument("--device-profile", default="load-gpu")
    group.add_argument("--scheduler-metrics-url", default="")
    group.add_argument("--results-file", default="")
    group.add_argument("--event-timeout", type=float, default=60.0)
    group.add_argument("--setup-timeout", type=float, default=600.0, help="bound of each wait of the set-up")
    group.add_argument("--rate", type=float, default=10.0, help="steady-state: arrivals per second (whole run)")
    group.add_argument("--in-flight", type=int, default=0,
                       help="steady-state closed loop: one user per pod kept waiting, each replacing its pod once "
                            "bound (0: open loop at --rate)")
    group.add_argument("--duration", type=float, default=0.0,
                       help="steady-state closed loop: seconds from the first arrival; no new pod after that")
    group.add_argument("--conditions-root-pid", type=int, default=0,
                       help="the run's own processes for the CPU conditions: this pid and its descendants "
                            "(default: this process)")


@events.init.add_listener
def _on_init(environment, **_) -> None:
    if isinstance(environment.runner, MasterRunner):  # workers report their share when it is done
        environment.runner.register_message(SHARE_DONE, _share_reported, concurrent=True)


def _clients(options):
    if STATE.api is None:
        configuration = keyfiles.load_configuration(options.kubeconfig)
        configuration.connection_pool_maxsize = 64  # before the ApiClient exists: it sizes its pool once
        client = api.ApiClient(configuration)
        STATE.api, STATE.core, STATE.resource = client, api.CoreV1Api(client), api.ResourceV1Api(client)
    return STATE.core, STATE.resource


def _scrape(options) -> dict:
    if not options.scheduler_metrics_url:
        return {}

    status, body = https_get(options.scheduler_metrics_url, tls_context(options.kubeconfig), timeout=10)
    return metrics.parse(body) if status == 200 else {}


@events.test_start.add_listener
def _setup(environment, **_) -> None:
    options = environment.parsed_options
    core, resource = _clients(options)
    namespace = options.namespace or f"load-{options.scenario}"
    gpu_driver = f"gpu.{options.driver_domain}"
    STATE.new_run()
    STATE.namespace, STATE.driver, STATE.environment = namespace, gpu_driver, environment
    STATE.cpu_start, STATE.wall_start = psutil.Process().cpu_times(), time.monotonic()
    STATE.budget = _budget(options, environment.runner)
    STATE.targets = _targets(options, environment.runner)
    if isinstance(environment.runner, WorkerRunner):
        STATE.watch = ops.BindingWatch(core, namespace).start()
        return  # set-up belongs to the master; a worker takes its share of the event targets
    try:
        _arrange(options, core, resource, namespace, gpu_driver)
    except Exception as err:  # noqa: BLE001 - any failed step: the run ends with its reason, no event fired
        # locust would only log an error of this handler and start the users on a half-made set-up
        STATE.setup_error = f"{_error_text(err)} (after {time.monotonic() - STATE.wall_start:.0f}s)"
        logging.error("set-up failed: %s", STATE.setup_error)
        gevent.spawn(environment.runner.quit)


def _arrange(options, core, resource, namespace: str, gpu_driver: str) -> None:
    """The scenario's set-up, on the master (or the local runner): objects, filled devices, parked pods,
    then the start of the measured window."""
    STATE.metrics_before = _scrape(options)
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except errors.Conflict:  # it exists
        pass
    ops.wait_until("the namespace's default ServiceAccount",
                   lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(namespace).items), 60)
    gpu_class = f"{options.driver_instance}-gpu"
    resource.create_namespaced_resource_claim_template(namespace, ops.claim_template("one-gpu", gpu_class))
    nodes = [f"{options.node_prefix}{i}" for i in range(options.nodes)]
    scenario = options.scenario
    waiting = {f"wait-{i}" for i in range(options.pending)}

    if scenario in ("device-freed", "claim-shared"):
        fill = [f"fill-{i}" for i in range(options.nodes * options.devices_per_node)]
        ops.create_pods(core, namespace, [_pod(options, n, template="one-gpu") for n in fill])
        ops.wait_all_bound(core, namespace, set(fill), "every device to be allocated", options.setup_timeout)
    elif scenario == "taint-removed":
        for node in nodes:
            resource.create_device_taint_rule(ops.taint_rule(f"load-hold-{node}", gpu_driver, node,
                                                             label=options.run_label))
    elif scenario in scenarios.BURST_SCENARIOS or scenario == "steady-state":
        if scenario == "extended-throughput":  # pods get the device through the class's extended resource
            resource.create_device_class(ops.extended_class(f"{options.driver_instance}-extended", gpu_driver,
                                                            options.extended_resource, label=options.run_label))
        first = [f"init-{i}" for i in range(options.pending // 2 if scenario != "steady-state" else options.pending)]
        ops.create_pods(core, namespace, [_burst_pod(options, n) for n in first])
        ops.wait_all_bound(core, namespace, set(first), "the initial pods to be scheduled", options.setup_timeout)
        waiting = set()
    if scenario == "requeue-correctness":
        _arrange_requeue(options, nodes)
        waiting = set()
    if scenario == "claim-shared":
        scheduling = api.SchedulingV1beta1Api(STATE.api)
        groups = [f"grp-{i}" for i in range(options.pending // 2)]
        for group in groups:
            scheduling.create_namespaced_pod_group(namespace, ops.pod_group_with_claim(group, "one-gpu",
                                                                                       label=options.run_label))
        waiting = {f"{group}-{member}" for group in groups for member in ("a", "b")}
        ops.create_pods(core, namespace, [ops.group_member(f"{g}-{m}", g, "one-gpu", **_marks(options))
                                          for g in groups for m in "ab"])
        ops.wait_until("every group member to be parked as unschedulable",
                       lambda: ops.all_unschedulable(core, namespace, waiting), options.setup_timeout)
        waiting = set()
    if waiting:
        extended = scenario == "class-created"
        bodies = [_pod(options, n, extended=_class_resource(options, n.split('-')[1])) if extended
                  else _pod(options, n, template="one-gpu") for n in sorted(waiting)]
        ops.create_pods(core, namespace, bodies)
        ops.wait_until("every waiting pod to be parked as unschedulable",
                       lambda: ops.all_unschedulable(core, namespace, waiting), options.setup_timeout)
    STATE.watch = ops.BindingWatch(core, namespace).start()
    if scenario not in scenarios.BURST_SCENARIOS:  # the window starts with nothing left to retry
        STATE.queue_settle = {"before": _wait_queue_settled(options)}
    STATE.setup_seconds = round(time.monotonic() - STATE.wall_start, 2)
    STATE.wall_start = time.monotonic()
    STATE.cpu_start = psutil.Process().cpu_times()
    STATE.window_start = conditions.snapshot(options.conditions_root_pid or None)  # the measured window
    STATE.metrics_window_start = _scrape(options)  # the scheduler's counters without the set-up


def _requeue_context(options) -> requeue_kinds.Context:
    return requeue_kinds.Context(STATE.core, STATE.resource, STATE.namespace, options.run_label,
                                 options.driver_instance, options.driver_domain, options.node_taint,
                                 tuple(ops.tolerations(options.node_taint)), api.SchedulingV1beta1Api(STATE.api))


def _requeue_kinds(options) -> tuple:
    """The kinds this cluster can fire, looked up once per process (every process must take them in one order)."""
    if not STATE.requeue_kinds:
        STATE.requeue_kinds, STATE.requeue_left_out = requeue_kinds.served(_requeue_context(options))
    return STATE.requeue_kinds


def _arrange_requeue(options, nodes: list[str]) -> None:
    """requeue-correctness: the run's own driver and class, each event's hold on its node (the pods that must
    run first), then the waiting pods: one per event on its node, the rest (decoys) blocked for good by a
    class that never exists."""
    ctx = _requeue_context(options)
    resource = STATE.resource
    resource.create_device_class(requeue_kinds.device_class(ctx, ctx.device_class, f'device.driver == "{ctx.driver}"'))
    resource.create_namespaced_resource_claim_template(STATE.namespace, ops.claim_template(
        requeue_kinds.TEMPLATE, ctx.device_class))
    resource.create_namespaced_resource_claim_template(STATE.namespace, ops.claim_template(
        requeue_kinds.NEVER_TEMPLATE, f"{ctx.instance}-rq-never"))
    plan = requeue_kinds.assignment(options.events, nodes, _requeue_kinds(options))
    running = [body for i, kind, node in plan for body in kind.arrange(ctx, i, node)]
    ops.create_pods(STATE.core, STATE.namespace, running)
    names = {body["metadata"]["name"] for body in running}
    ops.wait_all_bound(STATE.core, STATE.namespace, names, "the pods holding the devices to be bound",
                       options.setup_timeout)
    waiting = [kind.waiting(ctx, i, node) for i, kind, node in plan]
    waiting += [requeue_kinds.pod(ctx, f"rq-decoy-{j}", None, template_name=requeue_kinds.NEVER_TEMPLATE)
                for j in range(options.pending - options.events)]
    ops.create_pods(STATE.core, STATE.namespace, waiting)
    parked = {body["metadata"]["name"] for body in waiting}
    ops.wait_until("every waiting pod to be parked as unschedulable",
                   lambda: ops.all_unschedulable(STATE.core, STATE.namespace, parked), options.setup_timeout)


def _marks(options) -> dict:
    """What every pod of this run carries: the run's label, and tolerations for its own nodes' taint."""
    return {"label": options.run_label, "node_taint": options.node_taint}


def _pod(options, name: str, **kwargs) -> dict:
    return ops.pod(name, **kwargs, **_marks(options))


def _class_resource(options, number) -> str:
    """class-created: the extended resource of waiting pod `number`'s DeviceClass (in the driver's domain)."""
    return f"{options.driver_domain}/gpu-{number}"


def _budget(options, runner) -> int:
    """How many events (throughput: burst pods) this process performs: all of them, or on a worker its
    share, so that --events counts the whole run however many workers share it."""
    total = options.pending - options.pending // 2 if options.scenario in scenarios.BURST_SCENARIOS else options.events
    if isinstance(runner, WorkerRunner):
        return scenarios.share(total, _worker_count(options), runner.worker_index)
    return total


def _worker_count(options) -> int:
    # a worker learns the number of workers from the master's --expect-workers (locust passes it on)
    return max(1, getattr(options, "expect_workers", 1) or 1)


def _targets(options, runner):
    """What each event acts on, derived from the parameters alone, so a worker can compute its share
    (every n-th target) without talking to the master."""
    nodes = [f"{options.node_prefix}{i}" for i in range(options.nodes)]
    fill = [f"fill-{i}" for i in range(options.nodes * options.devices_per_node)]
    every = {"device-freed": fill, "claim-shared": fill,
             "slice-added": nodes, "taint-removed": [f"load-hold-{n}" for n in nodes],
             "class-created": list(range(options.pending)),
             "steady-state": list(range(options.events)),  # arrival numbers
             "requeue-correctness": list(range(options.events))}.get(options.scenario)  # event numbers
    if every is None:  # throughput: an endless supply of new pod names
        prefix = f"burst-{getattr(runner, 'worker_index', 0)}"
        return (f"{prefix}-{i}" for i in itertools.count())
    if isinstance(runner, WorkerRunner):
        every = every[runner.worker_index::_worker_count(options)]
    return iter(every)


@events.test_stop.add_listener
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


# the request names of measured events: the latency scenarios', and requeue-correctness's, one per kind
EVENT_REQUEST_NAMES = frozenset({"unblocked -> bound", *requeue_kinds.BY_NAME})


@events.request.add_listener
def _on_request(name, **_) -> None:
    if name in EVENT_REQUEST_NAMES:  # one event measured (bound or failed)
        STATE.measured = STATE.measured + 1
        # checked once locust's own listener has counted this request too (it was registered after
        # ours), so a worker's last stats report includes it
        gevent.spawn(_check_share_done)


SHARE_DONE = "dra-share-done"  # a worker's message to the master: its share is done, with what it measured
QUEUE_SETTLE_TIMEOUT = 300.0  # bound of the wait for the scheduler to retry what the events requeued


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


def _wait_queue_settled(options) -> dict:
    """Wait (bounded) until the scheduler's active and backoff queues are empty. At the end of a run,
    the retries the events caused belong to their cost: measured, 20 freed devices with 1000 waiting
    pods left ~900 requeued pods in the active queue when the last event's pod was bound."""
    started = time.monotonic()
    # claim-shared: members of an incomplete PodGroup cycle through the backoff queue with or without
    # events (measured: 6 members in backoff for the whole 120 s of a run), so only the active queue counts
    drained = ("active",) if options.scenario == "claim-shared" else ("active", "backoff")
    queues = _queues(options)
    while _retrying(queues, drained) and time.monotonic() - started < QUEUE_SETTLE_TIMEOUT:
        time.sleep(0.2)
        queues = _queues(options)
    return {"seconds": round(time.monotonic() - started, 2), "drained": list(drained),
            "settled": None if not queues else not _retrying(queues, drained), "queues": queues}


def _retrying(queues: dict[str, float], drained: tuple[str, ...]) -> bool:
    return sum(queues.get(name, 0) for name in drained) > 0


class PodNotBound(Exception):
    """A pod of the throughput burst that the scheduler did not bind."""


def _finish(user: User) -> None:
    """This user has no event left to fire: it stops. The run ends when every fired event was
    measured (_check_share_done), not when the first user runs out."""
    STATE.budget = min(STATE.budget, STATE.fired)
    _check_share_done()
    raise StopUser()


class DRAUser(User):
    """Base class: one task = one unblocking event, reported as a locust request."""

    abstract = True
    target = "?"  # the object the last event acted on
    last_target = "?"  # what the last event did to it, for failure messages

    def _unblock(self) -> None:  # the API call that frees resources for one waiting pod
        raise NotImplementedError

    def _describe(self) -> str:
        return self.last_target

    def _effect(self) -> str:  # after a timeout: whether the event's change took effect ("" if nothing to add)
        return ""

    def _among(self) -> set[str] | None:  # the pods whose binding answers this event (None: any waiting pod)
        return None

    def _after_bound(self) -> None:  # what follows a measured event (steady-state: free the device again)
        return None

    def _request_name(self) -> str:  # the name locust's statistics group the events by
        return "unblocked -> bound"

    def _measured(self, seconds: float | None) -> None:  # the event's outcome (None: no binding within the bound)
        return None

    @task
    def event(self) -> None:
        options = self.environment.parsed_options
        if STATE.setup_error is not None:  # the run is ending: nothing to fire at
            raise StopUser()
        if STATE.fired >= STATE.budget:
            _finish(self)
        STATE.fired += 1
        number = STATE.fired
        started = time.monotonic()
        try:
            self._unblock()
        except StopIteration:  # no target left: not an event
            STATE.fired -= 1
            _finish(self)
        except Exception as err:  # noqa: BLE001 - any failed API call is a failed event, with its reason
            _fail(self, number, f"event {number} ({self._describe()}): the unblocking API call failed: "
                                f"{_error_text(err)}", time.monotonic() - started)
            self._measured(None)
            return
        since = time.monotonic()
        latency = STATE.watch.next_binding_after(since, options.event_timeout, self._among(), issued=started)
        if latency is None:
            reason = ops.explain_unbound(STATE.core, STATE.namespace, STATE.watch, since, _queues(options))
            try:
                reason = "; ".join(filter(None, [self._effect(), reason]))
            except Exception as err:  # noqa: BLE001 - only a diagnosis
                reason += f"; checking the event's effect failed: {_error_text(err)}"
            _fail(self, number, f"event {number} ({self._describe()}): no waiting pod bound within "
                                f"{options.event_timeout:.0f}s; {reason}", options.event_timeout)
            self._measured(None)
            return
        STATE.latencies.append(latency)
        self._measured(latency)
        self.environment.events.request.fire(request_type=options.scenario, name=self._request_name(),
                                             response_time=latency * 1000, response_length=0, exception=None,
                                             context={})
        self._after_bound()


def _fail(user: User, number: int, reason: str, seconds: float) -> None:
    """A failed event: a locust failure (so locust's CSV and HTML show the reason) and a record for
    the run's summary."""
    STATE.failures.append({"event": number, "reason": reason})
    name = user._request_name() if isinstance(user, DRAUser) else "unblocked -> bound"
    user.environment.events.request.fire(request_type=user.environment.parsed_options.scenario,
                                         name=name, response_time=seconds * 1000, response_length=0,
                                         exception=EventFailed(reason), context={})


class EventFailed(Exception):
    """One unblocking event that did not lead to a binding; the message says which and why."""


def _error_text(err: Exception) -> str:
    if isinstance(err, errors.ApiError):
        return f"{err.status} {err.reason}" + (f" ({' '.join(str(err.body).split())[:200]})" if err.body else "")
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def _queues(options) -> dict[str, float]:
    """The scheduler's pending pods per queue (active, backoff, unschedulable, gated), if it can be asked."""
    try:
        pending = _scrape(options).get("scheduler_pending_pods", {})
    except Exception:  # noqa: BLE001 - only a diagnosis; the failure is reported either way
        return {}
    return {dict(labels).get("queue", "?"): value for labels, value in pending.items()}


class DeviceFreedUser(DRAUser):
    def _unblock(self) -> None:
        pod = self.target = next(STATE.targets)
        self.last_target = f"delete running pod {pod}"
        STATE.core.delete_namespaced_pod(pod, STATE.namespace, grace_period_seconds=0)

    def _effect(self) -> str:
        pod = self.target
        try:
            STATE.core.read_namespaced_pod(pod, STATE.namespace)
        except errors.NotFound:
            return ""
        except errors.ApiError as err:
            return f"reading {pod}: {err.status}"
        return f"the deleted pod {pod} still exists, so its device is not free yet"


class ClaimSharedUser(DeviceFreedUser):
    """Frees a device; a waiting PodGroup's shared claim takes it and its members are bound."""


class SliceAddedUser(DRAUser):
    def _unblock(self) -> None:
        node = self.target = next(STATE.targets)
        self.last_target = f"give node {node} its devices"
        ops.label_node_with_profile(STATE.core, node, self.environment.parsed_options.device_profile)

    def _effect(self) -> str:
        node = self.target
        slices = STATE.resource.list_resource_slice(field_selector=f"spec.nodeName={node}").items
        devices = sum(len(s.spec.devices or []) for s in slices)
        return f"node {node} has {len(slices)} ResourceSlices with {devices} devices" + (
            " (the driver has not published them)" if not slices else "")


class TaintRemovedUser(DRAUser):
    def _unblock(self) -> None:
        rule = next(STATE.targets)
        self.last_target = f"delete DeviceTaintRule {rule}"
        STATE.resource.delete_device_taint_rule(rule)


class ClassCreatedUser(DRAUser):
    def _unblock(self) -> None:
        i = next(STATE.targets)
        options = self.environment.parsed_options
        name = f"{options.driver_instance}-gpu-{i}"
        self.last_target = f"create DeviceClass {name}"
        STATE.resource.create_device_class(ops.extended_class(name, STATE.driver, _class_resource(options, i),
                                                                  label=options.run_label))


class RequeueUser(DRAUser):
    """requeue-correctness: event i fires its kind (requeue_kinds.KINDS in turn) on node i; only pod rq-<i>
    may answer it. locust's statistics show each kind as a request name of its own."""

    kind = "?"

    def _unblock(self) -> None:
        options = self.environment.parsed_options
        i = next(STATE.targets)
        kinds = _requeue_kinds(options)
        kind = kinds[i % len(kinds)]
        node = f"{options.node_prefix}{i}"
        self.kind, self.target = kind.name, requeue_kinds.target(i)
        self.last_target = f"{kind.name} for pod {self.target} on node {node}"
        done = kind.fire(_requeue_context(options), i, node)
        self.last_target = f"{kind.name} for pod {self.target}: {done}"

    def _among(self) -> set[str] | None:
        return {self.target}

    def _request_name(self) -> str:
        return self.kind

    def _measured(self, seconds: float | None) -> None:
        STATE.requeue.append([self.kind, seconds, self.target])


class ThroughputUser(User):
    """Creates this process's share of the measured burst as fast as the users can, recording when each
    create call was issued and returned. The run then waits for every pod to be bound (_finish_run)."""

    @task
    def event(self) -> None:
        if STATE.fired >= STATE.budget:
            _check_share_done()  # a worker whose share is empty still reports it
            raise StopUser()
        STATE.fired += 1
        name = next(STATE.targets)
        issued = time.monotonic()
        try:
            STATE.core.create_namespaced_pod(STATE.namespace, _burst_pod(self.environment.parsed_options, name))
        except errors.ApiError as err:  # the pod cannot count: the run will fail, saying so
            STATE.create_failed[name] = f"create failed: {err.status} {err.reason}"
            self.environment.events.request.fire(request_type="throughput", name="create", context={},
                                                 response_time=(time.monotonic() - issued) * 1000,
                                                 response_length=0, exception=err)
        else:
            STATE.created[name] = (issued, time.monotonic())
            STATE.pods_created += 1
        _check_share_done()


def _burst_pod(options, name: str) -> dict:
    """A pod of the throughput-like scenarios: one GPU through the claim template, or (extended-throughput)
    through the extended resource of the DeviceClass created at set-up."""
    if options.scenario == "extended-throughput":
        return _pod(options, name, extended=options.extended_resource)
    return _pod(options, name, template="one-gpu")


class SteadyStateUser(DRAUser):
    """One arrival per event. Open loop (--rate): on a fixed schedule, arrival k is created at
    start + k / --rate (the run's first arrival sets start), whatever happened to earlier ones, so the
    arrival rate stays constant as long as a user is free; an arrival created late is counted
    (late_arrivals, max_lag_seconds). Closed loop (--in-flight K, as scheduler_perf's steady state):
    K users, each creating its next pod as soon as its last one is bound, so K pods are always waiting,
    until --duration has passed since the first arrival (or --events arrivals were made).
    The latency is from the create call returning to that pod's binding; the pod is then deleted, so
    the utilization stays where set-up put it (as scheduler_perf's steady-state mode does)."""

    def _unblock(self) -> None:
        options = self.environment.parsed_options
        if STATE.arrival_start is None:
            STATE.arrival_start = time.monotonic()
        start = STATE.arrival_start
        if options.in_flight and time.monotonic() - start >= options.duration:
            raise StopIteration  # the closed loop's time is up: no more arrivals
        number = next(STATE.targets)
        if not options.in_flight:  # open loop: arrival k is due at start + k / rate
            lag = time.monotonic() - (start + number / options.rate)
            if lag < 0:
                gevent.sleep(-lag)
            elif lag > 0.1:  # every user was busy when this arrival was due
                STATE.late_arrivals = STATE.late_arrivals + 1
                STATE.max_lag = max(STATE.max_lag, lag)
        self.target = f"arrival-{number}"
        self.last_target = f"create pod {self.target}"
        issued = time.monotonic()
        STATE.core.create_namespaced_pod(STATE.namespace, _pod(options, self.target, template="one-gpu"))
        STATE.created[self.target] = (issued, time.monotonic())  # for the closed loop's pods/s
        STATE.pods_created += 1

    def _among(self) -> set[str] | None:
        return {self.target}

    def _after_bound(self) -> None:
        errors.ignore_missing(STATE.core.delete_namespaced_pod, self.target, STATE.namespace, grace_period_seconds=0)
