"""Benchmarks of the local backend (results go to BENCHMARKS.md; see the method there).

    .venv/bin/python benchmarks/cluster_bench.py start   [--runs 5] [--backend local|kind]
    .venv/bin/python benchmarks/cluster_bench.py nodes   [--nodes 10 1000] [--settle 30]
    .venv/bin/python benchmarks/cluster_bench.py verify
    .venv/bin/python benchmarks/cluster_bench.py idle    [--nodes 500] [--lease-seconds 40 120] [--settle 20] [--window 60]

`start`: wall time of the `dra-harness cluster up --backend B --nodes 3` command (a fresh process each
time, binaries cached), then `cluster down`. `nodes`: for each size, start a cluster with no nodes, time
creating N KWOK nodes until all are Ready, let it idle for --settle seconds, then sum the RSS of every
component process. `verify`: time to check the SHA-256 of the cached binaries (done on every `up`). `idle`:
for each node lease duration, a cluster with N KWOK nodes left idle for --settle seconds, then the CPU
each component uses over --window seconds (what the nodes' lease renewals cost; load runs use 120 s).
Every cluster is stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import bench_backend  # benchmarks/ is the script's directory
import psutil

from harness import binaries
from harness.backends.base import ClusterSpec
from harness.backends.kwok import nodes
from harness.backends.local import process, state
from harness.binaries import manifest
from harness.core import conditions
from harness.core.progress import Reporter
from harness.k8s.client import Clients

# what -> (backends it runs on, why not the others)
BACKENDS = {"start": (("local", "kind"), "`start` times `cluster up`, which only local and kind do"),
            "nodes": (("local",), "`nodes` creates KWOK nodes and reads the memory of the control-plane "
                                  "processes on this machine"),
            "verify": (("local",), "`verify` checks this machine's binary cache; it uses no cluster"),
            "idle": (("local",), "`idle` reads the CPU of the control-plane processes on this machine")}


def bench_start(runs: int, backend: str = "local") -> dict:
    times = []
    for i in range(runs):
        name = f"bench-start-{i}"
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "harness.cli", "-q", "cluster", "up", "--backend", backend, "--name",
                        name, "--nodes", "3"], check=True, stdout=subprocess.DEVNULL)
        times.append(time.monotonic() - started)
        subprocess.run([sys.executable, "-m", "harness.cli", "cluster", "down", "--backend", backend, "--name", name],
                       check=True, stdout=subprocess.DEVNULL)
    return {"runs": [round(t, 2) for t in times], "median": round(statistics.median(times), 2)}


def rss_by_component(name: str) -> dict[str, float]:
    result = {}
    for running in process.recorded(state.cluster_dir(name)).values():
        try:
            result[running.name] = round(psutil.Process(running.pid).memory_info().rss / 2**20, 1)
        except psutil.Error:
            result[running.name] = float("nan")
    return result


def bench_nodes(sizes: list[int], settle: float) -> dict:
    results = {}
    for size in sizes:
        name = f"bench-nodes-{size}"
        backend, info = bench_backend.start("local", ClusterSpec(name=name, nodes=0))
        clients = Clients(info.kubeconfig)
        try:
            specs = nodes.default_nodes(size)
            started = time.monotonic()
            nodes.create(clients.core, specs, Reporter(quiet=True), workers=16)
            created = time.monotonic() - started
            nodes.wait_ready(clients.core, {s.name for s in specs}, Reporter(quiet=True), timeout=900)
            ready = time.monotonic() - started
            time.sleep(settle)  # benchmark method: measure memory after a fixed idle period
            rss = rss_by_component(name)
            results[size] = {"create_seconds": round(created, 1), "all_ready_seconds": round(ready, 1),
                             "rss_mib": rss, "rss_total_mib": round(sum(rss.values()), 1)}
        finally:
            clients.close()
            backend.down(name)
    return results


def cpu_by_component(name: str) -> dict[str, float]:
    result = {}
    for running in process.recorded(state.cluster_dir(name)).values():
        try:
            times = psutil.Process(running.pid).cpu_times()
            result[running.name] = times.user + times.system
        except psutil.Error:
            continue
    return result


def bench_idle(size: int, leases: list[int], settle: float, window: float) -> dict:
    results = {}
    for lease in leases:
        name = f"bench-idle-{lease}"
        backend, _ = bench_backend.start("local", ClusterSpec(name=name, nodes=size, node_lease_seconds=lease))
        try:
            time.sleep(settle)  # benchmark method: past the start-up burst, into the steady renewals
            before, started = cpu_by_component(name), time.monotonic()
            time.sleep(window)  # benchmark method: the measured idle window
            after, took = cpu_by_component(name), time.monotonic() - started
            used = {n: round(after[n] - before[n], 2) for n in after if n in before}
            results[lease] = {"window_seconds": round(took, 1), "cpu_seconds": used,
                              "cpu_seconds_total": round(sum(used.values()), 2),
                              "cpu_seconds_per_minute": round(60 * sum(used.values()) / took, 2)}
        finally:
            backend.down(name)
    return results


def bench_verify() -> dict:
    binset = binaries.locate()
    total = sum(binset.path(n).stat().st_size for n in binaries.ALL_BINARIES)
    started = time.monotonic()
    for name in binaries.ALL_BINARIES:
        manifest.sha256_file(binset.path(name))
    return {"bytes": total, "seconds": round(time.monotonic() - started, 2)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=list(BACKENDS))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 1000])
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--lease-seconds", type=int, nargs="+", default=[40, 120])
    parser.add_argument("--window", type=float, default=60.0)
    bench_backend.add_flags(parser, BACKENDS["start"][0])
    args = parser.parse_args(argv)
    return bench_backend.resolve(parser, args, *BACKENDS[args.what])


def main() -> None:
    args = parse_args()
    with conditions.Measure() as window:  # what else ran on the machine meanwhile
        if args.what == "start":
            result = bench_start(args.runs, args.backend)
        elif args.what == "nodes":
            result = bench_nodes(args.nodes, args.settle)
        elif args.what == "idle":
            result = bench_idle(args.nodes[0], args.lease_seconds, args.settle, args.window)
        else:
            result = bench_verify()
    print(json.dumps({args.what: result, "conditions": window.result}, indent=2))
    print(conditions.describe(window.result), file=sys.stderr)


if __name__ == "__main__":
    main()
