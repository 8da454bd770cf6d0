"""Benchmark of the kubelet plugin (node half of the fake driver); results go to BENCHMARKS.md.

    .venv/bin/python benchmarks/kubelet_plugin_bench.py prepare [--claims 1000] [--backend local|kind|existing]
        [--kubeconfig K]

Per-claim latency of NodePrepareResources + NodeUnprepareResources as the kubelet sees it: the Go
wire-compatibility client (tests/wirecompat, the kubelet's own gRPC code) calls the plugin over its
unix socket, one claim per call, prepare then unprepare, for --claims distinct claims, and reports
p50/p90/p99/max of each call and of the pair. The plugin runs as its own process
(`python -m fake_devices.kubeletplugin`) against a cluster started for the run by --backend (local,
the default, or kind; `existing --kubeconfig K`, or --kubeconfig alone, uses yours), serving a `tiny` fake-driver instance on one simulated node. Each claim's allocation
is written through the status subresource (as the scheduler does) instead of scheduling --claims
pods: the plugin's work is the same, a read of the claim from the API server, a CDI spec written
and removed, and two checkpoint writes (all fsynced).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_backend  # benchmarks/ is the script's directory
import psutil

from fake_devices import config as driver_config
from fake_devices.controller import FakeDriver
from harness.backends.base import ClusterSpec
from harness.binaries import wirecompat
from harness.core import conditions
from harness.core.progress import Reporter
from harness.k8s.client import Clients

INSTANCE = "kpbench"
DOMAIN = f"{INSTANCE}.example.com"
DRIVER = f"gpu.{DOMAIN}"
CLUSTER = "bench-kubeletplugin"
ALLOWED = ("local", "kind", "existing")


def _claims(clients: Clients, namespace: str, node: str, count: int, reporter: Reporter) -> list[dict]:
    """`count` claims allocated gpu-0 on `node` (written like the scheduler does, via /status)."""
    refs = []
    with reporter.counter("creating allocated claims", count) as counter:
        for i in range(count):
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"c-{i}"},
                    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                        "deviceClassName": f"{INSTANCE}-gpu"}}]}}}
            created = clients.resource.create_namespaced_resource_claim(namespace, body)
            status = {"status": {"allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{i % 2}"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}
            clients.resource.patch_namespaced_resource_claim_status(f"c-{i}", namespace, status)
            refs.append({"namespace": namespace, "name": f"c-{i}", "uid": created.metadata.uid})
            counter.advance()
    return refs


def bench_prepare(count: int, backend_name: str = "local", kubeconfig: str | None = None) -> dict:
    reporter = Reporter()
    binary = wirecompat.build(reporter)
    with reporter.step(f"cluster: {backend_name} (one node; the fake driver runs in this process)"):
        # deploy=False: kind and existing get no fake driver of their own; this benchmark brings one
        backend, info = bench_backend.start(backend_name, ClusterSpec(name=CLUSTER, nodes=1, kubeconfig=kubeconfig,
                                                                      deploy=False))
    try:
        return _prepare_on(info.kubeconfig, count, binary, reporter)
    finally:
        backend.down(CLUSTER)  # existing: only the record of the attachment


def _prepare_on(kubeconfig_path: Path, count: int, binary, reporter: Reporter) -> dict:
    kubeconfig = str(kubeconfig_path)
    clients = Clients(kubeconfig_path)
    namespace = f"{INSTANCE}-{int(time.time())}"
    work = Path(tempfile.mkdtemp(prefix="kpb-", dir="/tmp"))
    driver = plugin = None
    try:
        node = sorted(n.metadata.name for n in clients.core.list_node().items)[0]
        clients.core.create_namespace({"metadata": {"name": namespace}})
        config = driver_config.build(INSTANCE, DOMAIN, [], nodes={node: "tiny"}, namespace=namespace, workers=2)
        driver = FakeDriver(config, clients.api_client).start()
        driver.wait_idle(60)
        refs = _claims(clients, namespace, node, count, reporter)
        cmd = [sys.executable, "-m", "fake_devices.kubeletplugin", "--driver", DRIVER, "--node", node,
               "--kubeconfig", kubeconfig, "--plugins-dir", str(work / "plugins"),
               "--registry-dir", str(work / "registry"), "--cdi-dir", str(work / "cdi"),
               "--state-dir", str(work / "state"), "--instance", INSTANCE, "--namespace", namespace]
        with reporter.step("starting the plugin"):
            plugin = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(work / "plugin.log", "w"), text=True)
            if plugin.stdout.readline().strip() != "ready":
                raise RuntimeError("plugin did not start:\n" + (work / "plugin.log").read_text()[-2000:])
        plan = {"draSocket": str(work / "plugins" / DRIVER / "dra.sock"), "bench": {"api": "v1", "claims": refs}}
        with reporter.step(f"{count} Prepare+Unprepare round trips through the kubelet's gRPC client"):
            code, summary, stderr = wirecompat.run(binary, plan, bench=count, timeout=3600)
        if code != 0:
            raise RuntimeError(f"wirecompat failed: {summary.get('mismatches')}\n{stderr[-2000:]}")
        rss = psutil.Process(plugin.pid).memory_info().rss
        leftovers = sorted(p.name for p in (work / "cdi").iterdir())
        return {**summary["bench"], "pluginRssMiB": round(rss / 2**20, 1), "cdiFilesLeft": len(leftovers)}
    finally:
        if plugin is not None:
            plugin.terminate()
            plugin.wait(timeout=30)
        if driver is not None:
            driver.stop(delete_slices=True)
        try:
            clients.core.delete_namespace(namespace)
        except Exception:
            pass
        clients.close()
        shutil.rmtree(work, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    prepare = sub.add_parser("prepare", help="Prepare+Unprepare latency per claim")
    prepare.add_argument("--claims", type=int, default=1000)
    bench_backend.add_flags(prepare, ALLOWED, kubeconfig=True)
    return bench_backend.resolve(prepare, parser.parse_args(argv), ALLOWED, "unknown here")


def main() -> int:
    args = parse_args()
    with conditions.Measure() as window:  # what else ran on the machine meanwhile
        result = bench_prepare(args.claims, args.backend, args.kubeconfig)
    result["conditions"] = window.result
    print(json.dumps(result, indent=2))
    print(conditions.describe(window.result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
