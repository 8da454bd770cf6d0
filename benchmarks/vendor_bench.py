"""Benchmarks of vendor-facing runs (results go to BENCHMARKS.md, "Sanity mode and driver shapes").

    .venv/bin/python benchmarks/vendor_bench.py sanity [--runs 3] [--driver-config FILE ...]
    .venv/bin/python benchmarks/vendor_bench.py shapes [--shape bare one-per-node network]

`sanity`: wall time of `dra-harness sanity --driver-config F` (a fresh process each run: throwaway cluster
up, plugin on two simulated nodes, every rule, everything down), and its outcome counts. Default files:
the fake driver's plugin and dra-example-driver v0.4.0 (when built). `shapes`: per driver shape, its cluster
(clusters/shapes/<shape>.yaml, started in this process), then `conformance run --backend existing` with its vendor file
(timed), then `cluster down`; reports passed/failed/skipped and how many passing tests were allocated the
shape's devices. Each run records its conditions (what else used the CPU meanwhile); every cluster is
stopped at the end, also on error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from harness import backends
from harness.backends.base import ClusterSpec
from harness.binaries import Versions, exampledriver
from harness.config import cluster as cluster_config
from harness.core import conditions, paths
from harness.core.progress import Reporter

REPO = Path(__file__).resolve().parents[1]
SHAPES = ("bare", "one-per-node", "network")
SHAPE_DRIVER = "gpu.shape.dra-harness.x-k8s.io"


def _cli(*args: str, env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def bench_sanity(files: list[str], runs: int) -> dict:
    result = {}
    for vendor_file in files:
        times, counts = [], None
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="sanity-bench-") as report:
                started = time.monotonic()
                done = _cli("sanity", "--driver-config", vendor_file, "--report-dir", report)
                times.append(time.monotonic() - started)
                if done.returncode not in (0, 1):
                    raise SystemExit(f"sanity of {vendor_file} exited {done.returncode}:\n{done.stderr[-2000:]}")
                records = json.loads((Path(report) / "results.json").read_text())
                counts = dict(Counter(r["outcome"] for r in records))
        result[vendor_file] = {"runs": [round(t, 1) for t in times], "median": round(statistics.median(times), 1),
                               "outcomes": counts}
    return result


def bench_shape(shape: str) -> dict:
    """The cluster is started in this process (its components are then this run's own in the conditions, as
    a `cluster up` subprocess's re-parented children would not be); the suite runs as a user runs it."""
    with tempfile.TemporaryDirectory(prefix="shape-bench-") as tmp:
        os.environ[paths.STATE_ENV] = str(Path(tmp) / "state")  # only this run's clusters are touched
        env = {**os.environ}
        env.pop("KUBECONFIG", None)
        name = f"bench-{shape}"
        backend = backends.get("local", Reporter(quiet=True))
        try:
            started = time.monotonic()
            definition = cluster_config.validate(str(REPO / "clusters" / "shapes" / f"{shape}.yaml"),
                                                 Versions().kubernetes)
            info = backend.up(ClusterSpec(name=name, definition=definition, real_nodes=0))
            up_seconds = time.monotonic() - started
            kubeconfig = Path(info.kubeconfig)
            started = time.monotonic()
            run = _cli("conformance", "run", "--backend", "existing", "--kubeconfig", str(kubeconfig), "-n", "2",
                       "--driver-config", str(REPO / "clusters" / "vendors" / f"shape-{shape}.yaml"),
                       "--report-dir", str(Path(tmp) / "reports"), env=env)
            suite_seconds = time.monotonic() - started
            records = json.loads((Path(tmp) / "reports" / "results.json").read_text())
        finally:
            backend.down(name)
            os.environ.pop(paths.STATE_ENV, None)
    allocating = [r["id"] for r in records if r["outcome"] == "passed"
                  and SHAPE_DRIVER in (r["properties"].get("dra_allocated_drivers") or [])]
    return {"exit": run.returncode, "upSeconds": round(up_seconds, 1), "suiteSeconds": round(suite_seconds, 1),
            "outcomes": dict(Counter(r["outcome"] for r in records)), "allocatingTests": len(allocating)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sanity = sub.add_parser("sanity")
    sanity.add_argument("--runs", type=int, default=3)
    sanity.add_argument("--driver-config", nargs="+", default=None)
    shapes = sub.add_parser("shapes")
    shapes.add_argument("--shape", nargs="+", choices=SHAPES, default=list(SHAPES))
    args = parser.parse_args()
    if args.what == "sanity" and not 1 <= args.runs <= 20:
        parser.error("--runs: 1 to 20")
    with conditions.Measure() as window:  # what else ran on the machine meanwhile
        if args.what == "sanity":
            files = args.driver_config or [str(REPO / "clusters" / "vendors" / "fake-driver.yaml")] + (
                [str(REPO / "clusters" / "vendors" / "dra-example-driver.yaml")] if exampledriver.locate() else [])
            result = bench_sanity(files, args.runs)
        else:
            result = {shape: bench_shape(shape) for shape in args.shape}
    print(json.dumps({args.what: result, "conditions": window.result}, indent=2))
    print(conditions.describe(window.result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
