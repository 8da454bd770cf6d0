"""The throughput scenario with SchedulerPreQueueingHints on and off, alternating (results in
BENCHMARKS.md; method in docs/load.md):

    .venv/bin/python benchmarks/throughput_ab.py [--repeats 2] [--nodes 500] [--pending 5000]
        [--devices-per-node 10] [--users 64] [--report-dir reports/throughput-ab]

Each run is `dra-harness load run --scenario throughput ... --events 1` on a fresh cluster, on, off,
on, off, ...; one run at a time. Prints one JSON object per run as it finishes (figures, conditions)
and at the end a Markdown table. A run that did not bind every pod is kept and shown as failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import bench_backend  # benchmarks/ is the script's directory

from harness.core.errors import HarnessError
from harness.core.progress import Reporter
from harness.jobs import load_runner
from load import scenarios


def one_run(params: scenarios.LoadParams, hints: bool, report_dir: Path) -> dict:
    summary = load_runner.run(params, report_dir=report_dir, hints=hints, reporter=Reporter(quiet=True))
    burst, cond = summary["throughput"], summary["conditions"]
    upstream = burst.get("scheduler_perf") or {}
    return {"hints": "on" if hints else "off", "complete": burst["complete"], "bound": burst["bound"],
            "burst": burst["burst"], "end_to_end_pods_per_second": burst["pods_per_second"],
            "end_to_end_seconds": (burst.get("end_to_end") or {}).get("seconds"),
            "scheduler_perf_average": upstream.get("Average"), "scheduler_perf_perc50": upstream.get("Perc50"),
            "scheduler_perf_perc90": upstream.get("Perc90"), "scheduler_perf_perc99": upstream.get("Perc99"),
            "creation_pods_per_second": (burst.get("creation") or {}).get("pods_per_second"),
            "creation_seconds": (burst.get("creation") or {}).get("seconds"),
            "own_cpu_seconds": cond["own_cpu_seconds"], "others_percent": cond["others_percent_of_machine"],
            "load_average": [cond["load_average_start"][0], cond["load_average_end"][0]],
            "contended": cond["contended"],
            "scheduler_cpu_seconds": (summary.get("scheduler_window") or {}).get("cpuSeconds"),
            "hint_evaluations": sum(((summary.get("scheduler_window") or {}).get("hints") or {}).values()),
            "report": str(report_dir / "load-report.json")}


def table(rows: list[dict]) -> str:
    lines = ["| run | hints | bound | end-to-end pods/s | scheduler_perf avg / p50 / p90 pods/s | created pods/s "
             "(creation window) | own CPU per pod | others' CPU % | load avg | contended |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        if r.get("error"):
            lines.append(f"| {i} | {r['hints']} | FAILED: {r['error']} | | | | | | | |")
            continue
        lines.append(f"| {i} | {r['hints']} | {r['bound']}/{r['burst']} | {r['end_to_end_pods_per_second']} | "
                     f"{r['scheduler_perf_average']} / {r['scheduler_perf_perc50']} / {r['scheduler_perf_perc90']} | "
                     f"{r['creation_pods_per_second']} ({r['creation_seconds']} s) | "
                     f"{1000 * r['own_cpu_seconds'] / max(r['bound'], 1):.0f} ms | {r['others_percent']} | "
                     f"{r['load_average'][0]} -> {r['load_average'][1]} | {'yes' if r['contended'] else 'no'} |")
    for mode in ("on", "off"):
        rates = [r["end_to_end_pods_per_second"] for r in rows if r["hints"] == mode and r["complete"]]
        if rates:
            lines.append(f"\nhints {mode}: end-to-end median {statistics.median(rates)} pods/s over {len(rates)} runs")
    return "\n".join(lines)


ALLOWED = ("local",)
WHY_LOCAL = ("compares SchedulerPreQueueingHints on and off, which only a cluster the benchmark starts can "
             "switch (each run is `load run` on a fresh local cluster)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pending", type=int, default=5000)
    parser.add_argument("--devices-per-node", type=int, default=10)
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--time-limit", type=float, default=1800)
    parser.add_argument("--report-dir", type=Path, default=Path("reports/throughput-ab"))
    bench_backend.add_flags(parser, ALLOWED)
    return bench_backend.resolve(parser, parser.parse_args(argv), ALLOWED, WHY_LOCAL)


def main() -> int:
    args = parse_args()
    params = scenarios.validate(scenarios.LoadParams("throughput", args.nodes, args.pending, 1,
                                                     devices_per_node=args.devices_per_node, users=args.users,
                                                     time_limit=args.time_limit))
    rows = []
    for i in range(args.repeats):
        for hints in (True, False):
            cell = args.report_dir / f"run{i + 1}-hints-{'on' if hints else 'off'}"
            try:
                row = one_run(params, hints, cell)
            except HarnessError as err:  # kept as a failed run; the other runs still go
                row = {"hints": "on" if hints else "off", "complete": False, "error": str(err).splitlines()[0][:300],
                       "report": str(cell)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(table(rows))
    return 0 if all(r["complete"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
