"""Simulated nodes: Node objects that the KWOK controller keeps Ready and whose pods it runs.

Nodes are created through the API in parallel threads; `wait_ready` watches until every node is
Ready and free of the not-ready taints the node lifecycle controller puts on new nodes.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass, field

from fake_devices.config import PROFILE_LABEL
from fake_devices.schema import quantity_value
from harness.core.errors import HarnessError
from harness.core.progress import Reporter
from harness.k8s import api, errors
from harness.k8s.nodes import is_ready

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"  # KWOK manages the nodes annotated <this>=fake
POOL_LABEL = "dra-harness.x-k8s.io/node-pool"
MANAGED_LABEL = "dra-harness.x-k8s.io/managed"


@dataclass(frozen=True)
class NodeSpec:
    name: str
    pool: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    cpu: str = "64"
    memory: str = "512Gi"
    pods: str = "250"

    def manifest(self) -> dict:
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  "type": "kwok", POOL_LABEL: self.pool, MANAGED_LABEL: "true", **self.labels}
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": self.pods}
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "labels": labels, "annotations": {KWOK_NODE_ANNOTATION: "fake"}},
            "spec": {},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "nodeInfo": {"kubeletVersion": "kwok", "kubeProxyVersion": "", "operatingSystem": "linux",
                                    "architecture": "amd64", "osImage": "kwok", "kernelVersion": "kwok",
                                    "containerRuntimeVersion": "kwok", "machineID": self.name, "bootID": "",
                                    "systemUUID": self.name}},
        }


ZONES = ("zone-a", "zone-b", "zone-c")


def default_nodes(count: int, pool: str = "default", prefix: str = "kwok-node") -> list[NodeSpec]:
    """`count` nodes spread round-robin over three zones, so topology-spread behaviour can be tested."""
    return [NodeSpec(f"{prefix}-{i}", pool=pool, labels={"topology.kubernetes.io/region": "local",
                                                         "topology.kubernetes.io/zone": ZONES[i % len(ZONES)]})
            for i in range(count)]


def _cpu_count(cpu_list: str) -> int:
    total = 0
    for part in cpu_list.split(","):
        first, _, last = part.partition("-")
        total += int(last or first) - int(first) + 1
    return total


def from_definition(definition) -> list[NodeSpec]:
    """Nodes of every pool, named `<pool>-<i>`, with the profile's CPUs and memory as capacity."""
    specs = []
    for pool in definition.pools:
        if pool.kubelet == "real":
            continue  # started by realnode, not as KWOK nodes
        extra = dict(pool.labels)
        cpu, memory = "64", "512Gi"
        if pool.profile:
            extra[PROFILE_LABEL] = pool.profile.name
            cpu = str(sum(_cpu_count(n.cpus) for n in pool.profile.numa_nodes))
            memory = str(int(sum(quantity_value(n.memory) for n in pool.profile.numa_nodes)))
        for i in range(pool.count):
            labels = {"topology.kubernetes.io/region": "local", "topology.kubernetes.io/zone": ZONES[i % len(ZONES)],
                      **extra}
            specs.append(NodeSpec(f"{pool.name}-{i}", pool=pool.name, labels=labels, cpu=cpu, memory=memory))
    return specs


# Per request: connect, read. A create takes milliseconds; the bound keeps a worker from hanging on a
# server that stopped answering (the process waits for its worker threads before it exits).
CREATE_TIMEOUT = (10, 60)


def create(core: api.CoreV1Api, specs: list[NodeSpec], reporter: Reporter, workers: int = 16) -> None:
    stopped = threading.Event()

    def one(spec: NodeSpec) -> None:
        for attempt in range(5):
            if stopped.is_set():
                return  # the command is being stopped: begin nothing new
            try:
                core.create_node(spec.manifest(), _request_timeout=CREATE_TIMEOUT)
                return
            except errors.Conflict:
                return  # already there (a retried create)
            except errors.ApiError as err:
                if errors.busy(err) and attempt < 4:
                    time.sleep(0.2 * 2 ** attempt)
                    continue
                raise HarnessError(f"creating node {spec.name} failed: {err.status} {err.reason}: "
                                   f"{(err.body or '')[:300]}") from None

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    try:
        with reporter.counter("creating KWOK nodes", len(specs)) as counter:
            for future in concurrent.futures.as_completed([pool.submit(one, s) for s in specs]):
                future.result()
                counter.advance()
    finally:
        # On an error, Ctrl-C or SIGTERM, drop the nodes not yet begun: leaving the `with` block of
        # an executor would wait for all of them (a minute or more for thousands) before clean-up.
        stopped.set()
        pool.shutdown(wait=False, cancel_futures=True)


LOCAL_HINT = "see logs/kwok.log and logs/kube-controller-manager.log in the cluster directory"


def wait_ready(core: api.CoreV1Api, names: set[str], reporter: Reporter, timeout: float,
               check_alive=None, hint: str = LOCAL_HINT) -> None:
    """Watch nodes until all of `names` are Ready; `check_alive()` raises if a component died; `hint`
    says where the KWOK controller's log is."""
    if not names:
        return
    deadline = time.monotonic() + timeout
    ready: set[str] = set()
    with reporter.counter("waiting for nodes to be Ready", len(names)) as counter:
        while True:
            listing = core.list_node(label_selector=f"{MANAGED_LABEL}=true")
            now_ready = {n.metadata.name for n in listing.items if n.metadata.name in names and is_ready(n)}
            counter.advance(len(now_ready - ready))
            ready = now_ready
            if ready >= names:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(names - ready)
                raise HarnessError(f"{len(missing)} of {len(names)} nodes not Ready after {timeout:.0f}s "
                                   f"(first: {', '.join(missing[:5])})",
                                   hint=hint)
            if check_alive:
                check_alive()
            watch = api.Watch()
            try:
                # Wake on any node change; the list above is the truth, the watch only paces the loop.
                for _ in watch.stream(core.list_node, label_selector=f"{MANAGED_LABEL}=true",
                                      resource_version=listing.metadata.resource_version,
                                      timeout_seconds=max(1, int(min(remaining, 2)))):
                    break
            finally:
                watch.stop()
