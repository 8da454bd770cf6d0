"""locust users for the DRA load scenarios (run through `dra-harness load run`, or locust directly:
`locust -f load/locustfile.py --headless --kubeconfig K --scenario device-freed ...`).

Set-up happens once, on the master (or the local runner): waiting pods are created and parked as
unschedulable before the first event. Each user task performs one unblocking event and reports the
time until a waiting pod is bound through locust's request event, so the UI, CSV and HTML reports show
percentiles per event kind. The run stops once --events events (in total; each worker process takes
its share) were measured, or at --run-time, whichever comes first. `throughput` ends only when every
pod of the burst is bound, or when no pod got bound for --event-timeout seconds (then the results say
how many were not bound and why).

This file is the entry locust loads: the harness's options, the event listeners and the User classes.
The rest is in modules of its own: the set-up (load/run_setup.py), the users and their events
(load/users.py), the run's end (load/run_end.py) and its results (load/run_results.py), over the one
per-process STATE (load/processstate.py) and the cluster as the run sees it (load/cluster_view.py).
"""

from __future__ import annotations

import os

import locust.runners
from locust import events

from load import scenarios
from load.run_end import _on_init, _on_request
from load.run_results import _teardown
from load.run_setup import _setup
from load.users import (  # noqa: F401 - the User classes locust finds here (load/scenarios.py USER_CLASSES)
    ClaimSharedUser,
    ClassCreatedUser,
    DeviceFreedUser,
    DRAUser,
    RequeueUser,
    SliceAddedUser,
    SteadyStateUser,
    TaintRemovedUser,
    ThroughputUser,
)

# Distributed mode: the master's set-up and a worker's start (locust rebuilds its argument parser for
# every option the master sends) hold the gevent loop for seconds on a loaded machine, longer than
# locust's 3 missed heartbeats, after which the master drops its workers and stops the run. The API
# classes are imported above (harness.k8s.api, by the run's modules), before any worker connects, for the
# same reason (importing them takes seconds); and a worker may miss up to a minute of heartbeats.
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


# the run's listeners, registered once, as locust loads this file
events.init.add_listener(_on_init)
events.test_start.add_listener(_setup)
events.test_stop.add_listener(_teardown)
events.request.add_listener(_on_request)
