"""The load scenarios: what each sets up, which API call unblocks a waiting pod, and their limits.

Every latency scenario works the same way: P pods wait (Pending) for a device; each event is one API
call that makes exactly the resources for one pod available; the latency is the time from that call
returning to the watch event that shows a waiting pod bound (spec.nodeName set). `throughput`
measures pods/s for a burst instead, like scheduler_perf's SchedulingWithResourceClaimTemplate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fake_devices.errors import InvalidInput, Problem

# How fast the harness creates pods during set-up, measured on the 2-core machine (see BENCHMARKS.md):
# used to refuse runs whose set-up cannot finish within the time bound.
SETUP_PODS_PER_SECOND = 100
MAX_NODES = 10000  # as for a cluster definition's node pools (harness/config/cluster.py)
MAX_USERS = 1000
MAX_TIME_LIMIT = 86400.0  # a day; locust takes whole seconds


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    fills_devices: bool  # every device is taken by a running pod before the waiting pods come
    devices_at_start: bool  # nodes have devices from the start (slice-added: they get them as events)


SCENARIOS = {s.name: s for s in (
    Scenario("device-freed", "all devices allocated, P pods pending; an event deletes one running pod", True, True),
    Scenario("slice-added", "no node has devices, P pods pending; an event gives one node its devices "
             "(the driver publishes its ResourceSlice: a scale-up)", False, False),
    Scenario("taint-removed", "every node's devices tainted NoSchedule by a DeviceTaintRule per node, P pods "
             "pending; an event deletes one node's rule", False, True),
    Scenario("class-created", "P pods each wait for the extended resource of a DeviceClass that does not "
             "exist; an event creates one pod's class", False, True),
    Scenario("claim-shared", "every device taken; P/2 PodGroups of 2 member pods share one claim each "
             "(workload-level claims); an event deletes one running pod, and one group's claim gets its device",
             True, True),
    Scenario("throughput", "a burst of P pods with claim templates on free devices (P/2 created first and "
             "scheduled, P/2 measured), reported in pods/s", False, True),
    Scenario("extended-throughput", "throughput with pods asking for the extended resource example.com/gpu: 1, "
             "served by a DeviceClass's extendedResourceName instead of a claim template", False, True),
    Scenario("requeue-correctness", "P pods wait, each on its own node for one kind of unblocking event (12 kinds "
             "in turn: a pod deleted, a claim deallocated, a slice added or updated, a device taint or rule removed "
             "or changed, a class created or widened, a node labelled, a toleration added, a PodGroup's shared "
             "claim released), the rest blocked for "
             "good; each event must free its pod within the bound", False, True),
    Scenario("steady-state", "P pods placed first (the utilization); then --events pods arrive at a constant "
             "--rate, each deleted once bound; latency from creation to binding. With --in-flight K, a closed "
             "loop instead: K pods always waiting, each replaced once bound, for --duration seconds (pods/s)",
             False, True),
)}

# Scenarios that measure a burst in pods/s (every pod must be bound) rather than per-event latency.
BURST_SCENARIOS = ("throughput", "extended-throughput")
EXTENDED_RESOURCE = "example.com/gpu"  # what extended-throughput's pods ask for
MAX_RATE = 1000.0


# The locust User class (load/locustfile.py) that plays each scenario.
USER_CLASSES = {"device-freed": "DeviceFreedUser", "slice-added": "SliceAddedUser",
                "taint-removed": "TaintRemovedUser", "class-created": "ClassCreatedUser",
                "claim-shared": "ClaimSharedUser", "requeue-correctness": "RequeueUser",
                "throughput": "ThroughputUser", "extended-throughput": "ThroughputUser",
                "steady-state": "SteadyStateUser"}


LOAD_LABEL = "dra-harness.x-k8s.io/load"  # on every object a run creates; its value names the run
PROFILE_NAME = "load-gpu"  # the device profile of the load nodes (D GPUs)


@dataclass(frozen=True)
class Placement:
    """What a run acts on and what it calls the objects it creates. On a cluster the run started
    (`own`) that is the whole cluster: nodes dev-0..N-1, the fake driver `load`. On a cluster it was
    given (`guest`) every name carries the run's id: its own nodes (tainted `LOAD_LABEL`, so nothing
    else is scheduled there; its pods tolerate that), its own driver instance, domain, profile and
    namespace, so it neither touches nor is confused with anything already there."""

    namespace: str
    node_prefix: str = "dev-"
    run_label: str = "true"  # the value of LOAD_LABEL on every object; clean-up selects by it
    node_taint: str = ""  # a taint key on the run's nodes that its pods tolerate ("" none)
    driver_instance: str = "load"
    driver_domain: str = "load.example.com"
    profile: str = PROFILE_NAME
    extended_resource: str = EXTENDED_RESOURCE

    @classmethod
    def own(cls, scenario: str) -> "Placement":
        return cls(namespace=f"load-{scenario}")

    @classmethod
    def guest(cls, scenario: str, run_id: str) -> "Placement":
        """`run_id`: a short lower-case hex id, unique among the runs on the cluster."""
        prefix = f"load-{run_id}"
        return cls(namespace=f"load-{scenario}-{run_id}", node_prefix=f"{prefix}-dev-", run_label=prefix,
                   node_taint=LOAD_LABEL, driver_instance=prefix, driver_domain=f"{prefix}.example.com",
                   profile=f"{PROFILE_NAME}-{run_id}", extended_resource=f"{prefix}.example.com/gpu")

    def node_names(self, count: int) -> list[str]:
        return [f"{self.node_prefix}{i}" for i in range(count)]

    def locust_args(self) -> list[str]:
        """The locust file's options (load/locustfile.py) that carry this placement."""
        return ["--namespace", self.namespace, "--node-prefix", self.node_prefix, "--run-label", self.run_label,
                "--node-taint", self.node_taint, "--driver-instance", self.driver_instance,
                "--driver-domain", self.driver_domain, "--device-profile", self.profile,
                "--extended-resource", self.extended_resource]


