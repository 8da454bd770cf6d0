"""Start real nodes beside a local cluster's KWOK nodes: containerd + the kubelet, as local processes.

Order (each step recorded in state.yaml first, so `cluster down` can undo a half-made node):
host baseline -> node directory, cgroup parent, bridge -> containerd -> images -> kubelet.
`teardown.teardown_all` is the reverse.
"""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness.backends.commands import Runner
from harness.backends.local import kubeconfig, pki, ports, process, reservations, state
from harness.backends.local.realnode import cgroups, containerd, host, images, kubelet, network
from harness.binaries.noderuntime import NodeRuntime
from harness.core.errors import ComponentError, HarnessError
from harness.core.nodelayout import RealNodeRecord, node_id, node_root
from harness.core.progress import Reporter

CONTAINERD_TIMEOUT = 60.0
KUBELET_TIMEOUT = 90.0


@dataclass(frozen=True)
class RealNodeSpec:
    name: str
    pool: str = "real"
    labels: dict[str, str] = field(default_factory=dict)


def default_specs(count: int) -> list[RealNodeSpec]:
    return [RealNodeSpec(f"real-node-{i}") for i in range(count)]


def plan_record(cluster: state.ClusterState, spec: RealNodeSpec, subnet: ipaddress.IPv4Network,
                taken_ports: set[int]) -> RealNodeRecord:
    ident = node_id(cluster.directory, spec.name)
    allocated = ports.allocate([f"kubelet-{spec.name}", f"kubelet-healthz-{spec.name}"], reserved=taken_ports,
                               holder=cluster.directory)
    return RealNodeRecord(name=spec.name, id=ident, directory=str(node_root() / ident),
                          bridge=network.bridge_name(ident), subnet=str(subnet), address=network.gateway(subnet),
                          kubelet_port=allocated[f"kubelet-{spec.name}"],
                          healthz_port=allocated[f"kubelet-healthz-{spec.name}"])


def _reserve_subnets(cluster: state.ClusterState, specs: list[RealNodeSpec],
                     runner: Runner | None = None) -> list[ipaddress.IPv4Network]:
    """A subnet per node that overlaps nothing the machine routes (`ip`, run by `runner`) nor another
    cluster's reserved one, chosen and reserved in one step: a bridge gets its address only when its
    node starts."""
    with reservations.open_book() as book:
        # The routes are read here, under the book's lock, not once beforehand: they are what counts now.
        used = network.used_networks(runner) + network.reserved_subnets(book.taken_keys(network.RESERVATION_PREFIX))
        chosen = []
        for spec in specs:
            subnet = network.choose_subnet(node_id(cluster.directory, spec.name), used)
            book.reserve(network.reservation_key(subnet), cluster.directory)
            used.append(subnet)
            chosen.append(subnet)
    return chosen


def start_all(cluster: state.ClusterState, layout, specs: list[RealNodeSpec], runtime: NodeRuntime,
              reporter: Reporter) -> list[RealNodeRecord]:
    """Start every real node of `specs` and wait until its kubelet is healthy (Ready is waited for
    with the KWOK nodes). `layout` is the cluster's components.ClusterLayout."""
    if not specs:
        return []
    subnets = _reserve_subnets(cluster, specs)
    taken = set(state.reserved_ports()) | set(cluster.ports.values())
    planned = []
    for spec, subnet in zip(specs, subnets):
        record = plan_record(cluster, spec, subnet, taken)
        taken |= {record.kubelet_port, record.healthz_port}
        planned.append((spec, record))
    # Recorded before anything is made, so teardown finds all of it even after a crash mid-way.
    cluster.data["realNodes"] = [r.to_dict() for _, r in planned]
    cluster.save()
    with reporter.step("recording the machine settings a kubelet changes"):
        raised = host.acquire(cluster.directory, nodes=len(planned))
    for change in raised:
        reporter.info(f"raised {change} for the real nodes (restored when the last real node on this machine stops)")
    archives = None
    for spec, record in planned:
        archives = _start_one(cluster, layout, spec, record, runtime, reporter, archives)
    return [r for _, r in planned]


