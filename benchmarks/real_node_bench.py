"""Benchmark of the real node (kubelet v1.37.2 + containerd on this machine); results go to BENCHMARKS.md.

    .venv/bin/python benchmarks/real_node_bench.py [--starts 3] [--pods 20]

1. `--starts` times: start a local cluster with no KWOK node and one real node, timing the whole
   `up` and the real node's own part (directories, containerd, image import, kubelet until Ready),
   then `down` (the full teardown, kernel settings restored).
2. In one more such cluster, with the fake driver's `tiny` profile on the real node and its kubelet
   plugins running: `--pods` pods one after another, each with a claim from a template. For each:
   create -> Running, create -> the container printed its CDI-injected environment, and
   delete -> gone (the kubelet confirms deletion only after NodeUnprepareResources). Also the
   kubelet's own `dra_operations_duration_seconds` means for PrepareResources and
   UnprepareResources (sum / count over the run).
Prints JSON with p50/p90/max of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_backend  # noqa: E402  (benchmarks/ is the script's directory)

from conformance import objects  # noqa: E402
from fake_devices import config as driver_config  # noqa: E402
from fake_devices.controller import FakeDriver  # noqa: E402
from harness.backends.base import ClusterSpec  # noqa: E402
from harness.backends.local import state  # noqa: E402
from harness.backends.local.realnode import images  # noqa: E402
from harness.backends.local.realnode.plugins import NodePlugins  # noqa: E402
from harness.core import conditions  # noqa: E402
from harness.core.nodelayout import records  # noqa: E402
from harness.core.progress import Reporter  # noqa: E402
from harness.k8s import wait
from harness.k8s.client import Clients  # noqa: E402


def _summary(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50": round(statistics.median(ordered), 3), "p90": round(pick(0.9), 3),
            "max": round(ordered[-1], 3)}


def starts(count: int, reporter: Reporter) -> dict:
    ups, nodes, downs = [], [], []
    for i in range(count):
        name = f"rnbench-{i}"
        started = time.monotonic()
        backend, _ = bench_backend.start("local", ClusterSpec(name=name, nodes=0, real_nodes=1), reporter)
        ups.append(time.monotonic() - started)
        nodes.append(_real_node_seconds(name))
        started = time.monotonic()
        leftovers = backend.down(name)
        downs.append(time.monotonic() - started)
        assert leftovers == [], leftovers
    return {"up": _summary(ups), "realNodePart": _summary(nodes), "down": _summary(downs)}


def _real_node_seconds(name: str) -> float:
    """From the start of the real node's first step to the node being Ready (from the process records
    and the node's Ready condition)."""
    clients = Clients(state.cluster_dir(name) / "kubeconfig")
    try:
        pid_file = state.cluster_dir(name) / "pids" / "containerd-real-node-0.json"
        created = json.loads(pid_file.read_text())["createTime"]
        node = clients.core.read_node("real-node-0")
        ready = next(c.last_transition_time for c in node.status.conditions if c.type == "Ready")
        return ready.timestamp() - created
    finally:
        clients.close()


def _kubelet_means(clients: Clients, node: str) -> dict:
    sums, counts = {}, {}
    for line in clients.get_raw(f"/api/v1/nodes/{node}/proxy/metrics").splitlines():
        for kind, target in (("_sum{", sums), ("_count{", counts)):
            if line.startswith("dra_operations_duration_seconds" + kind) and 'is_error="false"' in line:
                operation = line.split('operation_name="', 1)[1].split('"', 1)[0]
                target[operation] = float(line.rsplit(" ", 1)[1])
    return {op: {"count": int(counts[op]), "meanMs": round(1000 * sums[op] / counts[op], 1)}
            for op in sums if counts.get(op)}


def pods(count: int, reporter: Reporter) -> dict:
    name = "rnbench-pods"
    backend, info = bench_backend.start("local", ClusterSpec(name=name, nodes=0, real_nodes=1), reporter)
    clients = Clients(info.kubeconfig)
    cluster = state.load(name)
    node = records(cluster.data)[0]
    handle = NodePlugins(cluster.directory, node, cluster.kubeconfig)
    fake = None
    try:
        ns = "bench"
        clients.core.create_namespace({"metadata": {"name": ns}})
        config = driver_config.build("rnbench", "rnbench.example.com", [], nodes={node.name: "tiny"}, namespace=ns,
                                     workers=2)
        fake = FakeDriver(config, clients.api_client).start()
        assert fake.wait_idle(60) and not fake.errors, fake.errors
        handle.run_for(fake)
        clients.resource.create_namespaced_resource_claim_template(ns, objects.claim_template("one-gpu", "rnbench-gpu"))
        running, printed, gone = [], [], []
        with reporter.counter("pods with a claim on the real node", count) as counter:
            for i in range(count):
                pod = f"p-{i}"
                started = time.monotonic()
                clients.core.create_namespaced_pod(ns, objects.pod_on_node(pod, node.name, images.SHELL_IMAGE,
                                                                          command=objects.PRINT_DRA_ENV,
                                                                          claim_template="one-gpu"))
                wait.until(f"{pod} running", lambda: clients.core.read_namespaced_pod(pod, ns).status.phase == "Running",
                           120, interval=0.02)
                running.append(time.monotonic() - started)
                wait.until(f"{pod} printed", lambda: objects.ENV_DONE in (clients.core.read_namespaced_pod_log(pod, ns) or ""),
                           60, interval=0.02)
                printed.append(time.monotonic() - started)
                started = time.monotonic()
                clients.core.delete_namespaced_pod(pod, ns)
                wait.until(f"{pod} gone", lambda: pod not in {p.metadata.name for p in
                                                             clients.core.list_namespaced_pod(ns).items},
                           120, interval=0.02)
                gone.append(time.monotonic() - started)
                counter.advance()
        return {"createToRunning": _summary(running), "createToEnvPrinted": _summary(printed),
                "deleteToGone": _summary(gone), "kubelet": _kubelet_means(clients, node.name)}
    finally:
        handle.close()
        if fake:
            fake.stop(delete_slices=True)
        clients.close()
        assert backend.down(name) == []


ALLOWED = ("local",)
WHY_LOCAL = "starts a real kubelet and containerd on this machine and reads their records"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--pods", type=int, default=20)
    bench_backend.add_flags(parser, ALLOWED)
    args = parser.parse_args(argv)
    if not (1 <= args.starts <= 20 and 1 <= args.pods <= 500):
        parser.error("--starts 1..20, --pods 1..500")
    return bench_backend.resolve(parser, args, ALLOWED, WHY_LOCAL)


def main() -> int:
    args = parse_args()
    reporter = Reporter()
    with conditions.Measure() as window:  # what else ran on the machine meanwhile
        result = {"starts": starts(args.starts, reporter), "pods": pods(args.pods, reporter)}
    result["conditions"] = window.result
    print(json.dumps(result, indent=2))
    print(conditions.describe(window.result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