@dataclass(frozen=True)
class LoadParams:
    scenario: str
    nodes: int
    pending: int
    events: int
    devices_per_node: int = 4
    users: int = 1
    time_limit: float = 300.0
    event_timeout: float = 60.0
    setup_timeout: float = 600.0  # each wait of the set-up (devices filled, pods parked); then the run fails
    rate: float = 10.0  # steady-state: arrivals per second
    # steady-state closed loop (as scheduler_perf's steady state): K pods always waiting, each replaced
    # once bound, for `duration` seconds; 0 = open loop at `rate`
    in_flight: int = 0
    duration: float = 0.0

    @property
    def burst(self) -> bool:
        return self.scenario in BURST_SCENARIOS

    @property
    def closed_loop(self) -> bool:
        return self.scenario == "steady-state" and self.in_flight > 0

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


def validate(params: LoadParams) -> LoadParams:
    """Refuse parameters that cannot work, before anything is created."""
    problems = []
    if params.scenario not in SCENARIOS:
        problems.append(Problem("--scenario", params.scenario, "unknown scenario", ", ".join(SCENARIOS)))
    if params.nodes < 1:
        problems.append(Problem("--nodes", str(params.nodes), "at least one node is needed", f"1 to {MAX_NODES}"))
    elif params.nodes > MAX_NODES:
        problems.append(Problem("--nodes", str(params.nodes), "out of range", f"1 to {MAX_NODES}"))
    if not 1 <= params.users <= MAX_USERS:
        problems.append(Problem("--users", str(params.users), "out of range",
                                f"1 to {MAX_USERS} locust users, one per concurrent event"))
    if not (math.isfinite(params.time_limit) and 1 <= params.time_limit <= MAX_TIME_LIMIT):
        problems.append(Problem("--time-limit", str(params.time_limit), "not a usable number of seconds",
                                f"1 to {MAX_TIME_LIMIT:.0f}"))
    if params.pending < (0 if params.scenario == "steady-state" else 1):
        problems.append(Problem("--pending", str(params.pending), "at least one waiting pod is needed"
                                if params.scenario != "steady-state" else "cannot be negative"))
    if params.events < 1:
        problems.append(Problem("--events", str(params.events), "at least one event is needed"))
    if params.devices_per_node < 1 or params.devices_per_node > 64:
        problems.append(Problem("--devices-per-node", str(params.devices_per_node), "out of range", "1..64"))
    if problems:
        raise InvalidInput(problems)
    scenario = SCENARIOS[params.scenario]
    problems += _closed_loop_problems(params)
    if scenario.name == "steady-state":
        room = max(1, params.in_flight)
        if params.pending + room > params.devices:
            problems.append(Problem("--pending", str(params.pending), f"steady-state places P pods first and needs "
                                    f"room for {room} arriving pod{'s' if room > 1 else ''}: at most "
                                    f"{params.devices - room} with {params.devices} devices"))
        if params.closed_loop:
            pass  # arrivals follow bindings, not a rate: --rate does not apply
        elif not (math.isfinite(params.rate) and 0.1 <= params.rate <= MAX_RATE):
            problems.append(Problem("--rate", str(params.rate), "out of range", f"0.1 to {MAX_RATE:g} pods/s"))
        elif params.events / params.rate > params.time_limit:
            problems.append(Problem("--events", str(params.events), f"{params.events} arrivals at {params.rate:g}/s "
                                    f"take {params.events / params.rate:.0f}s, more than --time-limit "
                                    f"{params.time_limit:g}s", f"at most {int(params.rate * params.time_limit)}"))
    elif not params.burst and params.events > params.pending:
        problems.append(Problem("--events", str(params.events), f"more events than waiting pods ({params.pending})",
                                f"at most --pending ({params.pending})"))
    if params.burst and params.pending > params.devices:
        problems.append(Problem("--pending", str(params.pending), f"more pods than devices ({params.devices})",
                                "raise --nodes or --devices-per-node"))
    if scenario.name in ("slice-added", "taint-removed") and params.events * params.devices_per_node > params.pending:
        # each event frees a whole node's devices, so it can bind up to devices-per-node waiting pods
        problems.append(Problem("--pending", str(params.pending),
                                f"{params.events} events x {params.devices_per_node} devices per node need at "
                                "least that many waiting pods", f"at least {params.events * params.devices_per_node}"))
    if scenario.name == "claim-shared" and (params.pending < 2 or params.events > params.pending // 2):
        problems.append(Problem("--events", str(params.events), "each event serves one PodGroup of 2 waiting pods",
                                f"at most --pending/2 ({params.pending // 2})"))
    if scenario.name == "requeue-correctness" and params.events > params.nodes:
        problems.append(Problem("--events", str(params.events), "each event has a node of its own",
                                f"at most --nodes ({params.nodes})"))
    if scenario.name == "slice-added" and params.events > params.nodes:
        problems.append(Problem("--events", str(params.events), "each event gives one more node its devices",
                                f"at most --nodes ({params.nodes})"))
    if scenario.name == "taint-removed" and params.events > params.nodes:
        problems.append(Problem("--events", str(params.events), "each event lifts one node's taint",
                                f"at most --nodes ({params.nodes})"))
    # Set-up must fit in the time bound; blame the flag that makes it too big.
    fill = params.devices if scenario.fills_devices else 0
    if fill / SETUP_PODS_PER_SECOND > params.time_limit:
        most_nodes = max(1, int(params.time_limit * SETUP_PODS_PER_SECOND) // params.devices_per_node)
        problems.append(Problem("--nodes", str(params.nodes),
                                f"{scenario.name} first fills every device: {fill} pods ({params.nodes} nodes x "
                                f"{params.devices_per_node} devices) take ~{fill // SETUP_PODS_PER_SECOND}s at "
                                f"{SETUP_PODS_PER_SECOND} pods/s, more than --time-limit {params.time_limit:g}s",
                                f"at most {most_nodes} nodes at --devices-per-node {params.devices_per_node}, "
                                "or a longer --time-limit"))
    elif (params.pending + fill) / SETUP_PODS_PER_SECOND > params.time_limit:
        setup_pods = params.pending + fill
        problems.append(Problem("--pending", str(params.pending),
                                f"setting up {setup_pods} pods takes ~{setup_pods // SETUP_PODS_PER_SECOND}s at "
                                f"{SETUP_PODS_PER_SECOND} pods/s, more than --time-limit {params.time_limit:g}s",
                                f"at most {max(1, int(params.time_limit * SETUP_PODS_PER_SECOND) - fill)} waiting "
                                "pods, or a longer --time-limit"))
    if problems:
        raise InvalidInput(problems)
    return params


def _closed_loop_problems(params: LoadParams) -> list[Problem]:
    """--in-flight and --duration: only steady-state has the closed loop, which needs both."""
    problems = []
    if params.scenario != "steady-state":
        for flag, value, unset in (("--in-flight", params.in_flight, 0), ("--duration", params.duration, 0.0)):
            if value != unset:
                problems.append(Problem(flag, str(value), f"only steady-state has a closed loop, not {params.scenario}",
                                        "leave it out, or --scenario steady-state"))
        return problems
    if params.in_flight == 0:
        if params.duration:
            problems.append(Problem("--duration", str(params.duration), "only the closed loop runs for a duration "
                                    "(the open loop ends after --events arrivals)", "leave it out, or add --in-flight K"))
        return problems
    if not 1 <= params.in_flight <= MAX_USERS:
        problems.append(Problem("--in-flight", str(params.in_flight), "out of range",
                                f"1 to {MAX_USERS} pods waiting at once (0: open loop at --rate)"))
    if not (math.isfinite(params.duration) and 1 <= params.duration <= params.time_limit):
        problems.append(Problem("--duration", str(params.duration), "the closed loop runs for this many seconds, "
                                "within --time-limit", f"1 to {params.time_limit:g} seconds (--time-limit)"))
    if params.users != 1:
        problems.append(Problem("--users", str(params.users), "the closed loop runs one locust user per in-flight pod",
                                "leave --users out; --in-flight sets them"))
    return problems


def sweep_events(scenario: str, events: int, pending: int) -> int:
    """A sweep's events for one cell: latency scenarios cannot have more events than waiting pods;
    bursts and steady-state arrivals do not depend on the waiting pods."""
    return events if scenario in BURST_SCENARIOS or scenario == "steady-state" else min(events, pending)


def share(total: int, workers: int, index: int) -> int:
    """Worker `index`'s part of `total` events when `workers` processes split them: the same for all,
    the first `total % workers` workers one more, so the parts always add up to `total`."""
    return total // workers + (1 if index < total % workers else 0)
