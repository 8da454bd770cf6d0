"""The load scenarios: what each sets up, which API call unblocks a waiting pod, and their limits.

Every latency scenario works the same way: P pods wait (Pending) for a device; each event is one API
call that makes exactly the resources for one pod available; the latency is the time from that call
returning to the watch event that shows a waiting pod bound (spec.nodeName set). `throughput`
measures pods/s for a burst instead, like scheduler_perf's SchedulingWithResourceClaimTemplate.
"""

from __future__ import annotations

from dataclasses import dataclass

from fake_devices.errors import InvalidInput, Problem

# How fast the harness creates pods during set-up, measured on the 2-core machine (see BENCHMARKS.md):
# used to refuse runs whose set-up cannot finish within the time bound.
SETUP_PODS_PER_SECOND = 100


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
)}


# The locust User class (load/locustfile.py) that plays each scenario.
USER_CLASSES = {"device-freed": "DeviceFreedUser", "slice-added": "SliceAddedUser",
                "taint-removed": "TaintRemovedUser", "class-created": "ClassCreatedUser",
                "claim-shared": "ClaimSharedUser",
                "throughput": "ThroughputUser"}


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

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node


def validate(params: LoadParams) -> LoadParams:
    """Refuse parameters that cannot work, before anything is created."""
    problems = []
    if params.scenario not in SCENARIOS:
        problems.append(Problem("--scenario", params.scenario, "unknown scenario", ", ".join(SCENARIOS)))
    if params.nodes < 1:
        problems.append(Problem("--nodes", str(params.nodes), "at least one node is needed"))
    if params.pending < 1:
        problems.append(Problem("--pending", str(params.pending), "at least one waiting pod is needed"))
    if params.events < 1:
        problems.append(Problem("--events", str(params.events), "at least one event is needed"))
    if params.devices_per_node < 1 or params.devices_per_node > 64:
        problems.append(Problem("--devices-per-node", str(params.devices_per_node), "out of range", "1..64"))
    if params.time_limit <= 0:
        problems.append(Problem("--time-limit", str(params.time_limit), "must be positive"))
    if problems:
        raise InvalidInput(problems)
    scenario = SCENARIOS[params.scenario]
    if scenario.name != "throughput" and params.events > params.pending:
        problems.append(Problem("--events", str(params.events), f"more events than waiting pods ({params.pending})",
                                f"at most --pending ({params.pending})"))
    if scenario.name == "throughput" and params.pending > params.devices:
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
    if scenario.name == "slice-added" and params.events > params.nodes:
        problems.append(Problem("--events", str(params.events), "each event gives one more node its devices",
                                f"at most --nodes ({params.nodes})"))
    if scenario.name == "taint-removed" and params.events > params.nodes:
        problems.append(Problem("--events", str(params.events), "each event lifts one node's taint",
                                f"at most --nodes ({params.nodes})"))
    setup_pods = params.pending + (params.devices if scenario.fills_devices else 0)
    if setup_pods / SETUP_PODS_PER_SECOND > params.time_limit:
        problems.append(Problem("--pending", str(params.pending),
                                f"setting up {setup_pods} pods takes ~{setup_pods // SETUP_PODS_PER_SECOND}s at "
                                f"{SETUP_PODS_PER_SECOND} pods/s, more than --time-limit {params.time_limit:g}s",
                                "fewer pods or a longer --time-limit"))
    if problems:
        raise InvalidInput(problems)
    return params
