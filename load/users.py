"""The locust users of the load scenarios: DRAUser (one task = one unblocking event, reported as a locust
request) and its class per scenario, and ThroughputUser (the burst's pod creations)."""

from __future__ import annotations

import time

import gevent
from locust import User, task
from locust.exception import StopUser

from harness.k8s import errors
from load import cluster_ops as ops
from load import requeue_kinds
from load.cluster_view import _error_text, _queues
from load.processstate import STATE
from load.run_end import _check_share_done
from load.run_setup import _burst_pod, _class_resource, _pod, _requeue_context, _requeue_kinds


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
