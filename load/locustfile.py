"""locust users for the DRA load scenarios (run through `dra-harness load run`, or locust directly:
`locust -f load/locustfile.py --headless --kubeconfig K --scenario device-freed ...`).

Set-up happens once, on the master (or the local runner): waiting pods are created and parked as
unschedulable before the first event. Each user task performs one unblocking event and reports the
time until a waiting pod is bound through locust's request event, so the UI, CSV and HTML reports show
percentiles per event kind. The run stops after --events events or --run-time, whichever comes first.
"""

from __future__ import annotations

import itertools
import json
import os
import time

import gevent
import kubernetes
import psutil
from locust import User, events, task
from locust.exception import StopUser
from locust.runners import WorkerRunner

from load import cluster_ops as ops
from load import metrics

STATE: dict = {}  # per process: clients, watch, queues of event targets, counters


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    group = parser.add_argument_group("dra-harness")
    group.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="cluster under load")
    group.add_argument("--scenario", default="device-freed")
    group.add_argument("--nodes", type=int, default=10, help="nodes of the cluster (named dev-0...)")
    group.add_argument("--pending", type=int, default=10)
    group.add_argument("--events", type=int, default=10, help="stop after this many events (per process)")
    group.add_argument("--devices-per-node", type=int, default=4)
    group.add_argument("--driver-instance", default="load")
    group.add_argument("--driver-domain", default="load.example.com")
    group.add_argument("--device-profile", default="load-gpu")
    group.add_argument("--scheduler-metrics-url", default="")
    group.add_argument("--results-file", default="")
    group.add_argument("--event-timeout", type=float, default=60.0)


def _clients(options):
    if "api" not in STATE:
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=options.kubeconfig, client_configuration=configuration)
        configuration.connection_pool_maxsize = 64  # before the ApiClient exists: it sizes its pool once
        api = kubernetes.client.ApiClient(configuration)
        STATE.update(api=api, core=kubernetes.client.CoreV1Api(api), resource=kubernetes.client.ResourceV1Api(api))
    return STATE["core"], STATE["resource"]


def _scrape(options) -> dict:
    if not options.scheduler_metrics_url:
        return {}
    from harness.k8s.client import https_get, tls_context

    status, body = https_get(options.scheduler_metrics_url, tls_context(options.kubeconfig), timeout=10)
    return metrics.parse(body) if status == 200 else {}


