"""The conditions a benchmark ran under: load average, CPU used by the run's own processes and by
everything else on the machine during the measured window, and whether others took enough of the
machine (more than CONTENDED_PERCENT of all cores) that the figure is "contended".

Own processes are a root process and all its descendants (the dra-harness CLI or benchmark script:
the cluster's components, the fake driver and locust are its children). Their CPU is the change of
user + system time, including the times of children they reaped during the window, so a process
that exits and is waited for still counts as own. Others = the machine's busy time (every core,
from /proc/stat) minus own; a process of the tree that exits without a parent in the tree reaping it
loses its window CPU from own, which can only make a run look more contended, never less.

Own CPU is also split by role (`own_cpu_by_role`: kube-apiserver, etcd, kube-scheduler, the fake driver,
locust, ...; `role()`), so a run says which of its processes took the CPU (issue 29 item 4: what of ours
is the system under test and what is the harness around it).

`snapshot()` reads the machine (psutil); `summarize()` is pure arithmetic on two snapshots.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psutil

from harness.core import proctime

CONTENDED_PERCENT = 10.0
# Fields of psutil.cpu_times() that mean a core was busy. guest/guest_nice are already inside
# user/nice on Linux; iowait is idle time waiting for I/O; steal is CPU a hypervisor gave someone else.
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")


@dataclass(frozen=True)
class Snapshot:
    wall: float  # time.monotonic()
    load_average: tuple[float, float, float]
    machine_busy: float  # busy CPU seconds of all cores since boot
    # (pid, process create time) -> user + system + reaped children's CPU seconds, for the tree
    own: dict[tuple[int, float], float] = field(default_factory=dict)
    roles: dict[tuple[int, float], str] = field(default_factory=dict)  # the same keys -> role()


def machine_busy_seconds(cpu_times) -> float:
    return sum(getattr(cpu_times, name, 0.0) for name in BUSY_FIELDS)


def process_seconds(cpu_times) -> float:
    return cpu_times.user + cpu_times.system + getattr(cpu_times, "children_user", 0.0) + \
        getattr(cpu_times, "children_system", 0.0)


# Python programs of ours, by what their command line runs (`-m module`, a script, a setproctitle title).
PYTHON_ROLES = (("fake_devices.kubeletplugin", "kubelet plugins"), ("fake_devices", "fake driver"),
                ("locust", "locust"), ("harness.backends.local.supervisor", "supervisor"),
                ("harness.backends.local.realnode.forked", "kubelet plugins"))


def role(command: list[str]) -> str:
    """What a process of the run is, from its command line: the binary's name for the cluster's components
    (kube-apiserver, etcd, kwok, kubelet, containerd ...), a name for our Python programs, else 'harness'."""
    if not command:
        return "other"
    program = os.path.basename(command[0])
    if not program.startswith("python"):
        return program.split()[0] if program else "other"
    line = " ".join(command[1:])
    return next((name for marker, name in PYTHON_ROLES if marker in line), "harness")


def own_processes(root_pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(root_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def snapshot(root_pid: int | None = None) -> Snapshot:
    own, roles = {}, {}
    for proc in own_processes(root_pid or os.getpid()):
        key = (proc.pid, proctime.started_after_boot(proc.pid) or 0.0)
        try:
            seconds, command = process_seconds(proc.cpu_times()), proc.cmdline()
        except psutil.Error:  # exited while we looked: its CPU is counted as others (see above)
            continue
        own[key], roles[key] = seconds, role(command)
    return Snapshot(time.monotonic(), os.getloadavg(), machine_busy_seconds(psutil.cpu_times()), own, roles)


def by_role(start: Snapshot, end: Snapshot) -> dict[str, float]:
    """Own CPU seconds of the window per role, largest first: each process's end minus its start (0 for one
    that started in the window). A process that exited in the window is not in `end`; its CPU sits with the
    parent that reaped it."""
    totals: dict[str, float] = {}
    for key, seconds in end.own.items():
        name = end.roles.get(key, "other")
        totals[name] = totals.get(name, 0.0) + max(seconds - start.own.get(key, 0.0), 0.0)
    return {name: round(value, 2) for name, value in sorted(totals.items(), key=lambda item: -item[1]) if value > 0}


def summarize(start: Snapshot, end: Snapshot, cpus: int) -> dict:
    """CPU of own and other processes over the window between two snapshots, as seconds and as a
    percentage of the whole machine (cpus x window), and the contended verdict."""
    window = max(end.wall - start.wall, 1e-9)
    # The tree's total then minus its total before: a process that started in the window counts
    # fully, one that exited was reaped by its parent, whose children's times now hold it.
    own = max(sum(end.own.values()) - sum(start.own.values()), 0.0)
    busy = max(end.machine_busy - start.machine_busy, 0.0)
    others = max(busy - own, 0.0)
    capacity = window * cpus
    others_percent = 100 * others / capacity
    return {"window_seconds": round(window, 2), "cpus": cpus,
            "load_average_start": [round(x, 2) for x in start.load_average],
            "load_average_end": [round(x, 2) for x in end.load_average],
            "machine_busy_cpu_seconds": round(busy, 2), "own_cpu_seconds": round(own, 2),
            "others_cpu_seconds": round(others, 2), "own_cpu_by_role": by_role(start, end),
            "own_percent_of_machine": round(100 * own / capacity, 1),
            "others_percent_of_machine": round(others_percent, 1),
            "contended": others_percent > CONTENDED_PERCENT}


def describe(conditions: dict) -> str:
    """One line for a console: what the run shared the machine with."""
    verdict = "CONTENDED" if conditions["contended"] else "uncontended"
    return (f"conditions: {verdict} (others used {conditions['others_percent_of_machine']}% of "
            f"{conditions['cpus']} CPUs, this run {conditions['own_percent_of_machine']}%, over "
            f"{conditions['window_seconds']}s; load average {conditions['load_average_start'][0]} -> "
            f"{conditions['load_average_end'][0]})")


class Measure:
    """`with Measure() as m: ...` then `m.result`: the conditions of the block's window."""

    def __init__(self, root_pid: int | None = None):
        self.root_pid = root_pid or os.getpid()
        self.start: Snapshot | None = None
        self.result: dict | None = None

    def __enter__(self) -> "Measure":
        self.start = snapshot(self.root_pid)
        return self

    def __exit__(self, *exc) -> None:
        assert self.start is not None, "__exit__ without __enter__"
        self.result = summarize(self.start, snapshot(self.root_pid), psutil.cpu_count() or 1)
