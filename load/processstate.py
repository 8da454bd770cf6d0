"""What one locust process (the master, a worker or the local runner) holds during a load run: its API
clients, the binding watch, its queue of event targets, its counters and the marks of the measured window.
A record of its own so that every piece of run state has a name, a type and a default in one place;
STATE below is the process's one instance, which every module of the run imports from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProcessState:
    # API clients, made once per process (harness.k8s.api)
    api: Any = None
    core: Any = None
    resource: Any = None
    # the run
    environment: Any = None  # locust's Environment
    namespace: str = ""
    driver: str = ""  # the GPU driver's name
    targets: Any = None  # an iterator over this process's share of the event targets
    watch: Any = None  # load.cluster_ops.BindingWatch, once started
    budget: int = 0  # events (or pods) this process measures
    # what it measured
    fired: int = 0
    measured: int = 0
    latencies: list[float] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)
    pods_created: int = 0
    created: dict[str, tuple] = field(default_factory=dict)  # pod -> (create issued, create returned)
    create_failed: dict[str, str] = field(default_factory=dict)
    # requeue-correctness: per event [kind, seconds from the event to its pod's binding (None: not within the
    # bound), pod]
    requeue: list[list] = field(default_factory=list)
    requeue_kinds: tuple = ()  # the kinds this cluster can fire (requeue_kinds.served), in the order events take them
    requeue_left_out: dict[str, str] = field(default_factory=dict)  # kind -> why the cluster cannot fire it
    # steady-state's open loop
    arrival_start: float | None = None
    late_arrivals: int = 0
    max_lag: float = 0.0
    # distributed mode: the workers' shares as the master receives them; a worker's "my share is done"
    shares: list[dict] = field(default_factory=list)
    share_done: bool = False
    # the measured window: wall and CPU clocks, scheduler metrics, machine conditions, the queues' settling
    wall_start: float = 0.0
    cpu_start: Any = None
    setup_seconds: float | None = None
    setup_error: str | None = None  # why the set-up failed: no event is fired and the run ends at once
    metrics_before: dict = field(default_factory=dict)
    metrics_window_start: dict = field(default_factory=dict)
    window_start: Any = None
    window_end: Any = None
    queue_settle: dict | None = None

    def new_run(self) -> None:
        """Counters back to zero for a run's start (locust's web UI may start several in one process)."""
        self.fired = self.measured = self.pods_created = 0
        self.latencies, self.shares, self.requeue = [], [], []
        self.created, self.create_failed = {}, {}
        self.setup_error = None


STATE = ProcessState()  # per process: clients, watch, queues of event targets, counters
