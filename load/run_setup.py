"""The set-up of a load run (locust's test_start): on the master (or the local runner) the scenario's objects,
filled devices and parked pods before the measured window; on every process its budget and share of the
event targets. Also the pods of the run, as set-up and the users create them."""

from __future__ import annotations

import itertools
import logging
import time

import gevent
import psutil
from locust.runners import WorkerRunner

from harness.core import conditions
from harness.k8s import api, errors
from load import cluster_ops as ops
from load import requeue_kinds, scenarios
from load.cluster_view import _clients, _error_text, _scrape, _wait_queue_settled
from load.processstate import STATE


# locust's test_start listener (registered by load/locustfile.py)
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


def _burst_pod(options, name: str) -> dict:
    """A pod of the throughput-like scenarios: one GPU through the claim template, or (extended-throughput)
    through the extended resource of the DeviceClass created at set-up."""
    # Bound, never started: what the scheduler does is measured, not a simulated kubelet's status write per pod
    # (scheduler_perf's pods do not run either; docs/load.md).
    if options.scenario == "extended-throughput":
        return _pod(options, name, extended=options.extended_resource, started=False)
    return _pod(options, name, template="one-gpu", started=False)


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