@events.test_start.add_listener
def _setup(environment, **_) -> None:
    options = environment.parsed_options
    core, resource = _clients(options)
    namespace = f"load-{options.scenario}"
    gpu_driver = f"gpu.{options.driver_domain}"
    STATE.update(namespace=namespace, driver=gpu_driver, fired=0, latencies=[], pods_created=0,
                 cpu_start=psutil.Process().cpu_times(), wall_start=time.monotonic())
    STATE["targets"] = _targets(options, environment.runner)
    if isinstance(environment.runner, WorkerRunner):
        STATE["watch"] = ops.BindingWatch(core, namespace).start()
        return  # set-up belongs to the master; a worker takes its share of the event targets
    STATE["metrics_before"] = _scrape(options)
    try:
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except kubernetes.client.rest.ApiException as err:
        if err.status != 409:
            raise
    ops.wait_until("the namespace's default ServiceAccount",
                   lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(namespace).items), 60)
    gpu_class = f"{options.driver_instance}-gpu"
    resource.create_namespaced_resource_claim_template(namespace, ops.claim_template("one-gpu", gpu_class))
    nodes = [f"dev-{i}" for i in range(options.nodes)]
    scenario = options.scenario
    waiting = {f"wait-{i}" for i in range(options.pending)}

    if scenario in ("device-freed", "claim-shared"):
        fill = [f"fill-{i}" for i in range(options.nodes * options.devices_per_node)]
        ops.create_pods(core, namespace, [ops.pod(n, template="one-gpu") for n in fill])
        ops.wait_until("every device to be allocated", lambda: ops.count_bound(core, namespace, set(fill)) == len(fill), 600)
    elif scenario == "taint-removed":
        for node in nodes:
            resource.create_device_taint_rule(ops.taint_rule(f"load-hold-{node}", gpu_driver, node))
    elif scenario == "throughput":
        first = [f"init-{i}" for i in range(options.pending // 2)]
        ops.create_pods(core, namespace, [ops.pod(n, template="one-gpu") for n in first])
        ops.wait_until("the initial pods to be scheduled", lambda: ops.count_bound(core, namespace, set(first)) == len(first), 600)
        waiting = set()
    if scenario == "claim-shared":
        scheduling = kubernetes.client.SchedulingV1beta1Api(STATE["api"])
        groups = [f"grp-{i}" for i in range(options.pending // 2)]
        for group in groups:
            scheduling.create_namespaced_pod_group(namespace, ops.pod_group_with_claim(group, "one-gpu"))
        waiting = {f"{group}-{member}" for group in groups for member in ("a", "b")}
        ops.create_pods(core, namespace, [ops.group_member(f"{g}-{m}", g, "one-gpu") for g in groups for m in "ab"])
        ops.wait_until("every group member to be parked as unschedulable",
                       lambda: ops.all_unschedulable(core, namespace, waiting), 600)
        waiting = set()
    if waiting:
        extended = scenario == "class-created"
        bodies = [ops.pod(n, extended=f"load.example.com/gpu-{n.split('-')[1]}") if extended else ops.pod(n, template="one-gpu")
                  for n in sorted(waiting)]
        ops.create_pods(core, namespace, bodies)
        ops.wait_until("every waiting pod to be parked as unschedulable",
                       lambda: ops.all_unschedulable(core, namespace, waiting), 600)
    STATE["watch"] = ops.BindingWatch(core, namespace).start()
    STATE["wall_start"] = time.monotonic()
    STATE["cpu_start"] = psutil.Process().cpu_times()


def _targets(options, runner):
    """What each event acts on, derived from the parameters alone, so a worker can compute its share
    (every n-th target) without talking to the master."""
    nodes = [f"dev-{i}" for i in range(options.nodes)]
    fill = [f"fill-{i}" for i in range(options.nodes * options.devices_per_node)]
    every = {"device-freed": fill, "claim-shared": fill,
             "slice-added": nodes, "taint-removed": [f"load-hold-{n}" for n in nodes],
             "class-created": list(range(options.pending))}.get(options.scenario)
    if every is None:  # throughput: an endless supply of new pod names
        prefix = f"burst-{getattr(runner, 'worker_index', 0)}"
        return (f"{prefix}-{i}" for i in itertools.count())
    if isinstance(runner, WorkerRunner):
        count = max(1, getattr(runner, "worker_count", 1) or 1)
        every = every[runner.worker_index::count]
    return iter(every)


@events.test_stop.add_listener
def _teardown(environment, **_) -> None:
    options = environment.parsed_options
    if "watch" in STATE:
        STATE["watch"].stop()
    if isinstance(environment.runner, WorkerRunner) or not options.results_file:
        return
    after = _scrape(options)
    cpu = psutil.Process().cpu_times()
    wall = time.monotonic() - STATE["wall_start"]
    used = (cpu.user + cpu.system) - (STATE["cpu_start"].user + STATE["cpu_start"].system)
    result = {"scenario": options.scenario, "nodes": options.nodes, "pending": options.pending,
              "events": STATE["fired"], "latencies_ms": [round(x * 1000, 2) for x in STATE["latencies"]],
              "scheduler": metrics.summary(metrics.delta(STATE.get("metrics_before", {}), after)) if after else {},
              "generator": {"wall_seconds": round(wall, 2), "cpu_seconds": round(used, 2),
                            "cpu_percent": round(100 * used / wall, 1) if wall else 0.0,
                            "events_per_second": round(STATE["fired"] / wall, 2) if wall else 0.0,
                            "pods_created": STATE["pods_created"],
                            "pods_created_per_second": round(STATE["pods_created"] / wall, 1) if wall else 0.0}}
    if options.scenario == "throughput":
        result["throughput"] = _throughput()
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
        import csv

        from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

        with open(f"{options.csv_prefix}_stats_final.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            stats_csv = StatsCSV(environment, PERCENTILES_TO_REPORT)
            writer.writerow(stats_csv.requests_csv_columns)
            stats_csv._requests_data_rows(writer)
    core, resource = _clients(options)
    ops.cleanup(core, resource, STATE["namespace"])


def _throughput() -> dict:
    created, bound = STATE.get("created_at", {}), STATE["watch"].bound_at
    done = [name for name in created if name in bound]
    if not done:
        return {"pods": 0, "pods_per_second": 0.0}
    start = min(created[n] for n in done)
    end = max(bound[n] for n in done)
    return {"pods": len(done), "seconds": round(end - start, 2),
            "pods_per_second": round(len(done) / (end - start), 1) if end > start else 0.0}


def _finish(user: User) -> None:
    """Stop after the event budget: a local run ends (test_stop writes the results); a worker's users
    stop and the master ends the run at --run-time. Only the first user to get here quits."""
    if not isinstance(user.environment.runner, WorkerRunner) and not STATE.get("quitting"):
        STATE["quitting"] = True
        gevent.spawn(user.environment.runner.quit)
    raise StopUser()


class DRAUser(User):
    """Base class: one task = one unblocking event, reported as a locust request."""

    abstract = True

    def _unblock(self) -> None:  # the API call that frees resources for one waiting pod
        raise NotImplementedError


    @task
    def event(self) -> None:
        options = self.environment.parsed_options
        if STATE.get("fired", 0) >= options.events:
            _finish(self)
        STATE["fired"] += 1
        try:
            self._unblock()
        except StopIteration:
            _finish(self)
        since = time.monotonic()
        latency = STATE["watch"].next_binding_after(since, options.event_timeout)
        exception = None if latency is not None else TimeoutError(
            f"no waiting pod bound within {options.event_timeout:.0f}s (a missed requeue?)")
        if latency is not None:
            STATE["latencies"].append(latency)
        self.environment.events.request.fire(request_type=options.scenario, name="unblocked -> bound",
                                             response_time=(latency or options.event_timeout) * 1000,
                                             response_length=0, exception=exception, context={})


class DeviceFreedUser(DRAUser):
    def _unblock(self) -> None:
        STATE["core"].delete_namespaced_pod(next(STATE["targets"]), STATE["namespace"], grace_period_seconds=0)


class ClaimSharedUser(DeviceFreedUser):
    """Frees a device; a waiting PodGroup's shared claim takes it and its members are bound."""


class SliceAddedUser(DRAUser):
    def _unblock(self) -> None:
        ops.label_node_with_profile(STATE["core"], next(STATE["targets"]), self.environment.parsed_options.device_profile)


class TaintRemovedUser(DRAUser):
    def _unblock(self) -> None:
        STATE["resource"].delete_device_taint_rule(next(STATE["targets"]))


class ClassCreatedUser(DRAUser):
    def _unblock(self) -> None:
        i = next(STATE["targets"])
        STATE["resource"].create_device_class(ops.extended_class(f"load-gpu-{i}", STATE["driver"],
                                                                  f"load.example.com/gpu-{i}"))


class ThroughputUser(User):
    """Creates the measured burst as fast as the users can; when all are created, the first user to
    notice waits for them to be bound and reports each pod's create -> bound time as a request."""

    @task
    def event(self) -> None:
        options = self.environment.parsed_options
        burst = options.pending - options.pending // 2
        if STATE.get("fired", 0) >= burst:
            if not STATE.get("measuring"):
                STATE["measuring"] = True
                self._report_bindings(options.event_timeout)
            _finish(self)
        STATE["fired"] += 1
        name = next(STATE["targets"])
        STATE.setdefault("created_at", {})[name] = time.monotonic()
        STATE["core"].create_namespaced_pod(STATE["namespace"], ops.pod(name, template="one-gpu"))
        STATE["pods_created"] += 1

    def _report_bindings(self, timeout: float) -> None:
        created = dict(STATE.get("created_at", {}))
        watch = STATE["watch"]
        for name, since in sorted(created.items(), key=lambda item: item[1]):
            latency = watch.next_binding_after(since, timeout, among={name})
            self.environment.events.request.fire(
                request_type="throughput", name="created -> bound", response_time=(latency or timeout) * 1000,
                response_length=0, exception=None if latency is not None else TimeoutError("not bound in time"),
                context={})