def _start_one(cluster, layout, spec: RealNodeSpec, record: RealNodeRecord, runtime: NodeRuntime,
               reporter: Reporter, archives):
    dirs = record.dirs
    with reporter.step(f"{spec.name}: directories, cgroup /dra-harness-{record.id}, bridge {record.bridge} "
                       f"({record.subnet})"):
        for directory in dirs.all():
            directory.mkdir(parents=True, exist_ok=True)
        cgroups.create(record.id)
        network.create_bridge(record.bridge, ipaddress.IPv4Network(record.subnet))
        (dirs.cni_conf / "10-dra-harness.conflist").write_text(
            network.cni_conflist(f"dra-harness-{record.id}", record.bridge,
                                 ipaddress.IPv4Network(record.subnet), dirs.cni_ipam))
        dirs.containerd_config.write_text(containerd.config_toml(dirs, runtime, images.PAUSE_IMAGE))
        client = f"node-{spec.name}"
        pki.add_client(layout.pki, client, f"system:node:{spec.name}", ["system:nodes"])
        kubeconfig.write(layout.kubeconfig(client), cluster.name, layout.server, layout.pki, client)
        dirs.kubelet_config.write_text(kubelet.config_yaml(record, str(layout.pki.ca_cert)))
    with reporter.step(f"{spec.name}: starting containerd"):
        running = process.start(record.containerd_process, containerd.argv(dirs, runtime), cluster.directory,
                                containerd.env(runtime))
        wait_ready(lambda: dirs.containerd_socket.exists() and _ctr_answers(dirs, runtime), running, CONTAINERD_TIMEOUT,
              "containerd socket")
    with reporter.step(f"{spec.name}: importing images ({images.PAUSE_IMAGE}, {images.SHELL_IMAGE})"):
        if archives is None:
            archives = images.write_archives(dirs.images, runtime.path("pause"), runtime.busybox)
        containerd.import_images(dirs, runtime, archives)
    with reporter.step(f"{spec.name}: starting the kubelet"):
        labels = {"kubernetes.io/os": "linux", kubelet.KUBELET_LABEL: "real",
                  "dra-harness.x-k8s.io/node-pool": spec.pool, "dra-harness.x-k8s.io/managed": "true",
                  **spec.labels}
        gate_flags = [f"--feature-gates={layout.features.gates_flag()}"] if layout.features.gates else []
        argv = kubelet.argv(str(layout.binaries.path("kubelet")), record, str(layout.kubeconfig(client)), labels,
                            gate_flags, layout.verbosity)
        running = process.start(record.kubelet_process, argv, cluster.directory)
        wait_ready(lambda: healthy(kubelet.health_url(record)), running, KUBELET_TIMEOUT, kubelet.health_url(record))
    return archives


def _ctr_answers(dirs, runtime) -> bool:
    try:
        containerd.ctr(dirs, runtime, "version", timeout=10)
        return True
    except (HarnessError, OSError):
        return False


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def wait_ready(ready, running: process.Running, timeout: float, what: str, during: str = "start") -> None:
    """Poll `ready` until true; a ComponentError with the log tail if `running` exits or the time runs out."""
    deadline = time.monotonic() + timeout
    while not ready():
        if not process.alive(running):
            code = process.exit_code(running)
            raise ComponentError(running.name, f"exited during {during}{'' if code is None else f' with code {code}'}",
                                 log_file=running.log, log_tail=process.tail(running.log))
        if time.monotonic() > deadline:
            raise ComponentError(running.name, f"not ready after {timeout:.0f}s ({what})", log_file=running.log,
                                 log_tail=process.tail(running.log))
        time.sleep(0.2)


def restart_kubelet(cluster_dir, record: RealNodeRecord, timeout: float = KUBELET_TIMEOUT) -> process.Running:
    """Stop the node's kubelet (SIGTERM) and start it again with the command line it was started
    with, as a kubelet upgrade or crash-restart would; returns once its healthz answers. Pods,
    containers, plugins and the kubelet's checkpoints are left alone. Whatever happens in between,
    a kubelet is started again before this returns or raises: a test must never leave the node
    without one."""
    cluster_dir = Path(cluster_dir)
    pid_file = cluster_dir / "pids" / f"{record.kubelet_process}.json"
    try:
        argv = json.loads(pid_file.read_text())["argv"]
    except (OSError, ValueError, KeyError) as err:
        raise HarnessError(f"cannot restart the kubelet of {record.name}: no usable record {pid_file} ({err})") from None
    running = process.recorded(cluster_dir).get(record.kubelet_process)
    if running is not None and process.alive(running):
        try:
            stuck = process.terminate([psutil.Process(running.pid)], process.GRACE_SECONDS)
        except psutil.NoSuchProcess:  # it ended on its own meanwhile
            stuck = []
        if stuck:  # still the old one: starting a second kubelet beside it would be worse
            raise HarnessError(f"the kubelet of {record.name} (pid {running.pid}) survived SIGKILL")
    started = process.start(record.kubelet_process, argv, cluster_dir)
    wait_ready(lambda: healthy(kubelet.health_url(record)), started, timeout, kubelet.health_url(record))
    return started
