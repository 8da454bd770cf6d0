"""Benchmarks of the fake driver (results in BENCHMARKS.md; method there).

    .venv/bin/python benchmarks/fake_devices_bench.py publish [--nodes 1000] [--profile dgx-h100] [--faults 50]

Also the slice-publishing scenario beside upstream's PublishResourceSlices (N nodes' ResourceSlices
published and visible in the API server, with the time for N nodes to be Ready and the memory of every
cluster component afterwards); `--faults 0` skips the fault part.

Starts a local cluster with no nodes, creates N KWOK nodes labelled with the profile, then starts the
fake driver as its own process (`python -m fake_devices`) and times it until it reports every slice
published; checks the count against the renderer; samples the driver's RSS. Then injects --faults
`unhealthy` faults one after another on random nodes and times each from the API write returning to
the watch event that shows the NoExecute taint in the slice. The cluster is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

import bench_backend  # benchmarks/ is the script's directory
import kubernetes
import psutil
from cluster_bench import rss_by_component

from fake_devices import config as driver_config
from fake_devices import faults, profile, render
from harness.backends.base import ClusterSpec
from harness.backends.kwok import nodes
from harness.backends.local import state
from harness.config.cluster import ClusterDefinition, DriverSettings, NodePool
from harness.core import conditions
from harness.core.progress import Reporter
from harness.k8s.client import Clients


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def bench_publish(node_count: int, profile_name: str, fault_count: int) -> dict:
    name = "bench-publish"
    backend, info = bench_backend.start("local", ClusterSpec(name=name, nodes=0))
    clients = Clients(info.kubeconfig)
    driver_proc = None
    try:
        prof = profile.load(profile_name)
        definition = ClusterDefinition("bench", "(benchmark)", None, {}, {}, (NodePool("dgx", node_count, prof),),
                                       DriverSettings())
        specs = nodes.from_definition(definition)
        started = time.monotonic()
        nodes.create(clients.core, specs, Reporter(quiet=True))
        nodes.wait_ready(clients.core, {s.name for s in specs}, Reporter(quiet=True), timeout=900)
        nodes_ready = time.monotonic() - started

        config = driver_config.DriverConfig(instance="bench", domain="bench.example.com",
                                            profiles={prof.name: prof}, namespace="default")
        config_file = state.cluster_dir(name) / "bench-driver.yaml"
        config_file.write_text(driver_config.to_yaml(config))
        started = time.monotonic()
        driver_proc = subprocess.Popen([sys.executable, "-m", "fake_devices", f"--config={config_file}",
                                        f"--kubeconfig={info.kubeconfig}"], stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True)
        peak_rss = 0
        line = ""
        while line.strip() != "ready":  # the driver prints "ready" once every node is published
            line = driver_proc.stdout.readline()
            if not line and driver_proc.poll() is not None:
                raise RuntimeError("fake driver exited before it was ready")
        publish_seconds = time.monotonic() - started
        peak_rss = psutil.Process(driver_proc.pid).memory_info().rss
        per_node = sum(len(s) for s in render.render_node(prof, "n", render.Drivers("bench.example.com")).values())
        published = len(clients.resource.list_resource_slice(label_selector="dra-harness.x-k8s.io/fake-driver-instance=bench").items)
        devices = sum(len(d) for d, _ in render.devices_by_driver(prof, "n", render.Drivers("x")).values()) * node_count
        components_rss = rss_by_component(name)  # memory of the cluster holding every slice

        latencies = []
        rng = random.Random(1)
        drivers = render.Drivers("bench.example.com")
        for _ in range(fault_count):
            node = rng.choice(specs).name
            device = f"gpu-{rng.randrange(8)}"
            slice_name = render.slice_name(node, drivers.gpu, 0)
            # The list's resource version (now), not the slice's own: with thousands of slices created
            # the watch cache no longer holds the slice's version (measured at 5000 nodes: 410 Expired).
            current = clients.resource.list_resource_slice(
                field_selector=f"metadata.name={slice_name}").metadata.resource_version
            watch = kubernetes.watch.Watch()
            faults.set_fault(clients.core, "default", config.faults_configmap, node, device, "unhealthy")
            t_written = time.monotonic()
            for event in watch.stream(clients.resource.list_resource_slice, field_selector=f"metadata.name={slice_name}",
                                      resource_version=current, timeout_seconds=30):
                devs = {d.name: d for d in event["object"].spec.devices or []}
                if devs.get(device) and devs[device].taints:
                    latencies.append(time.monotonic() - t_written)
                    break
            watch.stop()
            faults.set_fault(clients.core, "default", config.faults_configmap, node, device, None)
        return {"nodes": node_count, "profile": profile_name, "nodes_ready_seconds": round(nodes_ready, 1),
                "publish_seconds": round(publish_seconds, 1), "slices": published, "expected_slices": per_node * node_count,
                "devices": devices, "driver_rss_mib": round(peak_rss / 2**20, 1),
                "components_rss_mib": components_rss, "components_rss_total_mib": round(sum(components_rss.values()), 1),
                "fault_to_taint_ms": {"n": len(latencies), "p50": round(1000 * statistics.median(latencies), 1),
                                      "p99": round(1000 * percentile(latencies, 99), 1),
                                      "max": round(1000 * max(latencies), 1)} if latencies else None}
    finally:
        if driver_proc and driver_proc.poll() is None:
            driver_proc.terminate()
            driver_proc.wait(timeout=30)
        clients.close()
        backend.down(name)


ALLOWED = ("local",)
WHY_LOCAL = "creates KWOK nodes and reads the memory of the control-plane processes on this machine"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["publish"])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--profile", default="dgx-h100")
    parser.add_argument("--faults", type=int, default=50)
    bench_backend.add_flags(parser, ALLOWED)
    return bench_backend.resolve(parser, parser.parse_args(argv), ALLOWED, WHY_LOCAL)


def main() -> None:
    args = parse_args()
    with conditions.Measure() as window:  # what else ran on the machine meanwhile
        result = bench_publish(args.nodes, args.profile, args.faults)
    print(json.dumps({"publish": result, "conditions": window.result}, indent=2))
    print(conditions.describe(window.result), file=sys.stderr)


if __name__ == "__main__":
    main()
